"""Resolving a target string to the raw object in a module or class dict (along the MRO).

Why raw dict entries: the saved original must be the descriptor itself (function,
staticmethod, classmethod) so restoring it is exact, as `wrapt.resolve_path` does.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import sys
import types
from collections.abc import Iterable
from typing import Any

from maxtext_compat.errors import PatchTargetError
from maxtext_compat.patching.spec import Original, PatchSpec, TargetKind, parse_target
from maxtext_compat.patching.state import describe_object, name_of


def import_modules(specs: Iterable[PatchSpec]) -> None:
    """Import every target module. Call it before taking `LOCK`: an import may run code
    that installs shims itself, and holding our lock across an import could deadlock."""
    for name in dict.fromkeys(spec.module for spec in specs):
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise PatchTargetError(
                f"cannot import module {name!r} to patch it",
                argument=name,
                expected="an importable module",
                found=f"{type(exc).__name__}: {exc}",
                fix="install the package that provides it, or use the profile for the installed release "
                "(`maxtext-compat doctor` shows which)",
            ) from exc


def _dict_of(obj: Any, target: str) -> Any:
    try:
        return vars(obj)
    except Exception as exc:
        raise PatchTargetError(
            f"cannot read the attributes of {obj!r} while resolving {target}",
            argument=target,
            expected="a module or class with a __dict__",
            found=f"{type(exc).__name__}: {exc}",
            fix="point the target at the module or class that defines the attribute",
        ) from exc


def _lookup(obj: Any, name: str, target: str) -> tuple[Any, Any]:
    """(raw value, the module/class whose dict holds it), walking the MRO for classes."""
    try:
        holders = obj.__mro__ if isinstance(obj, type) else (obj,)
        for holder in holders:
            d = holder.__dict__
            if name in d:
                return d[name], holder
    except Exception as exc:
        raise PatchTargetError(
            f"reading {name!r} from {name_of(obj)} raised while resolving {target}",
            argument=target,
            expected=f"attribute {name!r} readable from the class/module __dict__",
            found=f"{type(exc).__name__}: {exc}",
            fix="the installed release is not the one this profile was written for; pick the matching profile",
        ) from exc
    known = sorted({k for h in holders for k in _dict_of(h, target) if isinstance(k, str)})
    close = difflib.get_close_matches(name, known, n=3)
    dynamic = any("__getattr__" in _dict_of(h, target) for h in holders if h is not object)
    found = f"no {name!r} in the dict of {name_of(obj)}" + (" or its bases" if isinstance(obj, type) else "")
    if close:
        found += f"; similar names: {close}"
    if dynamic:
        found += "; it may be served by __getattr__, which has no slot to patch"
    raise PatchTargetError(
        f"cannot find the patch target {target}",
        argument=target,
        expected=f"attribute {name!r} defined on {name_of(obj)}",
        found=found,
        fix="the installed release moved or renamed it: update the profile's target, "
        "or use the profile for the installed release (`maxtext-compat doctor`)",
    )


def resolve_target(spec: PatchSpec, profile: str) -> Original:
    module_name, path = parse_target(spec.target)
    module = sys.modules.get(module_name)
    if module is None:
        raise PatchTargetError(
            f"module {module_name!r} of {spec.target} is not imported",
            argument=spec.target,
            expected=f"{module_name!r} in sys.modules",
            found="absent (it was never imported, or was removed during install)",
            fix="install through maxtext_compat.shims.install(), which imports targets first, "
            "or call patching.import_modules(specs) before patching.apply()",
        )
    owner: Any = module
    for part in path[:-1]:
        owner, _ = _lookup(owner, part, spec.target)
        if not isinstance(owner, (type, types.ModuleType)):
            raise PatchTargetError(
                f"{spec.target}: {part!r} is not a class or module",
                argument=spec.target,
                expected="a dotted path through modules and classes",
                found=type(owner).__name__,
                fix="patch the class that defines the method instead of an instance",
            )
    attribute = path[-1]
    raw, defined_in = _lookup(owner, attribute, spec.target)
    kind, function = _kind(raw, owner)
    if kind is None:
        raise PatchTargetError(
            f"{spec.target} is not a function or method",
            argument=spec.target,
            expected="a function, method, staticmethod, classmethod or callable",
            found=f"{type(raw).__name__} {describe_object(raw)}",
            fix="only callables can be wrapped; patch the callable that uses this value",
        )
    return Original(spec.target, profile, owner, attribute, raw, function, kind, defined_in)


def _kind(raw: Any, owner: Any) -> tuple[TargetKind | None, Any]:
    if isinstance(raw, staticmethod):
        return "staticmethod", raw.__func__
    if isinstance(raw, classmethod):
        return "classmethod", raw.__func__
    if not callable(raw):
        return None, raw
    if isinstance(owner, types.ModuleType):
        return "function", raw
    return ("method" if inspect.isfunction(raw) else "callable"), raw
