"""The error tree: every class carries its code and its HTTP status."""

from __future__ import annotations

import re

import pytest

from compactord import errors
from compactord.errors import CompactordError, ConfigError


def _subclasses(cls: type[CompactordError]) -> list[type[CompactordError]]:
    found: list[type[CompactordError]] = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_subclasses(sub))
    return found


ERROR_CLASSES = sorted(
    {cls for cls in [CompactordError, *_subclasses(CompactordError)] if cls.__module__ == errors.__name__},
    key=lambda cls: cls.__name__,
)


def test_the_tree_was_found() -> None:
    assert len(ERROR_CLASSES) >= 15
    assert errors.TopicNotFound in ERROR_CLASSES
    assert errors.SparkError in ERROR_CLASSES  # a grandchild


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_every_error_class_sets_its_own_http_status(cls: type[CompactordError]) -> None:
    # Its own, not only an inherited one: a new class must decide its status.
    assert "status" in vars(cls), f"{cls.__name__} has no status of its own"
    assert isinstance(cls.status, int) and 400 <= cls.status <= 599


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_every_error_class_has_a_code(cls: type[CompactordError]) -> None:
    assert "code" in vars(cls)
    assert cls.code and cls.code.replace("_", "").isalpha() and cls.code.islower()


def test_codes_are_unique() -> None:
    codes = [cls.code for cls in ERROR_CLASSES]
    assert len(codes) == len(set(codes))


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_the_module_docstring_draws_every_class(cls: type[CompactordError]) -> None:
    doc = errors.__doc__ or ""
    # The name, then (maybe on the next line of the drawing) its code and its status.
    assert re.search(rf"\b{cls.__name__}\b[^\n]*(?:\n[ |]*)?\s{cls.code}\s+{cls.status}\b", doc), cls.__name__


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (errors.TopicNotFound("orders"), 404),
        (errors.CompactionAlreadyRunning("orders"), 409),
        (errors.BrokerUnavailable("no broker"), 503),
        (errors.InvalidTopicName("bad"), 422),
        (errors.TaskNotCancellable("switching"), 409),
        (errors.NotCompacted("orders"), 404),
        (errors.ConfigError("httpPort", "x", "a number"), 422),
        (errors.PluginLoadError("compactionStrategy", "x:Y", "no module"), 422),
        (errors.InsufficientDiskSpace("full"), 507),
        (errors.CompactordError("boom"), 500),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_known_statuses(error: CompactordError, status: int) -> None:
    assert error.status == status


def test_a_subclass_without_its_own_status_takes_its_nearest_ancestor_s() -> None:
    class PartitionNotFound(errors.TopicNotFound):
        pass

    assert PartitionNotFound("orders").status == 404


def test_config_error_names_key_and_value() -> None:
    error = ConfigError("httpPort", "abc", "expected a whole number")
    assert str(error) == "config key httpPort='abc' is invalid: expected a whole number"
    assert (error.key, error.value) == ("httpPort", "abc")
    assert error.details == {"key": "httpPort", "value": "abc"}


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (errors.ConfigError("k", "v", "a"), ValueError),
        (errors.InvalidTopicName("bad"), ValueError),
        (errors.TopicNotFound("t"), LookupError),
        (errors.BrokerUnavailable("down"), ConnectionError),
        (errors.IllegalStateTransition("x"), RuntimeError),
        (errors.SparkError("x"), errors.CompactionFailed),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else v.__name__,
)
def test_errors_subclass_a_builtin(error: CompactordError, builtin: type[Exception]) -> None:
    assert isinstance(error, builtin)


def test_topic_errors_name_the_topic() -> None:
    for cls in (errors.TopicNotFound, errors.NotCompacted, errors.NoTaskRunning,
                errors.CompactionAlreadyRunning):
        error = cls("orders")
        assert "'orders'" in str(error)
        assert error.details["topic"] == "orders"
