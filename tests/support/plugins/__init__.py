"""Strategy plug-ins with import-time effects, for the tests of what the daemon imports and when.

Each module writes a file named after itself into ``$IMPORT_MARKS_DIR`` (if set) when imported, so that
a test can tell whether a daemon process imported it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["IMPORT_MARKS_ENV", "mark_import"]

IMPORT_MARKS_ENV = "IMPORT_MARKS_DIR"


def mark_import(module_name: str) -> None:
    folder = os.environ.get(IMPORT_MARKS_ENV)
    if folder:
        (Path(folder) / module_name).write_text(str(os.getpid()))
