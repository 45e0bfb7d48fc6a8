"""Writes to module and class slots: the only code that mutates targets, all or nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from maxtext_compat.errors import PatchError, PatchTargetError
from maxtext_compat.shims.patching.describe import _label
from maxtext_compat.shims.patching.state import _ABSENT, MARKER


class _Write(NamedTuple):
    """One slot change; a tuple because installs build many of them (10,000-cycle stress runs)."""

    obj: Any
    name: str
    value: Any  # _ABSENT deletes the slot
    previous: Any  # what undoes it (_ABSENT: delete again)


def _read(obj: Any, name: str) -> Any:
    """The raw entry of obj's own __dict__ (never inherited, never bound), or _ABSENT."""
    try:
        return obj.__dict__.get(name, _ABSENT)
    except (AttributeError, TypeError):
        return _ABSENT


def _write(obj: Any, name: str, value: Any) -> None:
    if value is _ABSENT:
        delattr(obj, name)
    else:
        setattr(obj, name, value)


def _commit(writes: Sequence[_Write], action: str) -> None:
    """Apply `writes` in order; on any failure undo the applied ones in reverse and raise."""
    for i, w in enumerate(writes):
        try:
            _write(w.obj, w.name, w.value)
        except BaseException as exc:
            broken = _rollback(writes[:i])
            if not isinstance(exc, Exception):
                raise
            where = _label(w.obj, w.name)
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


def _rollback(done: Sequence[_Write]) -> list[str]:
    broken: list[str] = []
    for w in reversed(done):
        try:
            _write(w.obj, w.name, w.previous)
        except Exception as exc:
            broken.append(f"{_label(w.obj, w.name)} ({type(exc).__name__}: {exc})")
    return broken


class _Markers:
    """Pending changes to the `__maxtext_compat_patches__` marker of each owner in one transaction."""

    def __init__(self) -> None:
        self._new: dict[int, tuple[Any, dict[str, tuple[str, ...]]]] = {}

    def _of(self, owner: Any) -> dict[str, tuple[str, ...]]:
        entry = self._new.get(id(owner))
        if entry is None:
            current = _read(owner, MARKER)
            entry = self._new[id(owner)] = (owner, dict(current) if isinstance(current, dict) else {})
        return entry[1]

    def add(self, owner: Any, attribute: str, profile: str) -> None:
        marker = self._of(owner)
        marker[attribute] = (*marker.get(attribute, ()), profile)

    def discard(self, owner: Any, attribute: str, profile: str) -> None:
        marker = self._of(owner)
        marker[attribute] = tuple(p for p in marker.get(attribute, ()) if p != profile)

    def writes(self) -> list[_Write]:
        out = []
        for owner, new in self._new.values():
            clean = {k: v for k, v in new.items() if v}
            out.append(_Write(owner, MARKER, clean or _ABSENT, _read(owner, MARKER)))
        return out
