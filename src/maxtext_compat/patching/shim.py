"""One lifecycle for every patch set, after OpenTelemetry's `BaseInstrumentor`.

Why a base class: each patch set of the package (MaxText's profiles, the backport's hooks, the CPU stand-ins, the
serving stack's fixes) had its own lock, status global and registration, and `shims.uninstall()` could not see all
of them. A subclass says what it patches (`specs`), when it applies (`applies`), what it verified (`verified_for`)
and what it chose (`facts`); installing, removing and reporting are written here once, through the profile engine's
one transaction, and every shim's state lives in the engine's one registry (`profiles.REGISTRY`). A shim removed by
anyone (`shims.uninstall()` included) hears it through `removed`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from maxtext_compat.contract import checked
from maxtext_compat.errors import ShimRefusedError
from maxtext_compat.locks import fork_safe_lock
from maxtext_compat.patching import profiles
from maxtext_compat.patching.registry import REGISTRY
from maxtext_compat.patching.settings import Setting
from maxtext_compat.patching.spec import PatchSpec
from maxtext_compat.patching.state import LOCK
from maxtext_compat.patching.transaction import PatchSet
from maxtext_compat.versions import unmet

# Serializes whole shim installs and removals (a shim's checks, its registration and its transaction belong
# together); the engine's LOCK guards the state inside. Made by maxtext_compat.locks: taken around fork.
LIFECYCLE = fork_safe_lock()
NOT_ASKED = "not installed in this process"  # the status of a shim nobody asked for (or removed since)
# The entry point group every installed distribution declares its shims under (name = "module:ShimClass").
ENTRY_POINTS = "maxtext_compat.shims"


@dataclass(frozen=True)
class ShimStatus:
    """What a shim did in this process, or why it did nothing: the one shape `doctor` lists for every shim."""

    name: str
    active: bool
    reason: str
    targets: tuple[str, ...] = ()
    verified_for: tuple[str, ...] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        """A fact by name (`status.kernel`, `status.parts`): what the shim chose reads like a field."""
        facts = self.__dict__.get("facts")
        if facts is not None and name in facts:
            return facts[name]
        raise AttributeError(f"the status of shim {self.__dict__.get('name')!r} has no field or fact {name!r}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "active": self.active,
            "reason": self.reason,
            "targets": list(self.targets),
            "verified_for": list(self.verified_for),
            **({"facts": dict(self.facts)} if self.facts else {}),
        }


@checked
class Shim:
    """A named patch set with one lifecycle. Subclasses write `specs()` and, where they need them, `applies()`,
    `facts()`, `installed_now()` and `removed()`; `install()`, `uninstall()` and `status()` are written here.

    >>> from maxtext_compat import shims
    >>> class Quiet(shims.Shim):
    ...     name = "quiet"
    ...     def specs(self):
    ...         return []  # PatchSpecs and Settings; see shims.PatchSpec
    >>> Quiet().install().active, shims.install("quiet") is not None  # by name: the same shim, the same door
    (True, True)
    >>> Quiet().uninstall(); shims.unregister_profile("quiet")
    []
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    # The releases the patched code was verified on, as requirement strings ("maxtext>=0.2,<0.3"): `install()` refuses
    # an installed distribution outside them (ShimRefusedError) unless force=True; doctor lists them.
    verified_for: ClassVar[tuple[str, ...]] = ()

    # ------------------------------------------------------------------ what a subclass says

    def applies(self) -> str | None:
        """None when the shim applies in this process; else why it does not (nothing is installed then)."""
        return None

    def specs(self) -> Iterable[PatchSpec | Setting]:
        raise NotImplementedError

    def facts(self) -> Mapping[str, Any]:
        """What this shim chose (parts, a kernel, the defects it handles), for its status."""
        return {}

    def reason(self) -> str:
        """What an installed shim's status says it did."""
        return "installed"

    def installed_now(self, patch_set: PatchSet) -> None:
        """Runs once the transaction is in; raising removes the shim again (all or nothing)."""

    def removed(self) -> None:
        """Runs after the shim's patches are gone, whoever removed them."""

    # ------------------------------------------------------------------ written once

    def install(self, *, stack: bool = False, force: bool = False) -> ShimStatus:
        """Install this shim in this process, all of it or nothing; idempotent (an installed shim of the same
        name answers with its status). `shims.install(name)` of a registered shim comes here too; `stack=True`
        wraps targets another patcher wrapped instead of raising PatchConflictError. An installed distribution
        outside `verified_for` is refused (ShimRefusedError naming it, its version and the range); `force=True`
        installs anyway."""
        with LIFECYCLE:
            if profiles.installed(self.name):
                return status_of(self.name)
            why = self.applies()
            if why is not None:
                return self._record(ShimStatus(self.name, False, why, (), self.verified_for, dict(self.facts())))
            if not force:
                self._refuse_unverified()
            register(self)
            patch_set = profiles.install_patch_set(self.name, stack=stack)
            try:
                self.installed_now(patch_set)
            except BaseException:
                profiles.uninstall(self.name, force=True)
                raise
            facts = dict(self.facts())
            return self._record(
                ShimStatus(self.name, True, self.reason(), tuple(patch_set.targets), self.verified_for, facts)
            )

    def uninstall(self) -> list[str]:
        """Remove this shim's patches (a no-op when it is not installed); the targets restored."""
        return uninstall(self.name)

    def status(self) -> ShimStatus:
        return status_of(self.name)

    def _refuse_unverified(self) -> None:
        """ShimRefusedError for the first installed distribution outside `verified_for` (recorded as the status)."""
        for wanted, dist, found in unmet(self.verified_for):
            err = ShimRefusedError(
                f"shim {self.name!r} is verified for {wanted} and {dist} {found} is installed",
                argument=dist,
                expected=wanted,
                found=found,
                fix=f"install {wanted}, or try it anyway: shims.install({self.name!r}, force=True) "
                f"(or {type(self).__name__}().install(force=True))",
            )
            self._record(ShimStatus(self.name, False, f"refused: {err.message}", (), self.verified_for))
            raise err

    def _record(self, st: ShimStatus) -> ShimStatus:
        with LOCK:
            REGISTRY.statuses[self.name] = st
        return st

    def _on_removed(self) -> None:
        with LOCK:
            REGISTRY.statuses.pop(self.name, None)
        self.removed()


