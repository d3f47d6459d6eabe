"""The ``compactord`` command."""

from __future__ import annotations

import argparse
import logging
import sys

from compactord import __version__

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compactord", description="Topic compaction daemon for Kafka-protocol brokers")
    parser.add_argument("--version", action="version", version=f"compactord {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="compact a stock-ticker topic on the bundled broker and print the result")
    demo.add_argument("--ledger-root", help="keep the ledgers here (default: a temporary folder)")
    demo.add_argument("--ticks", type=int, default=5000, help="records to produce (default 5000)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "demo":
        from compactord.demo import run_demo

        return run_demo(args.ledger_root, args.ticks)
    _parser().print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
