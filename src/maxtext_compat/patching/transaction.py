"""Install and uninstall: resolve and check every target, then swap or restore all under `LOCK`.

A profile's values (settings: env vars, attributes, config globals) join the same transaction as its
wrapped callables: written first, taken back if a wrapper cannot be written, restored after them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from maxtext_compat.contract import checked
from maxtext_compat.errors import PatchConflictError
from maxtext_compat.patching import ledger
from maxtext_compat.patching.aliases import sweep_aliases
from maxtext_compat.patching.conflicts import check_conflicts, raise_same_slot
from maxtext_compat.patching.registry import REGISTRY
from maxtext_compat.patching.settings import Setting, SettingSet, apply_settings, remove_settings
from maxtext_compat.patching.spec import Original, PatchSpec
from maxtext_compat.patching.state import ABSENT, LOCK, PID, Layer, describe_object, is_proxy, label_of
from maxtext_compat.patching.targets import resolve_target
from maxtext_compat.patching.wrappers import make_wrapper
from maxtext_compat.patching.writes import Markers, Write, commit_writes, read_slot

_MAX_CHAIN = 64


@checked
@dataclass(frozen=True, eq=False)
class PatchSet:
    """The patches one profile installed in this process (wrapped callables and set values); pass it to
    `remove()`.

    >>> import sys, types
    >>> from maxtext_compat import shims
    >>> greetings = sys.modules.setdefault("greetings", types.ModuleType("greetings"))  # a module to patch
    >>> exec("def greet(name):\\n    return 'hello ' + name", greetings.__dict__)
    >>> def louder(original):  # a factory: gets the Original, returns a wrapt-style wrapper
    ...     return lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs).upper()
    >>> shims.register_profile("louder", lambda: [shims.PatchSpec("greetings:greet", louder)], replace=True)
    >>> with shims.patched("louder") as patch_set:
    ...     patch_set.profile, [p.target for p in patch_set.patches]
    ('louder', ['greetings:greet'])
    >>> shims.unregister_profile("louder")
    """

    profile: str
    pid: int
    layers: tuple[Layer, ...] = field(repr=False)
    settings: SettingSet | None = field(default=None, repr=False)

    @property
    def patches(self) -> tuple[ledger.ActivePatch, ...]:
        values = () if self.settings is None else self.settings.records
        return tuple(layer.record() for layer in self.layers) + values

    @property
    def targets(self) -> tuple[str, ...]:
        values = () if self.settings is None else self.settings.targets
        return tuple(layer.target for layer in self.layers) + values


def apply(
    profile: str, specs: Sequence[PatchSpec], *, stack: bool = False, settings: Iterable[Setting] = ()
) -> PatchSet:
    """Patch every target of `specs` and set every value of `settings` for `profile`, or none of them.

    Modules must already be imported (`import_modules`). `stack=True` wraps targets that
    someone else already wrapped (their object is restored on removal); without it that is
    a `PatchConflictError`. Targets patched by another of our profiles are always stacked.
    """
    settings = list(settings)
    with LOCK:
        planned = [(spec, resolve_target(spec, profile)) for spec in specs]
        if not stack:
            check_conflicts(planned)
        layers = [_build_layer(spec, original, profile) for spec, original in planned]
        writes: list[Write] = []
        markers = Markers()
        slots: dict[tuple[int, str], Layer] = {}
        for layer in layers:
            for obj, name, _created in layer.locations():
                other = slots.setdefault((id(obj), name), layer)
                if other is not layer:
                    raise_same_slot(profile, other, layer, obj, name)
                writes.append(Write(obj, name, layer.wrapper, read_slot(obj, name)))
            markers.add(layer.owner, layer.attribute, profile)
        writes.extend(markers.writes())
        values = apply_settings(profile, settings) if settings else None  # all or none, on its own
        try:
            commit_writes(writes, f"installing profile {profile!r}")
        except BaseException:
            if values is not None:
                remove_settings(values)
            raise
        for layer in layers:
            REGISTRY.layers[id(layer.wrapper)] = layer
        ledger.record_many([layer.record() for layer in layers])
        return PatchSet(profile, PID[0], tuple(layers), values)


def _build_layer(spec: PatchSpec, original: Original, profile: str) -> Layer:
    wrapper, function = make_wrapper(spec, original, profile)
    below = REGISTRY.layers.get(id(original.raw))
    if below is not None and below.wrapper is original.raw:
        stacked_on = f"profile {below.profile}"
    elif is_proxy(original.raw):
        stacked_on = f"foreign {type(original.raw).__qualname__}"
    else:
        stacked_on = ""
    return Layer(
        profile=profile,
        target=spec.target,
        origin=spec.describe_origin(),
        owner=original.owner,
        attribute=original.attribute,
        created=original.owner is not original.defined_in,
        original=original.raw,
        wrapper=wrapper,
        function=function,
        aliases=sweep_aliases(spec, original),
        stacked_on=stacked_on,
    )


@dataclass(slots=True)
class _Removal:
    layers: list[Layer]
    writes: list[Write]
    problems: list[str]
    fixups: list[tuple[Layer, Layer]]  # (layer stacked on a removed one, the removed one)


def _plan_removal(patch_set: PatchSet, *, force: bool) -> _Removal:
    layers = [layer for layer in patch_set.layers if REGISTRY.layers.get(id(layer.wrapper)) is layer]
    plan = _Removal(layers, [], [], [])
    markers = Markers()
    spliced: set[int] = set()
    removed = {id(layer.wrapper) for layer in layers}
    for above in REGISTRY.layers.values():  # our layers wrapping a removed one: splice it out beneath them
        if id(above.original) in removed and id(above.wrapper) not in removed:
            layer = REGISTRY.layers[id(above.original)]
            plan.writes.append(Write(above.wrapper, "__wrapped__", layer.original, layer.wrapper))
            spliced.add(id(above.wrapper))
            plan.fixups.append((above, layer))
    for layer in reversed(layers):
        for obj, name, created in layer.locations():
            current = read_slot(obj, name)
            restored = ABSENT if created else layer.original
            if current is layer.wrapper:
                plan.writes.append(Write(obj, name, restored, current))
                continue
            proxy = _proxy_above(current, layer.wrapper)
            if proxy is not None:
                if id(proxy) not in spliced:
                    spliced.add(id(proxy))
                    plan.writes.append(Write(proxy, "__wrapped__", layer.original, layer.wrapper))
            elif force:
                if not (current is ABSENT and restored is ABSENT):
                    plan.writes.append(Write(obj, name, restored, current))
            else:
                where = label_of(obj, name)
                held = describe_object(current)
                plan.problems.append(f"{where} holds {held} instead of the {layer.profile!r} wrapper")
        markers.discard(layer.owner, layer.attribute, layer.profile)
    plan.writes.extend(markers.writes())
    return plan


def drift(patch_set: PatchSet) -> list[str]:
    """Locations of `patch_set` that no longer hold its wrapper (directly or beneath a wrapt wrapper)."""
    with LOCK:
        return _plan_removal(patch_set, force=False).problems


def check_removable(patch_set: PatchSet) -> None:
    """Raise the PatchConflictError `remove(patch_set)` would raise, changing nothing."""
    with LOCK:
        _raise_problems(patch_set, _plan_removal(patch_set, force=False).problems)


def _raise_problems(patch_set: PatchSet, problems: list[str]) -> None:
    if problems:
        raise PatchConflictError(
            f"cannot uninstall profile {patch_set.profile!r}: its patches were replaced by someone else",
            argument=patch_set.profile,
            expected="our wrapper (or a wrapt wrapper around it) at every patched location",
            found="; ".join(problems),
            fix="remove the other patch first, or uninstall(force=True) to put the originals back anyway",
        )


def remove(patch_set: PatchSet, *, force: bool = False) -> None:
    """Restore every location of `patch_set`, or none of them (then its settings, where they are still ours).

    A location that holds our wrapper gets the original back (or loses the slot we created);
    a location where a wrapt wrapper sits on top of ours is spliced (ours removed beneath
    it); anything else means someone replaced our patch: `PatchConflictError`, unless
    `force=True`, which puts the original back regardless. Removing twice is a no-op.
    """
    with LOCK:
        plan = _plan_removal(patch_set, force=force)
        _raise_problems(patch_set, plan.problems)
        commit_writes(plan.writes, f"uninstalling profile {patch_set.profile!r}")
        for above, layer in plan.fixups:
            above.original = layer.original
            above.stacked_on = layer.stacked_on
            if above.owner is layer.owner and above.attribute == layer.attribute:
                above.created = layer.created
            ledger.record(above.record())
        for layer in plan.layers:
            del REGISTRY.layers[id(layer.wrapper)]
        ledger.forget_many([(layer.target, layer.profile) for layer in plan.layers])
        if patch_set.settings is not None:  # a slot holding someone else's value now is left to them
            remove_settings(patch_set.settings)


def _proxy_above(current: Any, wrapper: Any) -> Any:
    """The wrapt proxy whose __wrapped__ is `wrapper`, following only wrapt proxies from `current`."""
    obj = current
    for _ in range(_MAX_CHAIN):
        if not is_proxy(obj):
            return None
        inner = obj.__wrapped__
        if inner is wrapper:
            return obj
        obj = inner
    return None
