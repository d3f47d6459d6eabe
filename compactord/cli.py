"""The ``compactord`` command: ``run`` the daemon, ``demo``, ``migrate-root`` (a ledger root copied to another),
and a client of the HTTP API.

``--url`` (or ``COMPACTORD_URL``) and ``COMPACTORD_TOKEN`` (or ``--token``) may stand before or after
the subcommand. Tables by default, ``--json`` prints the API's body unchanged. Errors are one line on
stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import binascii
import json
import os
import sys
import time
from typing import Any

from compactord import __version__
from compactord.cli_tables import outcome, print_body, printable
from compactord.client import DEFAULT_URL, DaemonClient
from compactord.errors import CompactordError, DaemonRequestFailed, InvalidArgument

__all__ = ["PAGE_LIMIT", "main"]

# The API's bound on one page of a read (GET .../compacted?limit=): a longer --limit takes several pages.
PAGE_LIMIT = 10000


class UsageError(CompactordError):
    """A command line the CLI refuses before it asks the daemon (exit 2, as argparse's errors)."""

    code = "usage"
    status = 400


class _Format(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help says its default; an option without one says what its absence means."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


_FORMAT = _Format


def _common(parser: argparse.ArgumentParser, top: bool) -> None:
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--url", default=default,
                        help=f"daemon URL; host:port alone means http:// (env COMPACTORD_URL, else {DEFAULT_URL})")
    parser.add_argument("--token", default=default, help="bearer token (env COMPACTORD_TOKEN; none by default)")
    parser.add_argument("--json", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="print the API's JSON body unchanged (default: a readable table)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compactord", description="Topic compaction daemon for Kafka-protocol brokers",
                                     formatter_class=_FORMAT)
    parser.add_argument("--version", action="version", version=f"compactord {__version__}")
    _common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="run the daemon", formatter_class=_FORMAT)
    run.add_argument("--config", help="broker.conf (Java properties); none: the built-in defaults")
    run.add_argument("--embedded-broker", action="store_true",
                     help="start the bundled broker on 127.0.0.1:9092 (a free port if taken) and use it")
    demo = sub.add_parser("demo", help="compact a stock-ticker topic and read the result back", formatter_class=_FORMAT)
    demo.add_argument("--url", help="feed the daemon running at this URL and its broker (none: a broker and "
                                    "a daemon of the demo's own)")
    demo.add_argument("--token", help="the --url daemon's bearer token (env COMPACTORD_TOKEN)")
    demo.add_argument("--ledger-root", help="without --url: keep the ledgers here (none: a temporary folder)")
    demo.add_argument("--ticks", type=int, default=5000, help="records to produce")

    def client(name: str, help_: str, topic: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_, formatter_class=_FORMAT)
        _common(p, top=False)
        if topic:
            p.add_argument("topic", help="the topic's name")
        return p

    compact = client("compact", "trigger a compaction")
    compact.add_argument("--wait", action="store_true", help="wait for the end, with a progress bar (a "
                         "compaction already running: wait for that one)")
    compact.add_argument("--rebuild", action="store_true", help="full rebuild: ignore the current ledger")
    rebuild = client("rebuild", "trigger a full rebuild (ignore the current ledger)")
    rebuild.add_argument("--wait", action="store_true", help="wait for the end, with a progress bar")
    client("status", "status of the topic's last compaction")
    client("cancel", "cancel the running compaction")
    client("horizon", "the compaction horizon per partition")
    read = client("read", "read the compacted view")
    read.add_argument("--partition", type=int,
                      help="the partition to read (default: every partition, one after the other)")
    read.add_argument("--start", type=int, help="the first offset to read; needs --partition (default: 0)")
    read.add_argument("--from", dest="resume", metavar="PARTITION:OFFSET",
                      help="go on through every partition from there, as the (more: ...) line of a read across "
                           "partitions says (default: the first partition's start)")
    read.add_argument("--limit", type=int, default=20,
                      help=f"at most this many entries in all, across partitions; more than the API's "
                           f"{PAGE_LIMIT} per page are read a page at a time")
    read.add_argument("--encoding", choices=["utf8", "base64"], default="utf8",
                      help="utf8 (the CLI's default, for reading text) or base64 (the API's default)")
    history = client("history", "the topic's past runs, newest first (kept across restarts)")
    history.add_argument("--limit", type=int, default=20, help="runs to show (default 20, at most 1000)")
    history.add_argument("--cursor", help="show older runs: the cursor printed after the previous page "
                         "(default: the newest runs)")
    preview = client("preview", "what the next compaction would keep and remove (an estimate from a sample)")
    preview.add_argument("--exact", action="store_true",
                         help="run the read and choose steps (takes a task slot; default: an estimate)")
    topics = client("topics", "every known topic: on the broker or not, backlog, last compaction (all pages)",
                    topic=False)
    topics.add_argument("--state", choices=["running", "failed", "behind"],
                        help="only topics with a task running, whose last compaction failed, or whose backlog is "
                             "past a threshold")
    topics.add_argument("--prefix", help="only topics whose name starts with this")
    tasks = client("tasks", "recent tasks, newest first", topic=False)
    tasks.add_argument("--topic", help="only this topic's (none: every topic's)")
    policies = client("policies", "show or change the topic's overrides of the thresholds and the strategy")
    policies.add_argument("--set", action="append", metavar="KEY=VALUE",
                          help="set one override (repeatable; a number, a name, or null to drop it), e.g. "
                               "thresholdMessages=100000 strategy=event-time (none: show them)")
    policies.add_argument("--delete", action="store_true", help="drop every override of the topic")
    client("unload", "the topic moved away: cancel its task, keep its ledger, skip it in the monitor")
    client("load", "the topic is back: the monitor considers it again")
    delete = client("delete-topic", "the topic was deleted: stop its task, remove its ledgers and policies")
    delete.add_argument("--yes", action="store_true", help="really delete (required)")
    client("info", "the daemon's version, broker, ledger root and Spark master", topic=False)
    client("cluster", "the cluster's members, their URLs and partitions, and the topics this member owns",
           topic=False)
    migrate = sub.add_parser("migrate-root", formatter_class=_FORMAT,
                             help="copy every topic's current ledger, run history and policies to another root",
                             description="Copy every topic's current ledger, run history and policies from SRC "
                                         "to DST (no daemon may hold either); rerun after an interruption.")
    migrate.add_argument("--config", help="broker.conf whose s3* keys reach an s3:// root (none: the built-in "
                                          "defaults, enough for two local roots)")
    migrate.add_argument("source", metavar="SRC", help="the root to copy from: a local path or s3://BUCKET/PREFIX")
    migrate.add_argument("target", metavar="DST", help="the root to copy to: empty, or a rerun's")
    return parser


