"""The process-wide record of active patches (what `doctor` lists).

Why a registry: patches are applied in every vLLM process by a plugin and removed by
`uninstall()`; users and the doctor need to see, per process, what is patched, by whom,
and from which profile. Two profiles may patch the same target (stacked), so a record
is keyed by (target, profile), and records keep install order within a target.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from maxtext_compat.contract import checked
from maxtext_compat.locks import fork_safe_lock
from maxtext_compat.patching.registry import REGISTRY

_LOCK = fork_safe_lock()


@checked
@dataclass(frozen=True)
class ActivePatch:
    """One active patch, as `doctor` lists it: what was patched, by what, from which profile.

    >>> import sys, types
    >>> from maxtext_compat import shims
    >>> greetings = sys.modules.setdefault("greetings", types.ModuleType("greetings"))  # a module to patch
    >>> exec("def greet(name):\\n    return 'hello ' + name", greetings.__dict__)
    >>> def louder(original):  # a factory: gets the Original, returns a wrapt-style wrapper
    ...     return lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs).upper()
    >>> shims.register_profile("louder", lambda: [shims.PatchSpec("greetings:greet", louder)], replace=True)
    >>> with shims.patched("louder"):
    ...     patch = shims.active_patches()[0]
    >>> patch.target, patch.profile, patch.origin.endswith("louder")
    ('greetings:greet', 'louder', True)
    >>> shims.unregister_profile("louder")
    """

    target: str  # "module:Class.attribute"
    origin: str  # what replaced it ("maxtext_compat.shims.<module>.<function>")
    profile: str  # the shim profile that installed it
    aliases: tuple[str, ...] = ()  # other "module:name" globals swapped with it
    stacked_on: str = ""  # what it wraps when that is not the original ("profile X", "foreign <type>")
    pid: int = field(default_factory=os.getpid)  # the process that installed it (differs after fork)

    def as_dict(self) -> dict[str, str]:
        """The three keys `doctor` prints; `details()` has the rest."""
        return {"target": self.target, "origin": self.origin, "profile": self.profile}

    def details(self) -> dict[str, object]:
        return {**self.as_dict(), "aliases": list(self.aliases), "stacked_on": self.stacked_on, "pid": self.pid}


def record(patch: ActivePatch) -> None:
    record_many([patch])


def record_many(patches: list[ActivePatch]) -> None:
    """Record (or update) patches; a target keeps its place when re-recorded."""
    with _LOCK:
        for patch in patches:
            key = (patch.target, patch.profile)
            REGISTRY.patches[key] = patch
            if key not in REGISTRY.patch_order:
                REGISTRY.patch_order[key] = next(REGISTRY.patch_counter)


def forget(target: str, profile: str | None = None) -> None:
    """Drop the record of `target` for `profile` (every profile when None)."""
    with _LOCK:
        keys = [k for k in REGISTRY.patches if k[0] == target and (profile is None or k[1] == profile)]
        for key in keys:
            del REGISTRY.patches[key]
            del REGISTRY.patch_order[key]


def forget_many(keys: list[tuple[str, str]]) -> None:
    """Drop the records of these (target, profile) pairs."""
    with _LOCK:
        for key in keys:
            if REGISTRY.patches.pop(key, None) is not None:
                del REGISTRY.patch_order[key]


def active_patches() -> list[ActivePatch]:
    """Active patches sorted by target, stacked ones in install order (innermost first).

    >>> import sys, types
    >>> from maxtext_compat import shims
    >>> greetings = sys.modules.setdefault("greetings", types.ModuleType("greetings"))  # a module to patch
    >>> exec("def greet(name):\\n    return 'hello ' + name", greetings.__dict__)
    >>> def louder(original):  # a factory: gets the Original, returns a wrapt-style wrapper
    ...     return lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs).upper()
    >>> shims.register_profile("louder", lambda: [shims.PatchSpec("greetings:greet", louder)], replace=True)
    >>> with shims.patched("louder"):
    ...     [p.as_dict()["target"] for p in shims.active_patches()]
    ['greetings:greet']
    >>> shims.unregister_profile("louder")
    """
    with _LOCK:
        return [REGISTRY.patches[k] for k in sorted(REGISTRY.patches, key=lambda k: (k[0], REGISTRY.patch_order[k]))]
