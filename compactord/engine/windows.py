"""The settled windows of a final read under publishing-order: in memory while they are small, on the
executor's local disk past a budget.

A reading task that owns a whole partition (``job.reads_are_final``) turns its records into Arrow rows
window by window, each window's last record of each key (``range_task.FINAL_WINDOW_KEYS`` keys at most).
A key may come back in a later window; at the end, each key's last row across all windows is the
partition's answer. Held in memory, 1,000,000 distinct keys took ~150 MB of rows; past ``budget_bytes`` the
windows go to Arrow IPC files in a folder of their own under Spark's local directories (``SPARK_LOCAL_DIRS``,
which Spark sets for its Python workers; the system's temporary folder without it), so that a task holds
one window and the set of keys it has seen, whatever the size of its partition.

``last_rows`` gives the windows back in offset order, each reduced to the rows whose key no later window
holds: the windows as they are when no key came back; concatenated and reduced in Arrow when they are all
in memory; else each from disk, newest first, against the keys of the windows after it, written again,
then read in order.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import pyarrow as pa

from compactord.engine.merge import last_of_each_key
from compactord.model import RECORD_SCHEMA

__all__ = ["MEMORY_BUDGET_BYTES", "SettledWindows", "spill_parent"]

# The windows' bytes a task holds in memory before it writes them to disk: a partition of 500,000 distinct
# keys (~75 MB of rows at ~100-byte values) stays in memory, as all did before there was a disk to go to.
MEMORY_BUDGET_BYTES = 96 * 1024 * 1024
_PREFIX = "compactord-windows-"


def spill_parent() -> str:
    """Where a task's spill folder goes: Spark's first local directory, or the system's temporary folder."""
    local = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d]
    return local[0] if local else tempfile.gettempdir()


class SettledWindows:
    """A final read's windows, in the order they were read (``add``), with whether a key was in more than
    one of them. ``close`` removes what went to disk (also after a failure)."""

    def __init__(self, budget_bytes: int, check: Callable[[], None] = lambda: None) -> None:
        self.budget_bytes = budget_bytes
        self._check = check  # raises when the task was cancelled: looked at between windows read back
        self._held: list[pa.Table] = []  # the windows in memory, after the spilled ones
        self._held_bytes = 0
        self._spilled: list[Path] = []  # the windows on disk, in order
        self._folder: Path | None = None
        self._files = 0  # files written into the folder (their names)
        self.bytes_written = 0  # the bytes of those files
        self._seen: set[bytes] = set()  # the keys noted (``note``)
        self._noted = 0  # the keys noted up to the last window
        self.repeated = False  # whether a key was in more than one window

    @property
    def files_written(self) -> int:
        """The window files written to disk so far (a window the reduction rewrote counts again)."""
        return self._files

    def note(self, keys: Collection[bytes]) -> bool:
        """Keys as they are read (no null key): True when each is new (none noted before, none twice here)."""
        seen = len(self._seen)
        self._seen.update(keys)
        return len(self._seen) - seen == len(keys)

    def add(self, window: pa.Table, keys: int) -> None:
        """The next window (each key's last row in it, in offset order), of ``keys`` keys, all of them noted
        (``note``) since the window before."""
        self.repeated = self.repeated or len(self._seen) - self._noted < keys
        self._noted = len(self._seen)
        if not window.num_rows:
            return
        self._held.append(window)
        self._held_bytes += window.nbytes
        if self._held_bytes > self.budget_bytes:
            for table in self._held:
                self._spilled.append(self._write(table))
            self._held, self._held_bytes = [], 0

    def last_rows(self) -> Iterator[pa.Table]:
        """The windows in offset order, each reduced to the rows whose key no later window holds (tables
        without rows left out). Taken once: the windows are let go of as they are given."""
        self._seen, self._noted = set(), 0
        held, self._held = self._held, []
        if self.repeated and len(held) > 1 and not self._spilled:
            yield last_of_each_key(pa.concat_tables(held))
            return
        if self.repeated and self._spilled:
            self._spilled += map(self._write, held)  # the reduction reads every window from disk
            held = []
            self._keep_last_of_each_key()
        for path in self._spilled:
            self._check()
            table = self._read(path)
            path.unlink()
            if table.num_rows:
                yield table
        held.reverse()
        while held:  # let go of each window once it is taken
            yield held.pop()

    def _keep_last_of_each_key(self) -> None:
        """Rewrite each spilled window, newest first, without the rows of keys a later window holds."""
        later: set[bytes] = set()
        for i in reversed(range(len(self._spilled))):
            self._check()
            table = self._read(self._spilled[i])
            keys = table["key"].to_pylist()
            keep = [k not in later for k in keys]
            later.update(keys)
            if not all(keep):
                self._spilled[i].unlink()
                self._spilled[i] = self._write(table.filter(pa.array(keep, pa.bool_())))

    def close(self) -> None:
        """Remove the spill folder and forget the windows."""
        self._held, self._spilled, self._seen = [], [], set()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def _write(self, table: pa.Table) -> Path:
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix=_PREFIX, dir=spill_parent()))
        path = self._folder / f"{self._files:06d}.arrow"
        self._files += 1
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, RECORD_SCHEMA) as writer:
            writer.write_table(table)
        self.bytes_written += path.stat().st_size
        return path

    def _read(self, path: Path) -> pa.Table:
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_file(source).read_all()