# -- the client commands ------------------------------------------------------------------------


def _daemon(args: argparse.Namespace, timeout: float = 60.0) -> DaemonClient:
    try:
        return DaemonClient(args.url, args.token or None, timeout=timeout)
    except InvalidArgument as exc:  # the URL: --url, or COMPACTORD_URL
        raise UsageError(f"--url (COMPACTORD_URL): {exc}") from None


def _say(text: str) -> None:
    print(f"compactord: {text}", file=sys.stderr, flush=True)


def _compact(args: argparse.Namespace, daemon: DaemonClient, topic: str) -> int:
    """``compact``/``rebuild``: the trigger's answer, or with ``--wait`` the task's end (exit 1 unless it
    succeeded).

    With ``--wait``, a compaction already running (409) is waited for instead: that one if it does what
    was asked (any compaction; for a rebuild, a full rebuild), else its end, then this one."""
    rebuild = args.command == "rebuild" or args.rebuild
    while True:
        try:
            body = daemon.trigger(topic, rebuild=rebuild)
        except DaemonRequestFailed as exc:
            running = exc.answer.get("task") if isinstance(exc.answer, dict) else None
            if not args.wait or exc.error != "compaction_already_running" or not isinstance(running, dict):
                raise
            what = f"task {printable(str(running.get('task_id')))}, {printable(str(running.get('reason')))}"
            if running.get("kind") == "compaction" and (not rebuild or running.get("reason") == "rebuild"
                                                        or running.get("full_rebuild")):
                _say(f"a compaction of {printable(topic)} is already running ({what}): waiting for it")
                return _wait(args, daemon, topic, running["task_id"])
            asked = "rebuilding" if rebuild else "compacting"
            _say(f"{printable(topic)} has a {'compaction' if running.get('kind') == 'compaction' else 'preview'} "
                 f"running that is not what was asked ({what}): waiting for its end, then {asked}")
            _wait(args, daemon, topic, running["task_id"], show=False)
            continue
        if not args.wait:
            print_body(args.command, body, args.json)
            return 0
        return _wait(args, daemon, topic, body["task_id"])


