"""Everything the profile engine holds in one process, in one object: `REGISTRY`.

Why one object: a profile's lifecycle (registered, built, installed, held by `with patched()` blocks, a caller
convention riding on it, a shim object owning it) is one state. It changes only under the engine's one lock
(`patching.LOCK`, taken around fork by `maxtext_compat.locks`), so a forked child inherits it consistent, and no
module keeps a piece of it in a global of its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from maxtext_compat.contract import checked

if TYPE_CHECKING:
    from maxtext_compat.resolution.resolver import Resolution

# Nothing here imports the rest of the engine (its modules all read this one): the values are typed loosely.

ProfileBuilder = Callable[[], Iterable[Any]]  # PatchSpecs and Settings
ProfileChooser = Callable[["Resolution"], "str | None"]


class Declarations(Protocol):
    """What `install(convention=...)` needs from whoever owns caller conventions (MaxText's profiles).

    Why a protocol: the patching engine imports nothing of MaxText; a declaration is only a value that
    lives as long as the profile carrying it, and may need a companion profile to reach anything."""

    def check(self, value: str, argument: str) -> str: ...

    def companion(self, profile: str | None) -> str | None: ...

    def declare(self, value: str, source: str) -> object: ...

    def forget(self, token: object) -> None: ...


@checked
@dataclass(frozen=True)
class Profile:
    """A registered profile: its name, the builder of its PatchSpecs, what `doctor` says about it.

    >>> from maxtext_compat import shims; assert shims.Profile("x", lambda: [], "none").description == "none"
    """

    name: str
    builder: ProfileBuilder
    description: str = ""
    on_removed: Callable[[], None] | None = None  # told when the profile is removed, by whoever removes it


@dataclass(eq=False)
class Registry:
    """The engine's state: profiles and what became of them, and the `Shim` objects that own them (`shims`) with
    their last statuses (`statuses`)."""

    profiles: dict[str, Profile] = field(default_factory=dict)
    specs: dict[str, tuple[Any, ...]] = field(
        default_factory=dict
    )  # PatchSpecs and Settings, built at the first install
    installed: dict[str, Any] = field(default_factory=dict)  # PatchSets; insertion order = install order
    explicit: set[str] = field(default_factory=set)  # installed by install(): stays after the last `patched()` block
    holders: dict[str, int] = field(default_factory=dict)  # profile -> `with patched()` blocks running with it
    declared_by: list[tuple[str, object]] = field(default_factory=list)  # (profile carrying it, declaration)
    chooser: ProfileChooser | None = None
    companion_of: dict[str, str] = field(default_factory=dict)  # profile -> the companion install(convention=) added
    declarations: Declarations | None = None
    shims: dict[str, Any] = field(default_factory=dict)  # profile -> the Shim object that installed it
    statuses: dict[str, Any] = field(default_factory=dict)  # shim name -> its last ShimStatus
    # What is patched right now: the ledger (`doctor` lists it), the values settings replaced, our layers by the
    # id of the object installed, wrappers built before (reused by a re-install), jitted code seen before installs.
    patches: dict[tuple[str, str], Any] = field(default_factory=dict)  # (target, profile) -> ActivePatch
    patch_order: dict[tuple[str, str], int] = field(default_factory=dict)  # install order within a target
    patch_counter: Iterator[int] = field(default_factory=itertools.count)
    settings: dict[str, tuple[str, Any, Any]] = field(default_factory=dict)  # target -> (profile, setting, before)
    layers: dict[int, Any] = field(default_factory=dict)  # id(installed object) -> its Layer
    built: dict[tuple[int, int, str], tuple[Any, ...]] = field(default_factory=dict)  # (spec, raw, wrapper, fn)
    compiled_before: dict[str, tuple[str, ...]] = field(default_factory=dict)  # profile -> jitted functions
    scanned: set[str] = field(default_factory=set)  # profiles whose first install was checked for them


REGISTRY = Registry()
