"""compactord: broker-side topic compaction for Kafka-protocol brokers, on Apache Spark.

The public surface: what an application reads with (``CompactedReader``, ``Entry``), what a plug-in
author implements (the service, factory and strategy bases, ``TaskProbe``), and the errors. The rest
of the tree is the daemon's own (see docs/design.md, "How the code is laid out").
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("compactord")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"
# Defined before the imports below: modules they import may read it.

from compactord.compacted_reader import CompactedReader
from compactord.errors import CompactordError
from compactord.interfaces import (
    BrokerMetadata,
    CompactionServiceFactory,
    CompactionStrategy,
    OrderedCompactionStrategy,
    ServiceContext,
    TopicCompactionService,
)
from compactord.model import CompactedPage, Entry, Position
from compactord.task import CompactionTaskCtx, TaskProbe, TaskState

__all__ = [
    "BrokerMetadata",
    "CompactedPage",
    "CompactedReader",
    "CompactionServiceFactory",
    "CompactionStrategy",
    "CompactionTaskCtx",
    "CompactordError",
    "Entry",
    "OrderedCompactionStrategy",
    "Position",
    "ServiceContext",
    "TaskProbe",
    "TaskState",
    "TopicCompactionService",
    "__version__",
]
