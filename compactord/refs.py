"""Resolve plug-in references written in the configuration (``module:Class`` or ``module.Class``)."""

from __future__ import annotations

import importlib
from typing import Any

from compactord.errors import PluginLoadError

__all__ = ["resolve_ref"]


def resolve_ref(key: str, ref: str) -> Any:
    """Import and return the object ``ref`` names; a bad reference names the config ``key`` and value.

    :raises PluginLoadError: the module cannot be imported or has no such attribute.
    """
    if ":" in ref:
        module_name, _, qualname = ref.partition(":")
    else:
        module_name, _, qualname = ref.rpartition(".")
    if not module_name or not qualname:
        raise PluginLoadError(key, ref, "expected 'module:Class' or 'module.Class'")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # a plug-in module may fail on import in any way
        raise PluginLoadError(key, ref, f"module {module_name!r} cannot be imported ({exc})") from exc
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise PluginLoadError(key, ref, f"module {module_name!r} has no attribute {qualname!r}") from exc
    return obj