def _wait(args: argparse.Namespace, daemon: DaemonClient, topic: str, task_id: str, show: bool = True) -> int:
    """Follow task ``task_id`` of ``topic`` to its end with a progress bar; print its status (``show``)."""
    width = 30
    while True:
        task = daemon.status(topic)
        if task.get("task_id") != task_id:  # another task since (the monitor's): ours from the recent ones
            task = next((t for t in daemon.tasks(topic)["tasks"] if t["task_id"] == task_id), task)
        prog = task.get("progress") or {}
        done, total = prog.get("records_read", 0), max(prog.get("records_total", 0), 1)
        filled = min(width, int(width * done / total))
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{prog.get('records_total', 0)} "
                         f"records  {printable(str(task.get('state') or '-'))}   ")
        sys.stderr.flush()
        if task["status"] != "RUNNING":
            sys.stderr.write("\n")
            if show:
                print_body("status", task, args.json)
            else:
                _say(f"task {printable(task_id)} ended: {outcome(task)}")
            return 0 if task["status"] == "SUCCESS" else 1
        time.sleep(0.5)


def _override(text: str) -> tuple[str, Any]:
    """``key=value`` of ``policies --set``: a JSON value (number, null, true) or else a plain string."""
    key, eq, raw = text.partition("=")
    if not eq or not key.strip():
        raise UsageError(f"--set {text!r}: write KEY=VALUE, e.g. --set thresholdMessages=100000")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key.strip(), value


def _position(text: str) -> tuple[int, int]:
    """``--from PARTITION:OFFSET``."""
    partition, colon, offset = text.partition(":")
    if colon and partition.strip().isdigit() and offset.strip().isdigit():
        return int(partition), int(offset)
    raise UsageError(f"read: --from {printable(text)!s}: write PARTITION:OFFSET, e.g. --from 1:4200, as a "
                     "(more: ...) line says")


def _read(args: argparse.Namespace, daemon: DaemonClient) -> dict[str, Any]:
    """``read``: up to ``--limit`` entries, a page at a time, of one partition or of each in turn (from
    ``--from`` on), all from one ledger (the first page's). Read across partitions, the body says where
    more would start (``next_partition`` and ``next_start``).

    A table in utf8 is read as base64 and decoded here, to bytes that the table shows escaped: a key or
    value that is not UTF-8 is shown, not refused (``--json`` prints the API's body, refusal included)."""
    if args.limit < 1:
        raise UsageError(f"read: --limit must be at least 1, got {args.limit}")
    if args.resume is not None and (args.partition is not None or args.start is not None):
        raise UsageError("read: --from PARTITION:OFFSET goes on through every partition: give it without "
                         "--partition and --start")
    if args.partition is None and args.start is not None:
        raise UsageError("read: --start is an offset within one partition: give --partition with it")
    resume = None if args.resume is None else _position(args.resume)
    first = args.start or 0
    if args.partition is None:
        horizon = daemon.horizon(args.topic)
        ledger_id, partitions = horizon["ledger_id"], [p["partition"] for p in horizon["partitions"]]
        if resume is not None:
            partition, first = resume
            if partition not in partitions:
                raise UsageError(f"read: --from {partition}:{first}: the topic's partitions are "
                                 f"{', '.join(map(str, partitions))}")
            partitions = partitions[partitions.index(partition):]
    else:
        ledger_id, partitions = None, [args.partition]
    as_bytes = args.encoding == "utf8" and not args.json
    encoding = "base64" if as_bytes else args.encoding
    entries: list[dict[str, Any]] = []
    body: dict[str, Any] = {"topic": args.topic, "ledger_id": ledger_id, "entries": entries, "next_start": None}
    if args.partition is None:
        body["next_partition"] = None
    for index, partition in enumerate(partitions):
        start: int | None = first if index == 0 else 0
        while start is not None and len(entries) < args.limit:
            page = daemon.compacted(args.topic, partition, start, min(args.limit - len(entries), PAGE_LIMIT),
                                    encoding=encoding, ledger_id=ledger_id)
            ledger_id = body["ledger_id"] = page["ledger_id"]
            entries += page["entries"]
            start = page["next_start"]
        if len(entries) < args.limit:
            continue
        if start is None and args.partition is None:  # the limit met this partition's end: do others go on?
            for later in partitions[index + 1:]:
                first = daemon.compacted(args.topic, later, 0, 1, ledger_id=ledger_id)["entries"]
                if first:
                    partition, start = later, first[0]["offset"]
                    break
        body["next_start"] = start
        if args.partition is None and start is not None:
            body["next_partition"] = partition
        break
    if as_bytes:
        for entry in entries:
            for field in ("key", "value"):
                if entry[field] is not None:
                    entry[field] = binascii.a2b_base64(entry[field])
    return body


