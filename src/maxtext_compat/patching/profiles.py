"""Named shim profiles and the public install / uninstall API.

Why profiles: a shim is a set of patches that only works together (the vLLM backport
needs Attention and every decoder layer), so a plugin, the CLI and tests install and
remove a whole named set. A profile is registered with a builder that returns its
`PatchSpec`s (callables to wrap) and `Setting`s (values to set), installed as one transaction;
the builder runs at the first install (its result is kept until the profile
is registered again), so registering imports nothing heavy.

Rules (per process; vLLM loads its plugins in every process, sometimes twice):
- `install(name)` when `name` is active is a no-op that returns the active `PatchSet`.
- Installing another profile while one is active installs it as a separate patch set
  on top: shared targets get a second, outer wrapper. Each profile is removed on its own,
  in any order (a layer beneath another is spliced out), and `uninstall()` removes all,
  newest first.
- `install()` without a name asks the default-profile chooser (a hook given the resolved
  matrix row); the chooser may answer None: "this install needs no shim".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from maxtext_compat import patching
from maxtext_compat.contract import checked
from maxtext_compat.errors import CompatError, InvalidArgumentError, ProfileError
from maxtext_compat.patching import PatchSet, PatchSpec, Setting, traced
from maxtext_compat.patching.registry import REGISTRY, Declarations, Profile, ProfileBuilder, ProfileChooser

if TYPE_CHECKING:
    from maxtext_compat.resolution.resolver import Resolution

__all__ = [
    "Profile",
    "active_profiles",
    "default_profile",
    "has_default_profile_chooser",
    "install",
    "installed",
    "patched",
    "register_profile",
    "registered_profiles",
    "set_default_profile_chooser",
    "uninstall",
    "unregister_profile",
    "verify",
]

log = logging.getLogger(__name__)


@checked
def register_profile(
    name: str,
    builder: ProfileBuilder,
    *,
    description: str = "",
    replace: bool = False,
    on_removed: Callable[[], None] | None = None,
) -> None:
    """Register `builder` (returns the PatchSpecs; called at the first install after registering, its
    specs then kept for the process) under `name`; register again (replace=True) to change them.

    >>> from maxtext_compat import shims; shims.register_profile("empty", lambda: [], description="no patches")
    >>> assert shims.registered_profiles()["empty"] == "no patches"; shims.unregister_profile("empty")
    """
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgumentError(
            "a profile needs a name",
            argument="register_profile(name)",
            expected="a non-empty string such as 'vllm-backport'",
            found=repr(name),
            fix="pass the profile name",
        )
    if not callable(builder):
        raise InvalidArgumentError(
            "a profile builder must be callable",
            argument=f"register_profile({name!r}).builder",
            expected="a function returning PatchSpecs",
            found=type(builder).__name__,
            fix="pass a function, e.g. lambda: [PatchSpec(...)]",
        )
    with patching.LOCK:
        if name in REGISTRY.profiles and not replace:
            raise ProfileError(
                f"profile {name!r} is already registered",
                argument=name,
                expected="a new name",
                found=f"registered by {_qualname(REGISTRY.profiles[name].builder)}",
                fix="choose another name, or register_profile(..., replace=True)",
            )
        if name in REGISTRY.installed:
            raise ProfileError(
                f"profile {name!r} is installed; it cannot be replaced while active",
                argument=name,
                expected="an inactive profile",
                found="installed",
                fix=f"uninstall({name!r}) first",
            )
        REGISTRY.profiles[name] = Profile(name, builder, description, on_removed)
        REGISTRY.specs.pop(name, None)


@checked
def unregister_profile(name: str) -> None:
    """Forget a registered profile (uninstall it first: a ProfileError says so).

    >>> from maxtext_compat import shims; shims.register_profile("empty", lambda: [], replace=True)
    >>> shims.unregister_profile("empty"); assert "empty" not in shims.registered_profiles()
    """
    with patching.LOCK:
        _get(name)
        if name in REGISTRY.installed:
            raise ProfileError(
                f"profile {name!r} is installed; it cannot be unregistered while active",
                argument=name,
                expected="an inactive profile",
                found="installed",
                fix=f"uninstall({name!r}) first",
            )
        del REGISTRY.profiles[name]
        REGISTRY.specs.pop(name, None)
        REGISTRY.shims.pop(name, None)  # the shim object that owned it, and its last status
        REGISTRY.statuses.pop(name, None)


def registered_profiles() -> dict[str, str]:
    """Registered profile names and their descriptions.

    >>> from maxtext_compat import shims; assert "vllm-backport" in shims.registered_profiles()  # MaxText's
    """
    with patching.LOCK:
        return {name: p.description for name, p in sorted(REGISTRY.profiles.items())}


@checked
def set_default_profile_chooser(chooser: ProfileChooser | None) -> ProfileChooser | None:
    """Set the hook `install()` uses without a name; returns the previous one.

    The hook gets the resolved matrix row (`maxtext_compat.resolve()`) and returns a
    registered profile name, or None when the installed MaxText needs no shim.

    >>> from maxtext_compat import shims; previous = shims.set_default_profile_chooser(lambda resolution: None)
    >>> assert shims.install() is None; _ = shims.set_default_profile_chooser(previous)  # MaxText's chooser back
    """
    if chooser is not None and not callable(chooser):
        raise InvalidArgumentError(
            "the default-profile chooser must be callable",
            argument="set_default_profile_chooser",
            expected="Callable[[Resolution], str | None] or None",
            found=type(chooser).__name__,
            fix="pass a function of the Resolution",
        )
    with patching.LOCK:
        previous, REGISTRY.chooser = REGISTRY.chooser, chooser
        return previous


def has_default_profile_chooser() -> bool:
    """Whether `install()` without a name can pick a profile (the vLLM plugin asks first).

    >>> from maxtext_compat import shims; assert shims.has_default_profile_chooser()  # the matrix-driven one
    """
    return REGISTRY.chooser is not None


@checked
def default_profile(resolution: Resolution | None = None) -> str | None:
    """The profile the chooser picks for `resolution` (resolved from the install when None).

    >>> import maxtext_compat; from maxtext_compat import shims
    >>> assert shims.default_profile(maxtext_compat.resolve({"maxtext": "0.1.0"})) == "vllm-backport"
    """
    chooser = REGISTRY.chooser
    if chooser is None:
        raise ProfileError(
            "no profile given and no default-profile chooser is set",
            argument="install(profile=None)",
            expected="a profile name, or a chooser set with set_default_profile_chooser()",
            found=f"registered profiles {sorted(REGISTRY.profiles)}",
            fix="pass install(profile=...) with one of the registered profiles",
        )
    if resolution is None:
        from maxtext_compat.resolution.installed import installed_resolution

        found = installed_resolution(probe=True)  # the probe checks the row against the installed source
        found.show(at_call_site=True)  # the user's line, past the API's argument checks
        resolution = found.resolution
    name = chooser(resolution)
    if name is not None and name not in REGISTRY.profiles:
        raise ProfileError(
            f"the default-profile chooser picked unknown profile {name!r}",
            argument=_qualname(chooser),
            expected=f"one of {sorted(REGISTRY.profiles)} or None",
            found=repr(name),
            fix="register the profile before installing, or fix the chooser",
        )
    return name


@checked
def install(
    profile: str | None = None,
    *,
    stack: bool = False,
    resolution: Resolution | None = None,
    convention: str | None = None,
    force: bool = False,
) -> PatchSet | None:
    """Install `profile` (or the chooser's pick) in this process; all of its patches or none.

    A no-op returning the active PatchSet when it is already installed. `stack=True` wraps targets someone else
    already wrapped instead of raising PatchConflictError; `force=True` installs a shim outside its `verified_for`.
    Returns None only when the chooser decided no shim is needed. `convention` declares what this process's code
    expects from MaxText's classes ('legacy', 'kv_return' or 'auto', see convention.callers) until it is removed.

    >>> from maxtext_compat import shims; shims.register_profile("empty", lambda: [], replace=True)
    >>> patch_set = shims.install("empty"); assert shims.install("empty") is patch_set  # idempotent
    >>> assert shims.uninstall("empty") == ["empty"]; shims.unregister_profile("empty")  # patching: see PatchSpec
    """
    decl = REGISTRY.declarations
    if convention is not None:
        if decl is None:
            raise ProfileError(
                "install(convention=...) has no caller-convention owner registered",
                argument="convention",
                expected="MaxText's profiles registered (they own the caller convention)",
                found=f"registered profiles {sorted(REGISTRY.profiles)}",
                fix="install through maxtext_compat.shims (it registers them), or call "
                "maxtext_compat.shims.maxtext_profiles.register() first",
            )
        decl.check(convention, "convention")  # before any patch: all or nothing
    name = profile if profile is not None else default_profile(resolution)
    companion = decl.companion(name) if convention is not None and decl is not None else None
    if companion is not None and companion not in REGISTRY.profiles:
        raise ProfileError(
            f"install(convention={convention!r}) needs profile {companion!r}, which is not registered",
            argument="convention",
            expected=f"profile {companion!r} registered (it puts the call rule into MaxText's own classes)",
            found=f"registered profiles {sorted(REGISTRY.profiles)}",
            fix="register it again (maxtext_compat.shims.maxtext_profiles.register()), or declare the convention "
            "per module with adapters.wrap(module, convention=...)",
        )
    if name is None and companion is None:
        log.info("maxtext-compat: the default-profile chooser selected no shim for this install")
        if convention is not None and decl is not None:
            decl.declare(convention, source="shims.install(convention=)")
        return None
    names = [n for n in (name, companion) if n is not None]
    installed_now: list[str] = []
    sets: dict[str, PatchSet] = {}
    try:
        for n in names:
            was = n in REGISTRY.installed
            got = _install_named(n, stack, force)
            if got is None:  # a shim whose applies() says it does not apply here: its status says why
                continue
            sets[n] = got
            if not was:
                installed_now.append(n)
    except BaseException:
        for n in reversed(installed_now):  # all or nothing: the profile installed before the failure goes too
            uninstall(n, force=True)
        raise
    if names[0] not in sets:
        return None
    with patching.LOCK:
        REGISTRY.explicit.update(sets)  # installed for good: a `with patched()` block leaving does not remove them
    if convention is not None and decl is not None:
        # The declaration lives as long as the profile that carries the rule: the companion when one was
        # needed (without it the declaration reaches nothing), else the profile itself.
        owner = companion if companion is not None else names[0]
        token = decl.declare(convention, source=f"shims.install({name or owner!r}, convention=)")
        REGISTRY.declared_by[:] = [(owner, token)]
        if companion is not None and name is not None and companion in installed_now:
            REGISTRY.companion_of[name] = companion  # uninstalling the profile removes what it brought
    return sets[names[0]]


def _install_named(name: str, stack: bool, force: bool = False) -> PatchSet | None:
    """One door: a profile a `Shim` owns installs through `Shim.install` (its applies(), facts() and
    installed_now() run as when the shim is installed itself); None when its applies() says it does not apply.
    A profile registered over a shim's name (`register_profile(name, ..., replace=True)`) is that builder's, not the
    shim's: it installs as a plain profile."""
    with patching.LOCK:
        owner = REGISTRY.shims.get(name)
        prof = REGISTRY.profiles.get(name)
    if owner is None or prof is None or prof.builder != owner.specs:
        return _install(name, stack)
    status = owner.install(stack=stack, force=force)
    if not status.active:
        log.info("maxtext-compat: shim %r does not apply here: %s", name, status.reason)
        return None
    with patching.LOCK:
        return REGISTRY.installed.get(name)


def install_patch_set(name: str, *, stack: bool = False) -> PatchSet:
    """Install the registered profile `name` as one transaction, for good: the engine's step of `Shim.install`,
    after the shim's own checks (a user installs by name through `install`, which comes back to the shim)."""
    patch_set = _install(name, stack)
    with patching.LOCK:
        REGISTRY.explicit.add(name)
    return patch_set


def set_declarations(declarations: Declarations | None) -> Declarations | None:
    """Set who owns caller conventions for `install(convention=...)`; returns the previous owner."""
    with patching.LOCK:
        previous, REGISTRY.declarations = REGISTRY.declarations, declarations
        return previous


def _install(name: str, stack: bool) -> PatchSet:
    with patching.LOCK:
        existing = REGISTRY.installed.get(name)
        prof = _get(name)
    if existing is not None:
        return existing
    built = _build(prof)
    specs = [s for s in built if isinstance(s, PatchSpec)]
    patching.import_modules(specs)  # outside the lock: imports may run code that installs shims
    with patching.LOCK:
        existing = REGISTRY.installed.get(name)
        if existing is not None:
            return existing
        settings = [s for s in built if isinstance(s, Setting)]
        patch_set = patching.apply(name, specs, stack=stack, settings=settings)
        REGISTRY.installed[name] = patch_set
    traced.note_install(name, tuple(patch_set.targets))
    if log.isEnabledFor(logging.INFO):
        log.info("maxtext-compat: installed profile %r: %s", name, ", ".join(patch_set.targets) or "no targets")
    return patch_set


@checked
def uninstall(profile: str | None = None, *, force: bool = False) -> list[str]:
    """Remove `profile` (every active profile, newest first, when None); returns what was removed.

    Idempotent: a registered profile that is not installed is a no-op. Every profile is
    checked before any is removed; if another patcher replaced our wrappers this raises
    PatchConflictError and changes nothing, unless `force=True` puts the originals back.

    >>> from maxtext_compat import shims; assert shims.uninstall("vllm-backport") == []  # not installed here: a no-op
    """
    with patching.LOCK:
        if profile is None:
            names = list(reversed(REGISTRY.installed))
        else:
            _get(profile)
            names = [profile] if profile in REGISTRY.installed else []
        held = {n: REGISTRY.holders[n] for n in names if REGISTRY.holders.get(n)}
        if held and not force:
            raise ProfileError(
                f"cannot uninstall {sorted(held)}: `with patched()` blocks still run with it",
                argument=", ".join(sorted(held)),
                expected="no active `with shims.patched(...)` block (in any thread)",
                found=", ".join(f"{n}: {k} block(s)" for n, k in sorted(held.items())),
                fix="let the blocks finish (the last one out removes a profile nobody installed for good), "
                "or uninstall(force=True) to remove it under them",
            )
        if not force and len(names) > 1:  # remove() checks a single profile itself
            for name in names:
                patching.check_removable(REGISTRY.installed[name])
        removed_hooks = []
        for name in names:
            patching.remove(REGISTRY.installed[name], force=force)
            del REGISTRY.installed[name]
            REGISTRY.explicit.discard(name)
            traced.note_uninstall(name)
            hook = REGISTRY.profiles[name].on_removed if name in REGISTRY.profiles else None
            if hook is not None:
                removed_hooks.append(hook)
        if REGISTRY.declared_by and REGISTRY.declared_by[0][0] in names:
            _forget_declaration(REGISTRY.declared_by.pop()[1])
        brought = [REGISTRY.companion_of.pop(n) for n in names if n in REGISTRY.companion_of]
    for hook in removed_hooks:  # outside the lock: a shim's own bookkeeping (its kernel hook, its statuses)
        hook()
    if names:
        log.info("maxtext-compat: uninstalled profile(s) %s", names)
    for extra in brought:
        if extra not in names:
            names += uninstall(extra, force=force)
    return names


def _forget_declaration(token: object) -> None:
    """Uninstalling the profile that carries a declared caller convention removes the declaration
    (unless something declared another one since: the owner compares tokens)."""
    decl = REGISTRY.declarations
    if decl is not None:
        decl.forget(token)


@checked
def installed(profile: str | None = None) -> bool:
    """Whether `profile` (any profile when None) is installed in this process.

    >>> from maxtext_compat import shims; assert not shims.installed("vllm-backport")  # not installed here
    """
    with patching.LOCK:
        return bool(REGISTRY.installed) if profile is None else profile in REGISTRY.installed


def active_profiles() -> list[str]:
    """Installed profiles, oldest first.

    >>> from maxtext_compat import shims; shims.register_profile("empty", lambda: [], replace=True)
    >>> with shims.patched("empty"): assert shims.active_profiles()[-1] == "empty"
    >>> shims.unregister_profile("empty")
    """
    with patching.LOCK:
        return list(REGISTRY.installed)


@checked
def verify(profile: str | None = None) -> dict[str, list[str]]:
    """Per installed profile, the locations whose wrapper someone else removed or replaced.

    >>> from maxtext_compat import shims; shims.register_profile("empty", lambda: [], replace=True)
    >>> with shims.patched("empty"): assert shims.verify("empty") == {"empty": []}  # nothing drifted
    >>> shims.unregister_profile("empty")
    """
    with patching.LOCK:
        names = list(REGISTRY.installed) if profile is None else [n for n in REGISTRY.installed if n == profile]
        return {name: patching.drift(REGISTRY.installed[name]) for name in names}


@contextmanager
@checked
def patched(
    profile: str | None = None, *, stack: bool = False, force: bool = False, resolution: Resolution | None = None
) -> Iterator[PatchSet | None]:
    """Install for the duration of a `with` block, even when the block raises.

    The blocks of every thread share one count per profile: the profile stays installed while any
    block runs, and the last block out removes it unless `install()` installed it for good (before
    or during the blocks), so nested blocks, threads and plugin-installed shims are safe.

    >>> from maxtext_compat import shims; shims.register_profile("empty", lambda: [], replace=True)
    >>> with shims.patched("empty"): assert shims.installed("empty")
    >>> assert not shims.installed("empty"); shims.unregister_profile("empty")
    """
    name = profile if profile is not None else default_profile(resolution)
    if name is None:
        yield None
        return
    with patching.LOCK:
        REGISTRY.holders[name] = REGISTRY.holders.get(name, 0) + 1
    try:
        patch_set = _install(name, stack)
    except BaseException:
        _release(name, force)
        raise
    try:
        yield patch_set
    finally:
        _release(name, force)


def _release(name: str, force: bool) -> None:
    with patching.LOCK:
        REGISTRY.holders[name] -= 1
        if REGISTRY.holders[name]:
            return
        del REGISTRY.holders[name]
        if name in REGISTRY.installed and name not in REGISTRY.explicit:
            uninstall(name, force=force)


def _get(name: str) -> Profile:
    prof = REGISTRY.profiles.get(name)
    if prof is None:
        raise ProfileError(
            f"unknown shim profile {name!r}",
            argument=name,
            expected=f"one of {sorted(REGISTRY.profiles)}",
            found=repr(name),
            fix="register it with register_profile(), or check the spelling",
        )
    return prof


def _build(prof: Profile) -> tuple[PatchSpec | Setting, ...]:
    """The profile's specs, built once per registration (the profile is fixed for the process)."""
    cached = REGISTRY.specs.get(prof.name)
    if cached is not None and REGISTRY.profiles.get(prof.name) is prof:
        return cached
    try:
        specs = tuple(prof.builder())
    except CompatError:
        raise  # already typed, naming its argument and fix (e.g. a sampler the CPU shim cannot rebuild)
    except Exception as exc:
        raise ProfileError(
            f"building profile {prof.name!r} failed",
            argument=prof.name,
            expected="the builder returns PatchSpecs and Settings",
            found=f"{type(exc).__name__}: {exc}",
            fix=f"fix {_qualname(prof.builder)}",
        ) from exc
    wrong = [s for s in specs if not isinstance(s, PatchSpec | Setting)]
    if wrong:
        raise ProfileError(
            f"profile {prof.name!r} built something other than PatchSpecs and Settings",
            argument=prof.name,
            expected="PatchSpec or Setting instances",
            found=", ".join(type(s).__name__ for s in wrong),
            fix=f"make {_qualname(prof.builder)} return PatchSpec(...) and Setting(...) objects",
        )
    with patching.LOCK:
        if REGISTRY.profiles.get(prof.name) is prof:
            REGISTRY.specs[prof.name] = specs
    return specs


def _qualname(obj: object) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"
