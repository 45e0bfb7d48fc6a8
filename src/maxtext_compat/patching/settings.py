"""Values a profile sets that are not callables to wrap: an attribute, a mapping entry, an env var, a config global.

Why in the engine: the promise that patches are atomic, reversible and listed by `doctor` holds for
every patch, and the CPU shims' patches are values (the interpreter's callbacks, an entry of jax's
TPU hardware table, block-size environment variables, jax's interpret-mode global, a re-jitted
sampler). They go through one transaction of the same shape as `apply`: every slot is read before
any is written, all are written or none (a failing write rolls the earlier ones back), each is
recorded in the registry under its profile, and removal restores the value that was there, but only
where the slot still holds ours (a later value is someone else's, and is left).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from maxtext_compat.errors import PatchError
from maxtext_compat.patching import ledger
from maxtext_compat.patching.registry import REGISTRY
from maxtext_compat.patching.state import ABSENT, LOCK


@dataclass(frozen=True)
class Slot:
    """Where a value lives: how to read it (ABSENT when missing) and write it (ABSENT deletes)."""

    target: str  # the ledger name ("module:attr", "os.environ:VAR", ...)
    read: Callable[[], Any]
    write: Callable[[Any], None]
    same: Callable[[Any, Any], bool] = field(default=lambda a, b: a is b)  # "still ours?"


def attribute_slot(owner: Any, name: str, target: str | None = None) -> Slot:
    def read() -> Any:
        return owner.__dict__.get(name, ABSENT) if hasattr(owner, "__dict__") else getattr(owner, name, ABSENT)

    def write(value: Any) -> None:
        if value is ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, value)

    label = target if target is not None else f"{getattr(owner, '__name__', type(owner).__name__)}:{name}"
    return Slot(label, read, write)


def item_slot(mapping: MutableMapping[Any, Any], key: Any, target: str) -> Slot:
    def write(value: Any) -> None:
        if value is ABSENT:
            mapping.pop(key, None)
        else:
            mapping[key] = value

    return Slot(target, lambda: mapping.get(key, ABSENT), write)


def env_slot(var: str) -> Slot:
    """An environment variable (compared by value: os.environ hands out a new str on every read)."""
    return Slot(f"os.environ:{var}", lambda: os.environ.get(var, ABSENT), item_slot(os.environ, var, "").write, _eq)


def global_slot(get: Callable[[], Any], set_: Callable[[Any], None], target: str) -> Slot:
    """A process-wide value behind a getter and a setter (e.g. a jax config option's global value)."""
    return Slot(target, get, set_)


def _eq(a: Any, b: Any) -> bool:
    return bool(a == b)


@dataclass(frozen=True)
class Setting:
    """Write `value` into `slot` for a profile; `keep_existing`: a value already there wins (nothing written)."""

    slot: Slot
    value: Any
    origin: str  # what set it, for `doctor` ("maxtext_compat.cpu.rpa.cpu_block_sizes")
    keep_existing: bool = False
    after_restore: Callable[[], None] | None = None  # e.g. clear a cache that saw our value


@dataclass(frozen=True, eq=False)
class SettingSet:
    """The settings one profile applied in this process, with the values they replaced."""

    profile: str
    applied: tuple[tuple[Setting, Any], ...]

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(s.slot.target for s, _ in self.applied)

    @property
    def records(self) -> tuple[ledger.ActivePatch, ...]:
        return tuple(_record(s, self.profile) for s, _ in self.applied)


def _record(setting: Setting, profile: str) -> ledger.ActivePatch:
    return ledger.ActivePatch(setting.slot.target, setting.origin, profile)


def apply_settings(profile: str, settings: Iterable[Setting]) -> SettingSet:
    """Apply every setting or none; record each in the registry under `profile`."""
    settings = list(settings)
    with LOCK:
        taken = [s.slot.target for s in settings if s.slot.target in REGISTRY.settings]
        if taken:
            raise PatchError(
                f"profile {profile!r} sets values another profile already set",
                argument=taken[0],
                expected="slots no installed profile holds",
                found=f"held by profile {REGISTRY.settings[taken[0]][0]!r}",
                fix="uninstall that profile first",
            )
        planned = [(s, s.slot.read()) for s in settings]  # read every slot before writing any
        done: list[tuple[Setting, Any]] = []
        try:
            for setting, before in planned:
                if setting.keep_existing and before is not ABSENT and not (isinstance(before, str) and before == ""):
                    continue  # the user's (or another library's) own value wins
                setting.slot.write(setting.value)
                done.append((setting, before))
        except BaseException:
            for setting, before in reversed(done):
                setting.slot.write(before)
            raise
        for setting, before in done:
            REGISTRY.settings[setting.slot.target] = (profile, setting, before)
        ledger.record_many([_record(s, profile) for s, _ in done])
        return SettingSet(profile, tuple(done))


def remove_settings(applied: SettingSet) -> list[str]:
    """Restore, newest first, every slot that still holds our value; forget all of them. Returns those restored."""
    restored: list[str] = []
    with LOCK:
        for setting, before in reversed(applied.applied):
            slot = setting.slot
            if slot.same(slot.read(), setting.value):
                slot.write(before)
                restored.append(slot.target)
            if setting.after_restore is not None:
                setting.after_restore()
            REGISTRY.settings.pop(slot.target, None)
        ledger.forget_many([(s.slot.target, applied.profile) for s, _ in applied.applied])
    return restored


def replaced_value(target: str) -> Any:
    """The value an active setting replaced at `target` (ABSENT when none is active there)."""
    with LOCK:
        found = REGISTRY.settings.get(target)
        return ABSENT if found is None else found[2]
