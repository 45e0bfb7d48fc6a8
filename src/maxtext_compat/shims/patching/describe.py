"""Descriptions of targets, slots and installed objects for error messages."""

from __future__ import annotations

import types
from typing import Any

import wrapt

from maxtext_compat.shims.patching.state import _ABSENT, _OURS


def _is_proxy(obj: Any) -> bool:
    return issubclass(type(obj), wrapt.BaseObjectProxy)


def _label(obj: Any, name: str) -> str:
    """'module:attr', 'module:Class.attr', or the wrapper whose __wrapped__ is meant (for messages)."""
    if isinstance(obj, types.ModuleType):
        return f"{obj.__name__}:{name}"
    if isinstance(obj, type):
        return f"{obj.__module__}:{obj.__qualname__}.{name}"
    layer = next((la for la in _OURS.values() if la.shim is obj), None)
    if layer is not None:
        return f"the {layer.profile!r} layer of {layer.target}"
    return f"{type(obj).__qualname__} wrapper ({name})"


def _name_of(obj: Any) -> str:
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}"
    return repr(obj)


def _describe(obj: Any) -> str:
    if obj is _ABSENT:
        return "nothing (the attribute was deleted)"
    if _is_proxy(obj):
        layer = _OURS.get(id(obj))
        if layer is not None and layer.wrapper is obj:
            return f"the maxtext-compat wrapper of profile {layer.profile!r}"
        try:
            inner = _describe(obj.__wrapped__)
        except Exception:  # a broken proxy: say so instead of failing the error message
            inner = "?"
        return f"{type(obj).__qualname__}({inner})"
    if isinstance(obj, (staticmethod, classmethod)):
        return f"{type(obj).__name__}({_describe(obj.__func__)})"
    mod = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None)
    if isinstance(mod, str) and isinstance(name, str):
        return f"{mod}.{name}"
    text = repr(obj)
    return text if len(text) <= 80 else text[:77] + "..."
