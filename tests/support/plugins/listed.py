"""A strategy plug-in that the hardening daemon lists in compactionStrategyPlugins."""

from __future__ import annotations

from compactord.engine.strategies import PublishingOrder
from tests.support.plugins import mark_import

mark_import(__name__)


class ListedOrder(PublishingOrder):
    """Publishing order under another reference."""
