"""A strategy plug-in that no daemon lists: a request naming it must not import it."""

from __future__ import annotations

from compactord.engine.strategies import PublishingOrder
from tests.support.plugins import mark_import

mark_import(__name__)


class UnlistedOrder(PublishingOrder):
    """Publishing order under another reference."""
