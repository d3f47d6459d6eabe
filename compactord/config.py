"""broker.conf -> one frozen, validated ``Settings``: the names the rest of compactord imports.

- ``config_keys``: every key, as a ``Settings`` field with its default, section and meaning (``KEYS``).
- ``config_load``: reading the file, environment overrides, secrets, the rules between keys, start warnings.
- ``config_values``: the value parsers, each with the text of what it allows.
"""

from __future__ import annotations

from compactord.config_keys import (
    DEFAULT_FACTORY,
    ENV_PREFIX,
    GROUPS,
    KAFKA_SECRET_ARGS,
    KEYS,
    KEYS_BY_NAME,
    PULSAR_DEFAULT_FACTORY,
    PULSAR_EVENT_TIME_FACTORY,
    Key,
    Settings,
)
from compactord.config_load import load_settings, settings_from_properties, start_warnings

__all__ = ["DEFAULT_FACTORY", "ENV_PREFIX", "GROUPS", "KAFKA_SECRET_ARGS", "KEYS", "KEYS_BY_NAME",
           "PULSAR_DEFAULT_FACTORY", "PULSAR_EVENT_TIME_FACTORY", "Key", "Settings", "load_settings",
           "settings_from_properties", "start_warnings"]
