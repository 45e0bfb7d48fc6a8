"""Writes to module and class slots: the only code that mutates targets, all or nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from maxtext_compat.errors import PatchError, PatchTargetError
from maxtext_compat.patching.state import ABSENT, MARKER, label_of


class Write(NamedTuple):
    """One slot change; a tuple because installs build many of them (10,000-cycle stress runs)."""

    obj: Any
    name: str
    value: Any  # ABSENT deletes the slot
    previous: Any  # what undoes it (ABSENT: delete again)


def read_slot(obj: Any, name: str) -> Any:
    """The raw entry of obj's own __dict__ (never inherited, never bound), or ABSENT."""
    try:
        return obj.__dict__.get(name, ABSENT)
    except (AttributeError, TypeError):
        return ABSENT


def _write(obj: Any, name: str, value: Any) -> None:
    if value is ABSENT:
        delattr(obj, name)
    else:
        setattr(obj, name, value)


def commit_writes(writes: Sequence[Write], action: str) -> None:
    """Apply `writes` in order; on any failure undo the applied ones in reverse and raise."""
    for i, w in enumerate(writes):
        try:
            _write(w.obj, w.name, w.value)
        except BaseException as exc:
            broken = _rollback(writes[:i])
            if not isinstance(exc, Exception):
                raise
            where = label_of(w.obj, w.name)
            if broken:
                raise PatchError(
                    f"{action} failed at {where} and rolling back failed too",
                    argument=where,
                    expected="every earlier change undone",
                    found=f"{type(exc).__name__}: {exc}; could not undo: {broken}",
                    fix="restart the process: its patch state is inconsistent",
                ) from exc
            raise PatchTargetError(
                f"{action} failed writing {where}; the {i} earlier change(s) were rolled back",
                argument=where,
                expected="a writable module or class attribute",
                found=f"{type(exc).__name__}: {exc}",
                fix="the target refuses assignment (read-only type or metaclass __setattr__); "
                "it cannot be monkeypatched — use an adapter instead",
            ) from exc


def _rollback(done: Sequence[Write]) -> list[str]:
    broken: list[str] = []
    for w in reversed(done):
        try:
            _write(w.obj, w.name, w.previous)
        except Exception as exc:
            broken.append(f"{label_of(w.obj, w.name)} ({type(exc).__name__}: {exc})")
    return broken


class Markers:
    """Pending changes to the `__maxtext_compat_patches__` marker of each owner in one transaction."""

    def __init__(self) -> None:
        self._new: dict[int, tuple[Any, dict[str, tuple[str, ...]]]] = {}

    def _of(self, owner: Any) -> dict[str, tuple[str, ...]]:
        entry = self._new.get(id(owner))
        if entry is None:
            current = read_slot(owner, MARKER)
            entry = self._new[id(owner)] = (owner, dict(current) if isinstance(current, dict) else {})
        return entry[1]

    def add(self, owner: Any, attribute: str, profile: str) -> None:
        marker = self._of(owner)
        marker[attribute] = (*marker.get(attribute, ()), profile)

    def discard(self, owner: Any, attribute: str, profile: str) -> None:
        marker = self._of(owner)
        marker[attribute] = tuple(p for p in marker.get(attribute, ()) if p != profile)

    def writes(self) -> list[Write]:
        out = []
        for owner, new in self._new.values():
            clean = {k: v for k, v in new.items() if v}
            out.append(Write(owner, MARKER, clean or ABSENT, read_slot(owner, MARKER)))
        return out
