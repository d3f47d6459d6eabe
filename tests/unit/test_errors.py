"""The error tree and its one HTTP status table."""

from __future__ import annotations

import pytest

from compactord import errors
from compactord.errors import HTTP_STATUS, CompactordError, ConfigError, http_status


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


def _bare(cls: type[CompactordError]) -> CompactordError:
    """An instance without calling ``__init__`` (constructors take different arguments)."""
    return cls.__new__(cls)


def test_the_tree_was_found() -> None:
    assert len(ERROR_CLASSES) >= 15
    assert errors.TopicNotFound in ERROR_CLASSES
    assert errors.SparkError in ERROR_CLASSES  # a grandchild


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_every_error_class_has_its_own_http_status(cls: type[CompactordError]) -> None:
    assert cls in HTTP_STATUS
    assert http_status(_bare(cls)) == HTTP_STATUS[cls]


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_every_error_class_has_a_code(cls: type[CompactordError]) -> None:
    assert cls.code and cls.code.replace("_", "").isalpha() and cls.code.islower()


def test_codes_are_unique() -> None:
    codes = [cls.code for cls in ERROR_CLASSES]
    assert len(codes) == len(set(codes))


def test_the_table_holds_only_compactord_errors() -> None:
    assert all(issubclass(cls, CompactordError) for cls in HTTP_STATUS)


@pytest.mark.parametrize("status", sorted(set(HTTP_STATUS.values())))
def test_statuses_are_client_or_server_errors(status: int) -> None:
    assert 400 <= status <= 599


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
        (errors.CompactordError("boom"), 500),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_known_statuses(error: CompactordError, status: int) -> None:
    assert http_status(error) == status


def test_a_subclass_outside_the_table_takes_its_nearest_ancestor_s_status() -> None:
    class PartitionNotFound(errors.TopicNotFound):
        pass

    assert http_status(PartitionNotFound("orders")) == 404


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
