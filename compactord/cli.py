"""The ``compactord`` command: ``run`` the daemon, ``demo``, and a client of the HTTP API.

``--url`` (or ``COMPACTORD_URL``) and ``COMPACTORD_TOKEN`` (or ``--token``) may stand before or after
the subcommand. Tables by default, ``--json`` prints the API's body unchanged. Errors are one line on
stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from compactord import __version__
from compactord.client import DEFAULT_URL, DaemonClient
from compactord.errors import CompactordError

__all__ = ["main"]


def _common(parser: argparse.ArgumentParser, top: bool) -> None:
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--url", default=default, help=f"daemon URL (env COMPACTORD_URL, default {DEFAULT_URL})")
    parser.add_argument("--token", default=default, help="bearer token (env COMPACTORD_TOKEN)")
    parser.add_argument("--json", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="print the API's JSON body unchanged")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compactord", description="Topic compaction daemon for Kafka-protocol brokers")
    parser.add_argument("--version", action="version", version=f"compactord {__version__}")
    _common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--config", help="broker.conf (Java properties); default: built-in defaults")
    run.add_argument("--embedded-broker", action="store_true", help="start the bundled broker on loopback and use it")
    demo = sub.add_parser("demo", help="compact a stock-ticker topic on the bundled broker and print the result")
    demo.add_argument("--ledger-root", help="keep the ledgers here (default: a temporary folder)")
    demo.add_argument("--ticks", type=int, default=5000, help="records to produce (default 5000)")

    def client(name: str, help_: str, topic: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_)
        _common(p, top=False)
        if topic:
            p.add_argument("topic")
        return p

    compact = client("compact", "trigger a compaction")
    compact.add_argument("--wait", action="store_true", help="wait for the end, with a progress bar")
    compact.add_argument("--rebuild", action="store_true", help="full rebuild: ignore the current ledger")
    rebuild = client("rebuild", "trigger a full rebuild (ignore the current ledger)")
    rebuild.add_argument("--wait", action="store_true")
    client("status", "status of the topic's last compaction")
    client("cancel", "cancel the running compaction")
    client("horizon", "the compaction horizon per partition")
    read = client("read", "read the compacted view")
    read.add_argument("--partition", type=int, default=0)
    read.add_argument("--start", type=int, default=0)
    read.add_argument("--limit", type=int, default=20)
    read.add_argument("--encoding", choices=["utf8", "base64"], default="utf8",
                      help="utf8 (the CLI's default, for reading text) or base64 (the API's default)")
    history = client("history", "the topic's past runs, newest first (kept across restarts)")
    history.add_argument("--limit", type=int, default=20, help="runs to show (default 20, at most 1000)")
    history.add_argument("--cursor", help="show older runs: the cursor printed after the previous page")
    client("topics", "every known topic with its backlog and last compaction", topic=False)
    client("tasks", "recent tasks", topic=False)
    preview = client("preview", "what the next compaction would keep and remove (an estimate from a sample)")
    preview.add_argument("--exact", action="store_true", help="run the read and choose steps (takes a task slot)")
    return parser


# -- the client commands ------------------------------------------------------------------------


def _daemon(args: argparse.Namespace) -> DaemonClient:
    return DaemonClient(args.url, args.token or None)


def _print_task(t: dict[str, Any]) -> None:
    prog = t.get("progress") or {}
    print(f"topic     {t.get('topic')}\nstatus    {t['status']}\nstate     {t.get('state')}\n"
          f"task      {t.get('task_id')}\nstarted   {t.get('started_at')}\nfinished  {t.get('finished_at')}\n"
          f"progress  {prog.get('records_read', 0)}/{prog.get('records_total', 0)} records")
    if t.get("last_error"):
        print(f"error     {t['last_error']}")


def _wait(args: argparse.Namespace, daemon: DaemonClient, topic: str) -> int:
    width = 30
    while True:
        status = daemon.status(topic)
        prog = status.get("progress") or {}
        done, total = prog.get("records_read", 0), max(prog.get("records_total", 0), 1)
        filled = min(width, int(width * done / total))
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{prog.get('records_total', 0)} "
                         f"records  {status.get('state')}   ")
        sys.stderr.flush()
        if status["status"] != "RUNNING":
            sys.stderr.write("\n")
            if args.json:
                print(json.dumps(status))
            else:
                _print_task(status)
            return 0 if status["status"] == "SUCCESS" else 1
        time.sleep(0.5)


def _client(args: argparse.Namespace) -> int:
    cmd = args.command
    topic: str = getattr(args, "topic", "")
    daemon = _daemon(args)
    if cmd in ("compact", "rebuild"):
        body = daemon.trigger(topic, rebuild=cmd == "rebuild" or args.rebuild)
        if args.wait:
            return _wait(args, daemon, topic)
    elif cmd == "status":
        body = daemon.status(topic)
    elif cmd == "cancel":
        body = daemon.cancel(topic)
    elif cmd == "horizon":
        body = daemon.horizon(topic)
    elif cmd == "read":
        body = daemon.compacted(topic, args.partition, args.start, args.limit, encoding=args.encoding)
    elif cmd == "history":
        body = daemon.history(topic, args.limit, args.cursor)
    elif cmd == "topics":
        body = daemon.topics()
    elif cmd == "preview":
        if args.exact:  # the reply comes when the preview task ends: as long as a compaction's read
            daemon = DaemonClient(args.url, args.token or None, timeout=24 * 3600.0)
        body = daemon.preview(topic, exact=args.exact)
    else:
        body = daemon.tasks()
    if args.json:
        print(json.dumps(body))
        return 0
    _print_table(cmd, body)
    return 0


def _print_table(cmd: str, body: Any) -> None:
    if cmd in ("compact", "rebuild", "status", "cancel"):
        _print_task(body)
    elif cmd == "horizon":
        print(f"topic {body['topic']}  ledger {body['ledger_id']}")
        print(f"{'PARTITION':>9}  {'OFFSET':>12}")
        for p in body["partitions"]:
            print(f"{p['partition']:>9}  {p['offset']:>12}")
    elif cmd == "read":
        print(f"{'PARTITION':>9}  {'OFFSET':>10}  {'KEY':<24}  VALUE")
        for e in body["entries"]:
            print(f"{e['partition']:>9}  {e['offset']:>10}  {e['key']!s:<24}  {e['value']}")
        if body.get("next_start") is not None:
            print(f"(more: --start {body['next_start']})")
    elif cmd == "history":
        print(f"{'FINISHED':<24}  {'STATE':<9}  {'REASON':<15}  {'READ':>9}  {'WRITTEN':>9}  {'TASK':<36}  DETAIL")
        for r in body["runs"]:
            detail = r["error"] or r["reason_detail"] or (f"by {r['caller']}" if r.get("caller") else "")
            print(f"{r['finished_at']:<24}  {r['state']:<9}  {r['reason']:<15}  {r['records_read']:>9}  "
                  f"{r['records_written']:>9}  {r['task_id']:<36}  {detail}")
        if body.get("next") is not None:
            print(f"(older runs: --cursor {body['next']})")
    elif cmd == "preview":
        kind = "exact" if body["exact"] else f"estimate from {body['sample_records']} tail records"
        eta = "-" if body["estimated_seconds"] is None else f"{body['estimated_seconds']} s"
        print(f"topic {body['topic']}  ({kind})\n"
              f"records  kept {body['records_kept']:>12,}  removed {body['records_removed']:>12,}\n"
              f"bytes    kept {body['bytes_kept']:>12,}  removed {body['bytes_removed']:>12,}\n"
              f"dirty ratio {body['dirty_ratio']:.3f}  estimated duration {eta}")
    elif cmd == "topics":
        print(f"{'TOPIC':<32} {'BACKLOG':>10} {'LAST':<8} {'STATE':<26} FINISHED")
        for t in body["topics"]:
            last = t["last_compaction"]
            backlog = t["backlog"]["records"] if t.get("backlog") else "-"
            print(f"{t['topic']:<32} {backlog!s:>10} {last['status']:<8} {last.get('state') or '-':<26} "
                  f"{last.get('finished_at') or '-'}")
    else:
        print(f"{'TOPIC':<32} {'STATUS':<8} {'STATE':<26} {'TASK':<36} STARTED")
        for t in body["tasks"]:
            print(f"{t['topic']:<32} {t['status']:<8} {t['state']:<26} {t['task_id']:<36} {t['started_at']}")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            from compactord.config import load_settings
            from compactord.daemon.server import refuse_start, serve

            try:
                settings = load_settings(args.config)
            except CompactordError as exc:
                return refuse_start(exc)
            return serve(settings, embedded_broker=args.embedded_broker)
        if args.command == "demo":
            import logging

            from compactord.demo import run_demo

            logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
            return run_demo(args.ledger_root, args.ticks)
        if args.command is None:
            parser.print_help()
            return 2
        return _client(args)
    except CompactordError as exc:
        print(f"compactord: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
