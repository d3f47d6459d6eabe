"""``python -m compactord.kafka.probe_worker``: one process of ``probe_process.ProbeProcesses``. It reads requests
on stdin (a frame: ``module:function`` and its arguments, pickled, from the daemon that started it), answers
each on stdout (``("ok", result)`` or ``("error", exception)``), and ends at the end of its stdin: when the
daemon drops it or ends. What else it prints (librdkafka's log lines, a stray print) goes to stderr, the daemon's.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
from typing import IO, Any

from compactord.kafka.probe_process import FRAME


def _read(stream: IO[bytes], size: int) -> bytes | None:
    data = stream.read(size)
    return data if len(data) == size else None


def _answer(ref: str, args: tuple[Any, ...]) -> tuple[str, Any]:
    try:
        module, name = ref.split(":", 1)
        fn: Any = importlib.import_module(module)
        for part in name.split("."):
            fn = getattr(fn, part)
        return "ok", fn(*args)
    except Exception as exc:  # noqa: BLE001 - the caller raises it
        return "error", exc


def main() -> None:
    import confluent_kafka  # noqa: F401 - loaded before the first request, not during it

    import compactord.kafka.librdkafka  # noqa: F401

    # The answers go on a descriptor of their own; whatever else writes to stdout (Python's print, a native
    # library's printf) goes to stderr, never into an answer.
    requests, answers = sys.stdin.buffer, os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    while (header := _read(requests, FRAME.size)) is not None:
        body = _read(requests, FRAME.unpack(header)[0])
        if body is None:
            return
        ref, args = pickle.loads(body)  # the daemon that started this process wrote it
        answer = _answer(ref, args)
        try:
            data = pickle.dumps(answer)
        except Exception:  # noqa: BLE001 - an exception that does not pickle: its text does
            data = pickle.dumps(("error", RuntimeError(repr(answer[1]))))
        answers.write(FRAME.pack(len(data)) + data)
        answers.flush()


if __name__ == "__main__":
    main()
