"""What the OpenAPI document cannot take from the routes' signatures and models (``models.py``): the
error answers of each route, derived from the error tree (``compactord/errors.py``: each class's status,
code and ``carries_task``), and Kafka's topic-name rule on every ``{topic}`` parameter (described, not
enforced by FastAPI: ``validate_topic_name`` answers a bad name with its own code).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path

from compactord.api.models import Conflict, Error
from compactord.errors import CompactordError
from compactord.model import MAX_TOPIC_LENGTH, TOPIC_PATTERN

__all__ = ["CONFLICT", "LEDGER", "V1", "TopicName", "error_classes", "errors"]

#: The ``{topic}`` path parameter.
TopicName = Annotated[str, Path(json_schema_extra={"pattern": TOPIC_PATTERN, "maxLength": MAX_TOPIC_LENGTH})]

#: What any ``/v1`` route may answer: no or a wrong token, a name or a topic not found, a bad request, the
#: broker or the store down (or the server busy).
V1 = (401, 403, 404, 422, 503)
#: A route a task may be in the way of.
CONFLICT = (*V1, 409)
#: A read of a ledger: also gone (a pinned ledger retired, the topic recreated).
LEDGER = (*V1, 410)


def error_classes(root: type[CompactordError] = CompactordError) -> list[type[CompactordError]]:
    """``root`` and every class under it."""
    return [root, *(cls for sub in root.__subclasses__() for cls in error_classes(sub))]


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a route that may answer ``statuses``: each described by the codes of its
    classes, its body ``Conflict`` when one of them carries the task in the way, else ``Error``."""
    found: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        classes = [cls for cls in error_classes() if cls.status == status]
        codes = ", ".join(dict.fromkeys(cls.code for cls in classes))
        carries = any(cls.carries_task for cls in classes)
        found[status] = {"model": Conflict if carries else Error,
                         "description": codes + (" (the task in the way is in `task`)" if carries else "")}
    return found
