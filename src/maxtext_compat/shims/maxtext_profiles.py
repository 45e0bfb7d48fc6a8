"""MaxText shim profiles: `vllm-backport` (pre-#2616 releases), `call-rule` and `known-defects` (fixes per release):
the three Shims, the default profile's choice for a row, the caller convention's owner, and their registration.
What each patches is built in `rule_patches` (the call rule, the backport) and `defect_patches` (a row's fixes).

Why profiles on MaxText's own classes (and not only adapters): vLLM's model code, MaxText's
own decode scripts and users' training loops construct MaxText's classes directly. A shim
gives those classes the two-convention call rule in place: new calls thread KV caches and
run ragged paged attention, every old call MaxText makes internally keeps its old return.
Both profiles are built from the installed release's matrix row and go through the shims
core (atomic, reversible, listed by `maxtext-compat doctor`).
"""

from __future__ import annotations

from typing import Any

from maxtext_compat import names
from maxtext_compat.convention import callers
from maxtext_compat.locks import fork_safe_lock
from maxtext_compat.matrix import MaxTextRow
from maxtext_compat.patching.shim import Shim
from maxtext_compat.shims.defect_patches import DEFECT_TARGETS, defect_specs
from maxtext_compat.shims.rule_patches import backport_specs, call_rule_specs

BACKPORT = names.VLLM_BACKPORT
DEFECTS = names.KNOWN_DEFECTS
CALL_RULE = names.CALL_RULE
_registered = fork_safe_lock()


def _row() -> MaxTextRow:
    from maxtext_compat.resolution.installed import installed_row

    return installed_row()


# ----------------------------------------------------------------------------------------------
# Registration and the default choice
# ----------------------------------------------------------------------------------------------


def for_declared_convention(profile: str | None) -> str | None:
    """What a declared caller convention needs besides `profile`: the call rule in MaxText's classes.

    On a release without the KV parameters the rule lives in vllm-backport (with the backport it
    routes to); without MaxText there is nothing to put it in.
    """
    from maxtext_compat.errors import ResolutionError

    try:
        row = _row()
    except ResolutionError:
        return None
    needed = CALL_RULE if row.has_kv_params else BACKPORT
    if profile in (needed, BACKPORT):
        return None
    register()  # puts back a built-in profile someone unregistered: the declaration needs it
    return needed


def choose(resolution: Any) -> str | None:
    """The profile `shims.install()` picks: the backport for pre-#2616 rows, else the defect fixes; a fork that
    no row's adapters can call is refused here, before any patch."""
    from maxtext_compat.resolution.installed import refuse_unbridged

    refuse_unbridged(resolution)
    row = resolution.maxtext
    if row is None:
        return None
    if not row.has_kv_params:
        return BACKPORT
    if any(d.id in DEFECT_TARGETS and d.remedy == "fix" for d in row.known_defects):
        return DEFECTS
    if row.vllm is not None and resolution.versions.get("tpu_inference") is not None:
        return DEFECTS  # the config checks: refused defects and the attention backend of a vLLM server
    return None


class _CallerConventions:
    """The caller convention as `shims.install(convention=...)` declares it (see profiles.Declarations)."""

    def check(self, value: str, argument: str) -> str:

        return callers.check(value, argument)

    def companion(self, profile: str | None) -> str | None:
        return for_declared_convention(profile)

    def declare(self, value: str, source: str) -> object:

        callers.set_caller_convention(value, source=source)
        return callers.process_convention()

    def forget(self, token: object) -> None:

        if callers.process_convention() is token:
            callers.set_caller_convention(None)


class _RowShim(Shim):
    """A MaxText profile: its patches are built for the installed release's matrix row at install time."""

    def build(self, row: MaxTextRow) -> list[Any]:
        raise NotImplementedError

    def specs(self) -> list[Any]:
        from maxtext_compat.resolution.installed import installed_resolution, refuse_unbridged

        refuse_unbridged(installed_resolution().resolution)
        return self.build(_row())

    def facts(self) -> dict[str, str]:
        return {"maxtext": _row().name}


class VllmBackportShim(_RowShim):
    name = BACKPORT
    description = "new calls on a pre-#2616 MaxText: the call rule, its KV session and ragged paged attention"
    verified_for = (names.MAXTEXT_RELEASES,)  # built for rows without the KV parameters (0.1.0); tested on 0.2.x too

    def build(self, row: MaxTextRow) -> list[Any]:
        return backport_specs(row)


class KnownDefectsShim(_RowShim):
    name = DEFECTS
    description = "fixes listed in the matrix row"
    verified_for = (names.MAXTEXT_RELEASES,)  # the defects each matrix row lists, with the releases each was seen on

    def build(self, row: MaxTextRow) -> list[Any]:
        return defect_specs(row)


class CallRuleShim(_RowShim):
    name = CALL_RULE
    description = "the call rule (and a declared caller convention) in MaxText's own classes"
    verified_for = (names.MAXTEXT_RELEASES,)  # built for rows with the KV parameters (0.2.x)

    def build(self, row: MaxTextRow) -> list[Any]:
        return call_rule_specs(row)


def register() -> None:
    """Register the three shims and, when none is set, the matrix-driven default chooser (idempotent, light).

    Safe to call again after a user or a test unregistered a profile or cleared the chooser: what is
    missing is put back, what is there is left alone.
    """
    from maxtext_compat.patching import profiles, shim

    with _registered:
        if not {BACKPORT, DEFECTS, CALL_RULE} <= set(profiles.registered_profiles()):
            for made in (VllmBackportShim(), KnownDefectsShim(), CallRuleShim()):
                if not profiles.installed(made.name):
                    shim.register(made)
            profiles.set_declarations(_CallerConventions())
        if not profiles.has_default_profile_chooser():
            profiles.set_default_profile_chooser(choose)
