"""The process-wide record of active patches (what `doctor` lists).

Why a registry: patches are applied in every vLLM process by a plugin and removed by
`uninstall()`; users and the doctor need to see, per process, what is patched, by whom,
and from which profile.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass

_LOCK = threading.RLock()
_ACTIVE: dict[str, ActivePatch] = {}


@dataclass(frozen=True)
class ActivePatch:
    target: str  # "module:Class.attribute"
    origin: str  # what replaced it ("maxtext_compat.shims.<module>.<function>")
    profile: str  # the shim profile that installed it

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def record(patch: ActivePatch) -> None:
    with _LOCK:
        _ACTIVE[patch.target] = patch


def forget(target: str) -> None:
    with _LOCK:
        _ACTIVE.pop(target, None)


def active_patches() -> list[ActivePatch]:
    with _LOCK:
        return sorted(_ACTIVE.values(), key=lambda p: p.target)