def uninstall(name: str) -> list[str]:
    """Remove the shim called `name` (a no-op when it is not installed; no shim object needed); its targets."""
    with LIFECYCLE:
        with LOCK:
            patch_set = REGISTRY.installed.get(name)
        if patch_set is None:
            return []
        profiles.uninstall(name)
        return list(patch_set.targets)


def register(shim: Shim) -> None:
    """List `shim` under its name without installing it: installable by name through the profile API too
    (`shims.install(name)`), and listed by `doctor` beside the others."""
    with LIFECYCLE:
        profiles.register_profile(
            shim.name, shim.specs, description=shim.description, replace=True, on_removed=shim._on_removed
        )
        with LOCK:
            REGISTRY.shims[shim.name] = shim


def registered() -> dict[str, Shim]:
    """Every shim object registered or installed in this process, by name."""
    with LOCK:
        return dict(REGISTRY.shims)


def status_of(name: str) -> ShimStatus:
    """The status of shim `name`: installed, not applying here (with why), or never asked for."""
    with LOCK:
        found = REGISTRY.statuses.get(name)
        patch_set = REGISTRY.installed.get(name)
        owner = REGISTRY.shims.get(name)
    active = patch_set is not None
    if found is not None and found.active == active:
        return found
    verified = owner.verified_for if owner is not None else ()
    if active:
        assert patch_set is not None
        return ShimStatus(name, True, "installed", tuple(patch_set.targets), verified)
    return ShimStatus(name, False, NOT_ASKED, (), verified)


def statuses() -> list[ShimStatus]:
    """Every shim of this process: registered, installed or asked for (with why it did nothing), by name."""
    with LOCK:
        names = {*REGISTRY.shims, *REGISTRY.statuses, *REGISTRY.installed}
    return [status_of(n) for n in sorted(names)]


def listed() -> list[ShimStatus]:
    """`statuses()` and every shim an installed distribution declares under ENTRY_POINTS that this process has not
    met (not installed, with its class's verified range): what `doctor` lists in any process, a fresh one too.
    A declared shim whose class does not load is listed with why."""
    from importlib.metadata import entry_points

    found = {st.name: st for st in statuses()}
    for ep in entry_points(group=ENTRY_POINTS):
        if ep.name in found:  # met here, or declared twice (an editable install beside a built one)
            continue
        try:
            verified = tuple(ep.load().verified_for)
        except Exception as err:  # a broken third-party declaration must not take the listing down
            found[ep.name] = ShimStatus(ep.name, False, f"cannot load {ep.value}: {type(err).__name__}: {err}")
            continue
        found[ep.name] = ShimStatus(ep.name, False, NOT_ASKED, (), verified)
    return [found[n] for n in sorted(found)]
