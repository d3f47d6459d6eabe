"""Benchmark: compaction when Spark has more task slots than the machine has cores.

Usage (from the repository root, with the project's venv)::

    .venv/bin/python bench/contention.py                 # local[C] against local[2C], C = the cores, 3 rounds
    .venv/bin/python bench/contention.py --rounds 5 --quick

Each round runs ``bench/compaction.py`` once with ``--slots C`` and once with ``--slots 2C`` (in turns, the
first of a round alternating), each on a broker and a topic of its own, and reads the ratios it prints
(``full/floor_fastest``, ``incremental/full``, and ``concurrent/sequential`` with ``--concurrent``, which is
passed on). The floor is the same in both: one reading process per core. The last lines are
``slots_2x/slots_1x=<ratio>``: the median ``full/floor_fastest`` with 2C slots over the one with C (the
target: at most 1.3), and ``incremental/full_2x=<ratio>`` (at most 0.25). Other arguments are passed to
``compaction.py`` unchanged.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

_RATIO = re.compile(r"^(full/floor_fastest|incremental/full|concurrent/sequential)=([0-9.]+)$", re.MULTILINE)


def run_compaction(slots: int, extra: list[str]) -> dict[str, float]:
    """One ``compaction.py`` run's ratios (its output is passed through)."""
    command = [sys.executable, str(Path(__file__).with_name("compaction.py")), "--slots", str(slots), *extra]
    print(f"$ {' '.join(command[1:])}", flush=True)
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        raise SystemExit(f"compaction.py --slots {slots} failed with exit code {done.returncode}")
    return {name: float(value) for name, value in _RATIO.findall(done.stdout)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="runs of each slot count (default 3)")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="C (default: the machine's cores)")
    args, extra = ap.parse_known_args(argv)
    if args.rounds < 1 or args.cores < 1:
        ap.error(f"--rounds and --cores must be positive, got: {args.rounds}, {args.cores}")
    slots = (args.cores, 2 * args.cores)
    figures: dict[int, list[dict[str, float]]] = {n: [] for n in slots}
    for round_ in range(args.rounds):
        for n in slots if round_ % 2 == 0 else slots[::-1]:
            figures[n].append(run_compaction(n, extra))

    def median(n: int, name: str) -> float:
        values = [f[name] for f in figures[n] if name in f]
        return statistics.median(values) if values else float("nan")

    print()
    for name in ("full/floor_fastest", "incremental/full", "concurrent/sequential"):
        for n in slots:
            values = [f[name] for f in figures[n] if name in f]
            if values:
                print(f"{name}, local[{n}]: {', '.join(f'{v:.2f}' for v in values)}; median {median(n, name):.2f}")
    print(f"slots_2x/slots_1x={median(slots[1], 'full/floor_fastest') / median(slots[0], 'full/floor_fastest'):.2f}")
    print(f"incremental/full_2x={median(slots[1], 'incremental/full'):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
