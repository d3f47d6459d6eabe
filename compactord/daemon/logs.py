"""Logging set-up: ``logFormat=text`` (one readable line) or ``json`` (one object a line)."""

from __future__ import annotations

import json
import logging

from compactord.model import iso_utc

__all__ = ["configure_logging"]


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "ts": iso_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False)


def configure_logging(fmt: str = "text", level: str = "INFO") -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("py4j", "apscheduler"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    # kafka-python logs every failed connection and retry (~2 lines a second while a broker is down); its
    # errors reach compactord at one boundary (kafka/client.py) and are logged there, once per change.
    logging.getLogger("kafka").setLevel(logging.DEBUG if root.level <= logging.DEBUG else logging.CRITICAL)
