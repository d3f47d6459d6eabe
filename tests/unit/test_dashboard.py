"""The Grafana dashboard (deploy/grafana) graphs the daemon's own metrics: every series a panel's query names is
one ``compactord.daemon.metrics.Metrics`` exposes, and the Kafka listener has its row."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from compactord.daemon.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "compactord-dashboard.json"
# The series a family of each type exposes (prometheus_client's names).
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "summary": ("", "_count", "_sum", "_created"), "info": ("_info",)}


def _panels() -> list[dict[str, Any]]:
    panels = json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]
    return [*panels, *(inner for p in panels for inner in p.get("panels", []))]


def _daemon_metrics() -> Metrics:
    """The daemon's metrics with every family it may expose (a cluster member's included)."""
    snapshot = {"running": 0, "pending": 0, "last_success": {}, "monitor_last_run": 0.0,
                "cluster": {"members": 1, "owned": 0, "unowned": 0, "rebalances": 0, "rebalance_seconds": 1.0}}
    return Metrics(snapshot=lambda: snapshot)


def _exposed() -> set[str]:
    families = _daemon_metrics().registry.collect()
    return {f.name + suffix for f in families for suffix in SUFFIXES[f.type]}


def test_every_series_a_panel_queries_is_one_the_daemon_exposes() -> None:
    exposed = _exposed()
    named = {name for p in _panels() for t in p.get("targets", [])
             for name in re.findall(r"\bcompactord_[a-z0-9_]+", t["expr"])}
    assert named, "no panel queries a compactord series"
    assert named - exposed == set()


def test_the_kafka_listener_row_graphs_each_of_its_metrics() -> None:
    panels = _panels()
    rows = [p for p in panels if p["type"] == "row"]
    assert "Kafka listener" in [r["title"] for r in rows]
    start = next(r["gridPos"]["y"] for r in rows if r["title"] == "Kafka listener")
    below = [p for p in panels if p["type"] != "row" and p["gridPos"]["y"] > start
             and not any(start < r["gridPos"]["y"] <= p["gridPos"]["y"] for r in rows)]
    queried = " ".join(t["expr"] for p in below for t in p["targets"])
    families = {f.name for f in _daemon_metrics().registry.collect() if f.name.startswith("compactord_listener_")}
    assert families and all(name in queried for name in families), (families, queried)
