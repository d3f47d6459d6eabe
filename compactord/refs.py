"""Resolve plug-in references written in the configuration (``module:Class`` or ``module.Class``).

References to classes that have moved (``compactord.service:SparkCompactionServiceFactory``, the
strategies under ``compactord.strategies``) still resolve, through ``MOVED``, with a one-line
deprecation warning naming the new reference.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from compactord.errors import PluginLoadError

__all__ = ["MOVED", "current_ref", "resolve_ref"]

log = logging.getLogger(__name__)

#: Old ``module:Class`` -> where the class lives now.
MOVED: dict[str, str] = {
    "compactord.service:SparkCompactionServiceFactory": "compactord.engine.factory:SparkCompactionServiceFactory",
    "compactord.strategies:PublishingOrder": "compactord.engine.strategies:PublishingOrder",
    "compactord.strategies:EventTimeOrder": "compactord.engine.strategies:EventTimeOrder",
    "compactord.strategies:FirstValue": "compactord.engine.strategies:FirstValue",
}


def _split(ref: str) -> tuple[str, str]:
    if ":" in ref:
        module_name, _, qualname = ref.partition(":")
    else:
        module_name, _, qualname = ref.rpartition(".")
    return module_name, qualname


def current_ref(key: str, ref: str) -> str:
    """``ref``, or where the class it names has moved (logging a deprecation warning once per call)."""
    module_name, qualname = _split(ref)
    moved = MOVED.get(f"{module_name}:{qualname}")
    if moved is None:
        return ref
    log.warning("%s=%s is deprecated: the class moved, write %s", key, ref, moved)
    return moved


def resolve_ref(key: str, ref: str) -> Any:
    """Import and return the object ``ref`` names; a bad reference names the config ``key`` and value.

    :raises PluginLoadError: the module cannot be imported (whatever it raises, ``SystemExit`` too: a
        plug-in never ends the process with its own exit code) or has no such attribute.
    """
    module_name, qualname = _split(current_ref(key, ref))
    if not module_name or not qualname:
        raise PluginLoadError(key, ref, "expected 'module:Class' or 'module.Class'")
    try:
        obj: Any = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a plug-in module may fail on import in any way, sys.exit() included
        raise PluginLoadError(key, ref, f"module {module_name!r} cannot be imported "
                                        f"({type(exc).__name__}: {exc})") from exc
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise PluginLoadError(key, ref, f"module {module_name!r} has no attribute {qualname!r}") from exc
    return obj