def _policies(args: argparse.Namespace, daemon: DaemonClient) -> Any:
    if args.delete and args.set:
        raise UsageError("policies: --delete drops every override; give --set or --delete, not both")
    if args.delete:
        return daemon.delete_policies(args.topic)
    if not args.set:
        return daemon.policies(args.topic)
    changes = dict(_override(text) for text in args.set)
    overrides = {k: v for k, v in daemon.policies(args.topic)["policies"].items() if v is not None}
    overrides.update(changes)
    return daemon.set_policies(args.topic, overrides)


def _client(args: argparse.Namespace) -> int:
    cmd = args.command
    topic: str = getattr(args, "topic", "")
    # an exact preview's reply comes when its task ends: as long as a compaction's read
    daemon = _daemon(args, 24 * 3600.0 if cmd == "preview" and args.exact else 60.0)
    if cmd in ("compact", "rebuild"):
        return _compact(args, daemon, topic)
    if cmd == "read":
        body = _read(args, daemon)
    elif cmd == "history":
        body = daemon.history(topic, args.limit, args.cursor)
    elif cmd == "preview":
        body = daemon.preview(topic, exact=args.exact)
    elif cmd == "tasks":
        body = daemon.tasks(args.topic)
    elif cmd == "policies":
        body = _policies(args, daemon)
    elif cmd == "delete-topic":
        if not args.yes:
            raise UsageError(f"delete-topic removes every ledger and the policies of {printable(topic)}: add --yes "
                             "to do it")
        body = daemon.delete_topic(topic)
    elif cmd == "topics":
        body = daemon.topics(args.state, args.prefix)
    elif cmd == "info":
        body = daemon.info()
    elif cmd == "cluster":
        body = daemon.cluster()
    else:  # status, cancel, horizon, unload, load: one call with the topic
        body = getattr(daemon, cmd)(topic)
    print_body(cmd, body, args.json)
    return 0


def _migrate(args: argparse.Namespace) -> int:
    """``migrate-root``: a line per topic and a total; exit 2 for what is refused before anything is copied."""
    from compactord.config import load_settings
    from compactord.daemon.policies import POLICIES
    from compactord.errors import ConfigError, LedgerRootLocked
    from compactord.ledger.migrate import TopicMoved, TopicState, migrate_root, open_root

    def line(moved: TopicMoved) -> None:
        if moved.note:
            print(f"{printable(moved.topic)}: {printable(moved.note)}", flush=True)
        else:
            print(f"{printable(moved.topic)}: ledger {moved.ledger_id}, {_count(moved.parts, 'part')}, {moved.bytes} bytes, "
                  f"{moved.seconds:.2f} s", flush=True)

    started = time.monotonic()
    try:
        settings = load_settings(args.config)
        source, target = open_root(args.source, settings, "SRC"), open_root(args.target, settings, "DST")
        state = TopicState((POLICIES,))
        moved = migrate_root(source, target, state, float(settings.storage_lease_seconds), line)
    except (ConfigError, InvalidArgument, LedgerRootLocked) as exc:
        raise UsageError(str(exc)) from exc
    copied = [m for m in moved if not m.note]
    print(f"total: {len(copied)} of {len(moved)} topics copied, {_count(sum(m.parts for m in copied), 'part')}, "
          f"{sum(m.bytes for m in copied)} bytes, {time.monotonic() - started:.2f} s")
    return 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            from compactord.config import load_settings
            from compactord.server import refuse_start, serve

            try:
                settings = load_settings(args.config)
            except CompactordError as exc:
                return refuse_start(exc)
            return serve(settings, embedded_broker=args.embedded_broker)
        if args.command == "demo":
            import logging

            from compactord.demo import run_demo

            logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
            logging.getLogger("kafka").setLevel(logging.ERROR)  # its event-loop timing warnings are not the story
            return run_demo(args.ledger_root, args.ticks, url=args.url, token=args.token)
        if args.command == "migrate-root":
            return _migrate(args)
        if args.command is None:
            parser.print_help()
            return 2
        code = _client(args)
        sys.stdout.flush()  # here, so that a reader that went away is seen below, not at exit
        return code
    except UsageError as exc:
        print(f"compactord: {printable(str(exc))}", file=sys.stderr)
        return 2
    except CompactordError as exc:  # the server's message, the URL: shown, never obeyed by the terminal
        print(f"compactord: {printable(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader closed the output early (``compactord read T | head``): stop quietly. stdout goes to
        # /dev/null so that the interpreter's flush at exit does not complain again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a process killed by it


if __name__ == "__main__":
    sys.exit(main())
