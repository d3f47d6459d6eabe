"""A self-signed certificate made by the ``openssl`` command for a test's TLS server: its own CA, valid for
127.0.0.1 and localhost."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["self_signed"]


def self_signed(folder: Path, *, encrypted: bool = False) -> tuple[Path, Path]:
    """(certificate, private key), PEM files in ``folder``; ``encrypted``: the key under the password "keypw"."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    secrecy = ["-passout", "pass:keypw"] if encrypted else ["-noenc"]
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=compactord-test",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", *secrecy],
                   check=True, capture_output=True)
    return cert, key
