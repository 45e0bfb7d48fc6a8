"""The process-wide state of the patching core: the lock, the installed layers, and how they are described.

Why one module: every other part (resolution, conflict checks, writes, the transaction) reads
these; an installed layer describes itself through the same table, so they cannot be apart without a cycle.
"""

from __future__ import annotations

import os
import types
from dataclasses import dataclass
from typing import Any

import wrapt

from maxtext_compat.locks import fork_safe_lock
from maxtext_compat.patching import ledger
from maxtext_compat.patching.registry import REGISTRY

# One lock for every check-and-swap in the process (profiles.py takes it too, re-entrantly). Like every
# lock of the package it comes from maxtext_compat.locks, whose fork hook takes it around a fork: a
# child never inherits it held by another thread, nor a check-and-swap half done.
LOCK = fork_safe_lock()
MARKER = "__maxtext_compat_patches__"  # on a patched owner: attribute -> the profiles layered on it
# On our wrapper classes, a property naming the wrapper's profile: any copy of the library (a second install, a
# reload) recognises a wrapper of maxtext-compat by name, where its registry knows only its own.
WRAPPER_MARKER = "__maxtext_compat_wrapper__"


class _Missing:
    def __repr__(self) -> str:
        return "<absent>"


ABSENT: Any = _Missing()  # "no entry in this __dict__": restoring it means deleting the slot

PID = [os.getpid()]  # refreshed after fork; os.getpid() per record is a syscall


def _refresh_pid() -> None:
    PID[0] = os.getpid()


os.register_at_fork(after_in_child=_refresh_pid)


# --- installed layers -------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class Layer:
    """One installed target (internal, mutable: a layer beneath may be spliced out later)."""

    profile: str
    target: str
    origin: str
    owner: Any
    attribute: str
    created: bool  # the slot did not exist on owner before (inherited attribute): restore deletes it
    original: Any
    wrapper: Any  # the object written: our FunctionWrapper around `original`
    function: Any  # the wrapper function the spec's factory made, which the wrapper calls
    aliases: list[tuple[Any, str]]
    stacked_on: str

    def locations(self) -> list[tuple[Any, str, bool]]:
        return [(self.owner, self.attribute, self.created)] + [(m, n, False) for m, n in self.aliases]

    def record(self) -> ledger.ActivePatch:
        return ledger.ActivePatch(
            target=self.target,
            origin=self.origin,
            profile=self.profile,
            aliases=tuple(label_of(m, n) for m, n in self.aliases),
            stacked_on=self.stacked_on,
            pid=PID[0],
        )


# --- descriptions for error messages ------------------------------------------------------


def is_proxy(obj: Any) -> bool:
    return issubclass(type(obj), wrapt.BaseObjectProxy)


def wrapper_profile(obj: Any) -> str | None:
    """The profile of the maxtext-compat wrapper `obj` is (of this copy of the library or another), else None.

    Read on the type first: someone else's proxy around ours forwards attribute reads to ours, but is not ours."""
    if not hasattr(type(obj), WRAPPER_MARKER):
        return None
    profile = getattr(obj, WRAPPER_MARKER, None)
    return profile if isinstance(profile, str) else None


def label_of(obj: Any, name: str) -> str:
    """'module:attr', 'module:Class.attr', or the wrapper whose __wrapped__ is meant (for messages)."""
    if isinstance(obj, types.ModuleType):
        return f"{obj.__name__}:{name}"
    if isinstance(obj, type):
        return f"{obj.__module__}:{obj.__qualname__}.{name}"
    layer = next((la for la in REGISTRY.layers.values() if la.wrapper is obj), None)
    if layer is not None:
        return f"the {layer.profile!r} layer of {layer.target}"
    return f"{type(obj).__qualname__} wrapper ({name})"


def name_of(obj: Any) -> str:
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}"
    return repr(obj)


def describe_object(obj: Any) -> str:
    if obj is ABSENT:
        return "nothing (the attribute was deleted)"
    if is_proxy(obj):
        layer = REGISTRY.layers.get(id(obj))
        if layer is not None and layer.wrapper is obj:
            return f"the maxtext-compat wrapper of profile {layer.profile!r}"
        profile = wrapper_profile(obj)
        if profile is not None:
            return f"a maxtext-compat wrapper of profile {profile!r} that this copy of maxtext-compat did not install"
        try:
            inner = describe_object(obj.__wrapped__)
        except Exception:  # a broken proxy: say so instead of failing the error message
            inner = "?"
        return f"{type(obj).__qualname__}({inner})"
    if isinstance(obj, (staticmethod, classmethod)):
        return f"{type(obj).__name__}({describe_object(obj.__func__)})"
    mod = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None)
    if isinstance(mod, str) and isinstance(name, str):
        return f"{mod}.{name}"
    text = repr(obj)
    return text if len(text) <= 80 else text[:77] + "..."


# --- the public view of the ledger ----------------------------------------------------------


@dataclass(frozen=True)
class InstalledLayer:
    """One installed patch as others may see it: the profile, the target, our wrapper (the object written) and the
    wrapper function it calls."""

    profile: str
    target: str
    wrapper: Any
    function: Any


def layer_of(obj: Any) -> InstalledLayer | None:
    """The layer whose installed object `obj` is (an entry read from a class or module dict), else None.

    Why by object and not by registry: a caller holding `obj` asks about that object, so an
    uninstall racing with the question cannot make the answer describe something else."""
    layer = REGISTRY.layers.get(id(obj))
    if layer is None or layer.wrapper is not obj:
        return None
    return InstalledLayer(layer.profile, layer.target, layer.wrapper, layer.function)


def original_beneath(obj: Any) -> Any:
    """What `obj`, an entry read from a class or module dict, runs beneath every wrapper of maxtext-compat stacked on
    it, installed by this copy of the library or not (`obj` itself when it is not ours): the release's own
    function, whose signature a caller must follow."""
    while wrapper_profile(obj) is not None:
        obj = obj.__wrapped__
    return obj


def installed_layers() -> tuple[InstalledLayer, ...]:
    """Every layer this copy of the library has installed in this process (the ledger `doctor` reads)."""
    unique = {id(layer): layer for layer in list(REGISTRY.layers.values())}
    return tuple(InstalledLayer(la.profile, la.target, la.wrapper, la.function) for la in unique.values())
