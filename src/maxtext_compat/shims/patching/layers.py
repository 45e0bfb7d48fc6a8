"""An installed target (`_Layer`) and a profile's installed set of them (`PatchSet`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from maxtext_compat.shims.patching.describe import _label
from maxtext_compat.shims.patching.state import _PID
from maxtext_compat.shims.registry import ActivePatch


@dataclass(eq=False, slots=True)
class _Layer:
    """One installed target (internal, mutable: a layer beneath may be spliced out later)."""

    profile: str
    target: str
    origin: str
    owner: Any
    attribute: str
    created: bool  # the slot did not exist on owner before (inherited attribute): restore deletes it
    original: Any
    shim: Any  # our FunctionWrapper (innermost proxy of this layer)
    wrapper: Any  # the object written (shim, or a with_signature proxy around it)
    aliases: list[tuple[Any, str]]
    stacked_on: str

    def locations(self) -> list[tuple[Any, str, bool]]:
        return [(self.owner, self.attribute, self.created)] + [(m, n, False) for m, n in self.aliases]

    def record(self) -> ActivePatch:
        return ActivePatch(
            target=self.target,
            origin=self.origin,
            profile=self.profile,
            aliases=tuple(_label(m, n) for m, n in self.aliases),
            stacked_on=self.stacked_on,
            pid=_PID[0],
        )


@dataclass(frozen=True, eq=False)
class PatchSet:
    """The patches one profile installed in this process; pass it to `remove()`."""

    profile: str
    pid: int
    _layers: tuple[_Layer, ...] = field(repr=False)

    @property
    def patches(self) -> tuple[ActivePatch, ...]:
        return tuple(layer.record() for layer in self._layers)

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(layer.target for layer in self._layers)
