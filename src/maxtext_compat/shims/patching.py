"""The patching core every shim uses: resolve, check, swap and restore a set of targets, all or nothing.

Why not `wrapt.wrap_function_wrapper` alone: a shim must be idempotent, atomic over many
targets, exactly reversible (including `from x import f` aliases held elsewhere), must refuse
to silently wrap a target someone else already patched, and must advertise the parameters
it adds (tpu-inference validates models with `inspect.signature`). wrapt supplies the
wrapper objects (`FunctionWrapper`, `with_signature`); this module supplies the transaction.

Rules:
- Targets are `"module.path:function"` or `"module.path:Class.attr"`; class attributes are
  read from the class dicts along the MRO (like `wrapt.resolve_path`), so the saved original
  is the raw descriptor (function, staticmethod, classmethod) and restore is exact. Patching
  an inherited attribute creates a slot on the named class; restore deletes that slot.
- Install resolves and checks every target first, then swaps all under `LOCK`; a failing
  write rolls back every earlier write. Uninstall checks every location first, then restores.
- Our own wrappers may be stacked (several profiles on one target) and removed in any
  order: a layer with others on top is spliced out beneath them. A wrapper we did not
  install is a `PatchConflictError` unless `stack=True`.
- A marker `__maxtext_compat_patches__` (attribute -> profiles, innermost first) is kept on
  every patched module or class, ddtrace style: visible to anyone, and inherited by `fork`.
- Target modules are imported (`import_modules`) before the lock is taken; resolution under
  the lock only reads sys.modules.
- Re-installing the same spec over the same original reuses its wrappers, so a factory runs
  once per (spec, original, profile) and an install/uninstall cycle stays ~20 us per target.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import os
import sys
import threading
import types
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import wrapt

from maxtext_compat.errors import InvalidArgumentError, PatchConflictError, PatchError, PatchTargetError
from maxtext_compat.shims import registry
from maxtext_compat.shims.registry import ActivePatch

__all__ = [
    "LOCK",
    "MARKER",
    "Original",
    "PatchSet",
    "PatchSpec",
    "add_keyword_params",
    "apply",
    "check_removable",
    "drift",
    "import_modules",
    "remove",
]

# One lock for every check-and-swap in the process (profiles.py takes it too, re-entrantly).
LOCK = threading.RLock()
MARKER = "__maxtext_compat_patches__"
_OWN_PACKAGE = "maxtext_compat"
_MAX_CHAIN = 64

WrapperFunction = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]
WrapperFactory = Callable[["Original"], WrapperFunction]
SignatureSource = inspect.Signature | Callable[[Callable[..., Any]], inspect.Signature]


class _Missing:
    def __repr__(self) -> str:
        return "<absent>"


_ABSENT: Any = _Missing()  # "no entry in this __dict__": restoring it means deleting the slot


@dataclass(frozen=True)
class PatchSpec:
    """One target of a profile and how to wrap it.

    factory: called at install with the resolved `Original`; returns a wrapt-style wrapper
        `wrapper(wrapped, instance, args, kwargs)`. A factory (not a bare wrapper) lets a shim
        look at the installed original, e.g. whether it already accepts `kv_cache`.
    signature: what `inspect.signature` shows for the patched callable: an `inspect.Signature`
        or a function of the original callable returning one (see `add_keyword_params`).
        None keeps the original's signature.
    aliases: module names whose globals are swept for other references to the original
        (`from x import f`); "pkg" covers pkg and pkg.*, "*" covers every module. None means
        the target's top-level package for module functions and nothing for class attributes
        (a class-dict patch is already seen through every alias of the class).
    origin: what `doctor` shows as the replacement; defaults to the factory's dotted name.
    """

    target: str
    factory: WrapperFactory
    signature: SignatureSource | None = None
    aliases: tuple[str, ...] | None = None
    origin: str | None = None

    def __post_init__(self) -> None:
        _parse_target(self.target)
        if not callable(self.factory):
            raise InvalidArgumentError(
                "PatchSpec.factory must be callable",
                argument=f"PatchSpec({self.target!r}).factory",
                expected="a function taking an Original and returning wrapper(wrapped, instance, args, kwargs)",
                found=type(self.factory).__name__,
                fix="pass the wrapper factory function",
            )
        if self.signature is not None and not (
            isinstance(self.signature, inspect.Signature) or callable(self.signature)
        ):
            raise InvalidArgumentError(
                "PatchSpec.signature must be an inspect.Signature or a callable returning one",
                argument=f"PatchSpec({self.target!r}).signature",
                expected="inspect.Signature | Callable[[original], inspect.Signature] | None",
                found=type(self.signature).__name__,
                fix="use add_keyword_params(...) or inspect.signature(prototype)",
            )
        if self.aliases is not None and not isinstance(self.aliases, str):
            object.__setattr__(self, "aliases", tuple(self.aliases))  # lists welcome; kept hashable
        if self.aliases is not None and (
            isinstance(self.aliases, str) or not all(isinstance(a, str) and a for a in self.aliases)
        ):
            raise InvalidArgumentError(
                "PatchSpec.aliases must be a tuple of module names",
                argument=f"PatchSpec({self.target!r}).aliases",
                expected='a tuple such as ("maxtext", "tpu_inference.models") or ("*",)',
                found=repr(self.aliases),
                fix="wrap a single module name in a tuple",
            )

    @property
    def module(self) -> str:
        return _parse_target(self.target)[0]

    def describe_origin(self) -> str:
        if self.origin:
            return self.origin
        mod = getattr(self.factory, "__module__", None) or "?"
        name = getattr(self.factory, "__qualname__", None) or type(self.factory).__qualname__
        return f"{mod}.{name}"


class Original(NamedTuple):
    """What a factory gets: the resolved target before patching (immutable)."""

    target: str
    profile: str
    owner: Any  # the module or class the patch is written to
    attribute: str
    raw: Any  # the raw dict entry: function, staticmethod, classmethod, or a wrapper beneath us
    function: Callable[..., Any]  # raw without its staticmethod/classmethod descriptor
    kind: str  # function | method | staticmethod | classmethod | callable
    defined_in: Any  # the module or class whose __dict__ holds raw (differs from owner when inherited)


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


_PID = [os.getpid()]  # refreshed after fork; os.getpid() per record is a syscall

# id(installed object) -> layer, for every layer installed by this copy of the library.
_OURS: dict[int, _Layer] = {}


# ---------------------------------------------------------------------------------------------
# signatures


_SIG_CACHE: dict[tuple[int, tuple[str, ...], int], tuple[Any, inspect.Signature]] = {}
_SIG_CACHE_MAX = 512


def add_keyword_params(*names: str, default: Any = None) -> Callable[[Callable[..., Any]], inspect.Signature]:
    """A signature source that adds keyword-only parameters the original lacks.

    Why: vLLM's `supports_kw` and tpu-inference's `_validate_model_interface` read
    `inspect.signature`; a wrapper that accepts `kv_cache` must also show it. Parameters
    go before `**kwargs` when there is one; names already present are left as they are.
    """
    for n in names:
        if not n.isidentifier():
            raise InvalidArgumentError(
                "add_keyword_params needs parameter names",
                argument="add_keyword_params",
                expected="identifiers such as 'kv_cache'",
                found=repr(n),
                fix="pass valid Python identifiers",
            )

    def source(fn: Callable[..., Any]) -> inspect.Signature:
        key = (id(fn), names, id(default))
        hit = _SIG_CACHE.get(key)
        if hit is not None and hit[0] is fn:
            return hit[1]
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        var_kw = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
        rest = [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]
        added = [
            inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=default)
            for n in names
            if n not in sig.parameters
        ]
        result = sig.replace(parameters=rest + added + var_kw)
        if len(_SIG_CACHE) >= _SIG_CACHE_MAX:
            _SIG_CACHE.clear()
        _SIG_CACHE[key] = (fn, result)  # holds fn, so its id cannot be reused while cached
        return result

    source.__qualname__ = f"add_keyword_params{names}"
    return source


# ---------------------------------------------------------------------------------------------
# resolution


@functools.lru_cache(maxsize=1024)
def _parse_target(target: str) -> tuple[str, tuple[str, ...]]:
    module, sep, path = target.partition(":") if isinstance(target, str) else ("", "", "")
    parts = tuple(path.split(".")) if path else ()
    if not sep or not module or not parts or not all(p.isidentifier() for p in (*module.split("."), *parts)):
        raise InvalidArgumentError(
            "a patch target must name a module and an attribute",
            argument="PatchSpec.target",
            expected='"module.path:function" or "module.path:Class.attribute"',
            found=repr(target),
            fix="separate the module from the attribute path with one ':'",
        )
    return module, parts


def import_modules(specs: Iterable[PatchSpec]) -> None:
    """Import every target module. Call it before taking `LOCK`: an import may run code
    that installs shims itself, and holding our lock across an import could deadlock."""
    for name in dict.fromkeys(spec.module for spec in specs):
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise PatchTargetError(
                f"cannot import module {name!r} to patch it",
                argument=name,
                expected="an importable module",
                found=f"{type(exc).__name__}: {exc}",
                fix="install the package that provides it, or use the profile for the installed release "
                "(`maxtext-compat doctor` shows which)",
            ) from exc


def _dict_of(obj: Any, target: str) -> Any:
    try:
        return vars(obj)
    except Exception as exc:
        raise PatchTargetError(
            f"cannot read the attributes of {obj!r} while resolving {target}",
            argument=target,
            expected="a module or class with a __dict__",
            found=f"{type(exc).__name__}: {exc}",
            fix="point the target at the module or class that defines the attribute",
        ) from exc


def _lookup(obj: Any, name: str, target: str) -> tuple[Any, Any]:
    """(raw value, the module/class whose dict holds it), walking the MRO for classes."""
    try:
        holders = obj.__mro__ if isinstance(obj, type) else (obj,)
        for holder in holders:
            d = holder.__dict__
            if name in d:
                return d[name], holder
    except Exception as exc:
        raise PatchTargetError(
            f"reading {name!r} from {_name_of(obj)} raised while resolving {target}",
            argument=target,
            expected=f"attribute {name!r} readable from the class/module __dict__",
            found=f"{type(exc).__name__}: {exc}",
            fix="the installed release is not the one this profile was written for; pick the matching profile",
        ) from exc
    known = sorted({k for h in holders for k in _dict_of(h, target) if isinstance(k, str)})
    close = difflib.get_close_matches(name, known, n=3)
    dynamic = any("__getattr__" in _dict_of(h, target) for h in holders if h is not object)
    found = f"no {name!r} in the dict of {_name_of(obj)}" + (" or its bases" if isinstance(obj, type) else "")
    if close:
        found += f"; similar names: {close}"
    if dynamic:
        found += "; it may be served by __getattr__, which has no slot to patch"
    raise PatchTargetError(
        f"cannot find the patch target {target}",
        argument=target,
        expected=f"attribute {name!r} defined on {_name_of(obj)}",
        found=found,
        fix="the installed release moved or renamed it: update the profile's target, "
        "or use the profile for the installed release (`maxtext-compat doctor`)",
    )


def _resolve(spec: PatchSpec, profile: str) -> Original:
    module_name, path = _parse_target(spec.target)
    module = sys.modules.get(module_name)
    if module is None:
        raise PatchTargetError(
            f"module {module_name!r} of {spec.target} is not imported",
            argument=spec.target,
            expected=f"{module_name!r} in sys.modules",
            found="absent (it was never imported, or was removed during install)",
            fix="install through maxtext_compat.shims.install(), which imports targets first, "
            "or call patching.import_modules(specs) before patching.apply()",
        )
    owner: Any = module
    for part in path[:-1]:
        owner, _ = _lookup(owner, part, spec.target)
        if not isinstance(owner, (type, types.ModuleType)):
            raise PatchTargetError(
                f"{spec.target}: {part!r} is not a class or module",
                argument=spec.target,
                expected="a dotted path through modules and classes",
                found=type(owner).__name__,
                fix="patch the class that defines the method instead of an instance",
            )
    attribute = path[-1]
    raw, defined_in = _lookup(owner, attribute, spec.target)
    kind, function = _kind(raw, owner)
    if kind is None:
        raise PatchTargetError(
            f"{spec.target} is not a function or method",
            argument=spec.target,
            expected="a function, method, staticmethod, classmethod or callable",
            found=f"{type(raw).__name__} {_describe(raw)}",
            fix="only callables can be wrapped; patch the callable that uses this value",
        )
    return Original(spec.target, profile, owner, attribute, raw, function, kind, defined_in)


def _kind(raw: Any, owner: Any) -> tuple[str | None, Any]:
    if isinstance(raw, staticmethod):
        return "staticmethod", raw.__func__
    if isinstance(raw, classmethod):
        return "classmethod", raw.__func__
    if not callable(raw):
        return None, raw
    if isinstance(owner, types.ModuleType):
        return "function", raw
    return ("method" if inspect.isfunction(raw) else "callable"), raw


# ---------------------------------------------------------------------------------------------
# conflicts


def _is_proxy(obj: Any) -> bool:
    return issubclass(type(obj), wrapt.BaseObjectProxy)


def _home_module(holder: Any) -> str | None:
    if isinstance(holder, types.ModuleType):
        return holder.__name__
    mod = vars(holder).get("__module__") if isinstance(holder, type) else None
    return mod if isinstance(mod, str) else None


def _foreign(original: Original) -> str | None:
    """Describe the wrapper someone else put at the target, or None if it looks original (or is ours).

    Detected: a wrapt proxy we did not install; a Python function (or `__wrapped__`-carrying
    wrapper) whose `__module__` is not the module that owns the slot, i.e. defined elsewhere
    and assigned here (a plain re-export, `from a import f`, is not a patch); a marker saying
    maxtext-compat patched it when this copy did not.
    Not detectable: wrappers that copy `__module__` with functools.wraps (like Flax's own).
    """
    raw = original.raw
    layer = _OURS.get(id(raw))
    if layer is not None and layer.wrapper is raw:
        return None
    fn = original.function
    for obj in (raw, fn):
        if _is_proxy(obj):
            kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
            return f"{kind} (a wrapt wrapper) around {_describe(obj.__wrapped__)}"
    marker = _read(original.owner, MARKER)
    if isinstance(marker, dict) and original.attribute in marker:
        return (
            f"{_describe(raw)}, which maxtext-compat's marker lists as patched by {list(marker[original.attribute])} "
            "although this copy of maxtext-compat did not install it (imported twice, reloaded, or replaced since)"
        )
    home = _home_module(original.defined_in)
    defined = getattr(fn, "__module__", None) if inspect.isfunction(fn) or _has_wrapped(fn) else None
    if home is not None and isinstance(defined, str) and defined != home and not _reexported(fn, original):
        return f"{_describe(fn)}, defined in {defined!r} rather than {home!r}"
    return None


def _reexported(fn: Any, original: Original) -> bool:
    """`from a import f` in the target module: f is still a's own f under the same name, not a patch."""
    home = sys.modules.get(getattr(fn, "__module__", None) or "")
    name = getattr(fn, "__qualname__", None)
    return (
        isinstance(original.owner, types.ModuleType)
        and name == original.attribute
        and home is not None
        and _read(home, name) is original.raw
    )


def _has_wrapped(obj: Any) -> bool:
    try:
        return hasattr(obj, "__wrapped__")
    except Exception:  # an exotic __getattr__: it is not a functools-style wrapper we can judge
        return False


# ---------------------------------------------------------------------------------------------
# aliases


def _scope(spec: PatchSpec, original: Original) -> tuple[str, ...]:
    if spec.aliases is not None:
        return spec.aliases
    if isinstance(original.owner, types.ModuleType):
        return (spec.module.split(".")[0],)
    return ()


# scope -> (sys.modules keys when scanned, the in-scope (name, module) pairs found then)
_SCOPE_CACHE: dict[tuple[str, ...], tuple[frozenset[str], list[tuple[str, Any]]]] = {}


def _modules_in(scope: tuple[str, ...]) -> list[Any]:
    """Distinct module objects whose sys.modules name is in `scope` (ours excluded).

    Why the cache: scanning every name costs ~0.1 ms per 1000 modules and install runs it
    per module-level target; comparing the key set (in C) is ~10x cheaper. A hit needs the
    same names and the same module objects under the in-scope names, so it is exact.
    """
    modules = sys.modules
    hit = _SCOPE_CACHE.get(scope)
    if hit is not None and modules.keys() == hit[0] and all(modules.get(n) is m for n, m in hit[1]):
        named = hit[1]
    else:
        keys = frozenset(modules)
        if "*" in scope:
            named = list(modules.items())
        else:
            prefixes = tuple(e + "." for e in scope)
            named = [(n, m) for n, m in list(modules.items()) if n in scope or n.startswith(prefixes)]
        own = _OWN_PACKAGE + "."
        named = [(n, m) for n, m in named if m is not None and n != _OWN_PACKAGE and not n.startswith(own)]
        if len(_SCOPE_CACHE) > 64:
            _SCOPE_CACHE.clear()
        _SCOPE_CACHE[scope] = (keys, named)
    out: dict[int, Any] = {}
    for _, mod in named:
        out.setdefault(id(mod), mod)  # one module may sit under two names
    return list(out.values())


def _sweep(spec: PatchSpec, original: Original) -> list[tuple[Any, str]]:
    """Module globals (in scope) that hold the original by identity, except the target slot itself."""
    scope = _scope(spec, original)
    if not scope:
        return []
    raw = original.raw
    found: list[tuple[Any, str]] = []
    for mod in _modules_in(scope):
        try:
            items = list(vars(mod).items())
        except Exception:
            continue
        found.extend(
            (mod, key)
            for key, value in items
            if value is raw and not (mod is original.owner and key == original.attribute)
        )
    return found


# ---------------------------------------------------------------------------------------------
# writes (the only code that mutates targets)


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


# ---------------------------------------------------------------------------------------------
# install / uninstall


def apply(profile: str, specs: Sequence[PatchSpec], *, stack: bool = False) -> PatchSet:
    """Patch every target of `specs` for `profile`, or none of them.

    Modules must already be imported (`import_modules`). `stack=True` wraps targets that
    someone else already wrapped (their object is restored on removal); without it that is
    a `PatchConflictError`. Targets patched by another of our profiles are always stacked.
    """
    with LOCK:
        planned = [(spec, _resolve(spec, profile)) for spec in specs]
        if not stack:
            _check_conflicts(planned)
        layers = [_build_layer(spec, original, profile) for spec, original in planned]
        writes: list[_Write] = []
        markers = _Markers()
        slots: dict[tuple[int, str], _Layer] = {}
        for layer in layers:
            for obj, name, _created in layer.locations():
                other = slots.setdefault((id(obj), name), layer)
                if other is not layer:
                    _raise_same_slot(profile, other, layer, obj, name)
                writes.append(_Write(obj, name, layer.wrapper, _read(obj, name)))
            markers.add(layer.owner, layer.attribute, profile)
        writes.extend(markers.writes())
        _commit(writes, f"installing profile {profile!r}")
        for layer in layers:
            _OURS[id(layer.wrapper)] = layer
        registry.record_many([layer.record() for layer in layers])
        return PatchSet(profile, _PID[0], tuple(layers))


def _raise_same_slot(profile: str, first: _Layer, second: _Layer, obj: Any, name: str) -> None:
    twice = first.owner is second.owner and first.attribute == second.attribute
    raise PatchError(
        f"profile {profile!r} patches {second.target} twice" if twice else
        f"two targets of profile {profile!r} write the same slot {_label(obj, name)}",
        argument=profile,
        expected="each module/class slot patched once per profile",
        found=f"{first.target} and {second.target}" + ("" if twice else " (an alias sweep reaches the other)"),
        fix="merge the wrappers into one spec or put them in two profiles (they stack), or narrow `aliases`",
    )  # fmt: skip


def _check_conflicts(planned: list[tuple[PatchSpec, Original]]) -> None:
    for spec, original in planned:
        foreign = _foreign(original)
        if foreign is not None:
            raise PatchConflictError(
                f"{spec.target} is already wrapped or replaced by someone else",
                argument=spec.target,
                expected=f"the original defined in {_home_module(original.defined_in)!r}, or a maxtext-compat layer",
                found=foreign,
                fix="remove the other patch first, or install(..., stack=True) to wrap on top of it "
                "(uninstall then restores the other patcher's object)",
            )


class _ShimBoundWrapper(wrapt.BoundFunctionWrapper):
    """Bound form of our wrapper whose `__func__` is the patched function, not the original.

    Why: Flax Linen's `Module.apply()` (and `init`) unbinds `module.__call__` through `__func__`
    and calls the result with the module; wrapt's default `__func__` proxies to the original's,
    which would silently bypass the patch on exactly the path Linen users take.
    """

    @property
    def __func__(self) -> Any:
        return self._self_parent


class _ShimWrapper(wrapt.FunctionWrapper):
    """Our FunctionWrapper type, so tracebacks and `repr` say who wrapped the target."""

    __bound_function_wrapper__ = _ShimBoundWrapper


try:  # wrapt >= 2.2: a signature override whose bound form keeps the patch on Linen's unbind path too
    from wrapt.signature import (
        _NO_DOC_OVERRIDE,
        _BoundSignatureFunctionWrapper,
        _SignatureFunctionSurrogate,
        _SignatureFunctionWrapper,
    )

    class _ShimBoundSignatureWrapper(_BoundSignatureFunctionWrapper):
        @property
        def __func__(self) -> Any:
            parent = self._self_parent
            return _SignatureFunctionSurrogate(parent, parent._self_signature)

    class _ShimSignatureWrapper(_SignatureFunctionWrapper):
        __bound_function_wrapper__ = _ShimBoundSignatureWrapper

    def _with_signature(shim: Any, sig: inspect.Signature) -> Any:
        def passthrough(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            return wrapped(*args, **kwargs)

        return _ShimSignatureWrapper(shim, passthrough, sig, _NO_DOC_OVERRIDE)

except ImportError:  # pragma: no cover - a wrapt without the private classes: plain with_signature

    def _with_signature(shim: Any, sig: inspect.Signature) -> Any:
        return wrapt.with_signature(shim, signature=sig)


# (id(spec), id(raw original), profile) -> (spec, raw, shim, wrapper). Why: re-installing the same
# profile over the same original (patched() blocks, 10,000-cycle stress runs) reuses its wrappers
# instead of rebuilding them; so a factory runs once per (spec, original, profile).
_BUILT: dict[tuple[int, int, str], tuple[PatchSpec, Any, Any, Any]] = {}
_BUILT_MAX = 256


def _wrappers(spec: PatchSpec, original: Original, profile: str) -> tuple[Any, Any]:
    hit = _BUILT.get((id(spec), id(original.raw), profile))
    if (
        hit is not None
        and hit[0] is spec
        and hit[1] is original.raw
        and hit[2].__wrapped__ is original.raw  # never spliced onto another original since
        and id(hit[3]) not in _OURS  # not installed right now
    ):
        return hit[2], hit[3]
    try:
        wrapper_fn = spec.factory(original)
    except Exception as exc:
        raise PatchError(
            f"the wrapper factory of {spec.target} (profile {profile!r}) raised",
            argument=spec.target,
            expected="a wrapper function wrapper(wrapped, instance, args, kwargs)",
            found=f"{type(exc).__name__}: {exc}",
            fix=f"fix {spec.describe_origin()}",
        ) from exc
    if not callable(wrapper_fn):
        raise PatchError(
            f"the wrapper factory of {spec.target} returned a non-callable",
            argument=spec.target,
            expected="a wrapper function wrapper(wrapped, instance, args, kwargs)",
            found=type(wrapper_fn).__name__,
            fix=f"make {spec.describe_origin()} return the wrapper",
        )
    shim = _ShimWrapper(original.raw, wrapper_fn)
    wrapper: Any = shim
    if spec.signature is not None:
        wrapper = _with_signature(shim, _signature(spec, original))
    if len(_BUILT) >= _BUILT_MAX:
        _BUILT.clear()
    _BUILT[(id(spec), id(original.raw), profile)] = (spec, original.raw, shim, wrapper)
    return shim, wrapper


def _build_layer(spec: PatchSpec, original: Original, profile: str) -> _Layer:
    shim, wrapper = _wrappers(spec, original, profile)
    below = _OURS.get(id(original.raw))
    if below is not None and below.wrapper is original.raw:
        stacked_on = f"profile {below.profile}"
    elif _is_proxy(original.raw):
        stacked_on = f"foreign {type(original.raw).__qualname__}"
    else:
        stacked_on = ""
    return _Layer(
        profile=profile,
        target=spec.target,
        origin=spec.describe_origin(),
        owner=original.owner,
        attribute=original.attribute,
        created=original.owner is not original.defined_in,
        original=original.raw,
        shim=shim,
        wrapper=wrapper,
        aliases=_sweep(spec, original),
        stacked_on=stacked_on,
    )


def _signature(spec: PatchSpec, original: Original) -> inspect.Signature:
    source = spec.signature
    if isinstance(source, inspect.Signature):
        return source
    assert source is not None
    try:
        sig = source(original.function)
    except Exception as exc:
        raise PatchError(
            f"the signature source of {spec.target} raised",
            argument=spec.target,
            expected="an inspect.Signature",
            found=f"{type(exc).__name__}: {exc}",
            fix="fix the PatchSpec.signature callable",
        ) from exc
    if not isinstance(sig, inspect.Signature):
        raise PatchError(
            f"the signature source of {spec.target} returned {type(sig).__name__}",
            argument=spec.target,
            expected="an inspect.Signature",
            found=repr(sig),
            fix="return inspect.Signature (e.g. via add_keyword_params)",
        )
    return sig


@dataclass(slots=True)
class _Removal:
    layers: list[_Layer]
    writes: list[_Write]
    problems: list[str]
    fixups: list[tuple[_Layer, _Layer]]  # (layer stacked on a removed one, the removed one)


def _plan_removal(patch_set: PatchSet, *, force: bool) -> _Removal:
    layers = [layer for layer in patch_set._layers if _OURS.get(id(layer.wrapper)) is layer]
    plan = _Removal(layers, [], [], [])
    markers = _Markers()
    spliced: set[int] = set()
    removed = {id(layer.wrapper) for layer in layers}
    for above in _OURS.values():  # our layers wrapping a removed one: splice it out beneath them
        if id(above.original) in removed and id(above.wrapper) not in removed:
            layer = _OURS[id(above.original)]
            plan.writes.append(_Write(above.shim, "__wrapped__", layer.original, layer.wrapper))
            spliced.add(id(above.shim))
            plan.fixups.append((above, layer))
    for layer in reversed(layers):
        for obj, name, created in layer.locations():
            current = _read(obj, name)
            restored = _ABSENT if created else layer.original
            if current is layer.wrapper:
                plan.writes.append(_Write(obj, name, restored, current))
                continue
            proxy = _proxy_above(current, layer.wrapper)
            if proxy is not None:
                if id(proxy) not in spliced:
                    spliced.add(id(proxy))
                    plan.writes.append(_Write(proxy, "__wrapped__", layer.original, layer.wrapper))
            elif force:
                if not (current is _ABSENT and restored is _ABSENT):
                    plan.writes.append(_Write(obj, name, restored, current))
            else:
                where = _label(obj, name)
                plan.problems.append(f"{where} holds {_describe(current)} instead of the {layer.profile!r} wrapper")
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
    """Restore every location of `patch_set`, or none of them.

    A location that holds our wrapper gets the original back (or loses the slot we created);
    a location where a wrapt wrapper sits on top of ours is spliced (ours removed beneath
    it); anything else means someone replaced our patch: `PatchConflictError`, unless
    `force=True`, which puts the original back regardless. Removing twice is a no-op.
    """
    with LOCK:
        plan = _plan_removal(patch_set, force=force)
        _raise_problems(patch_set, plan.problems)
        _commit(plan.writes, f"uninstalling profile {patch_set.profile!r}")
        for above, layer in plan.fixups:
            above.original = layer.original
            above.stacked_on = layer.stacked_on
            if above.owner is layer.owner and above.attribute == layer.attribute:
                above.created = layer.created
            registry.record(above.record())
        for layer in plan.layers:
            del _OURS[id(layer.wrapper)]
        registry.forget_many([(layer.target, layer.profile) for layer in plan.layers])


def _proxy_above(current: Any, wrapper: Any) -> Any:
    """The wrapt proxy whose __wrapped__ is `wrapper`, following only wrapt proxies from `current`."""
    obj = current
    for _ in range(_MAX_CHAIN):
        if not _is_proxy(obj):
            return None
        inner = obj.__wrapped__
        if inner is wrapper:
            return obj
        obj = inner
    return None


# ---------------------------------------------------------------------------------------------
# descriptions for error messages


def _label(obj: Any, name: str) -> str:
    """'module:attr', 'module:Class.attr', or the wrapper whose __wrapped__ is meant (for messages)."""
    if isinstance(obj, types.ModuleType):
        return f"{obj.__name__}:{name}"
    if isinstance(obj, type):
        return f"{obj.__module__}:{obj.__qualname__}.{name}"
    layer = next((la for la in _OURS.values() if la.shim is obj), None)
    if layer is not None:
        return f"the {layer.profile!r} layer of {layer.target}"
    return f"{type(obj).__qualname__} wrapper ({name})"


def _name_of(obj: Any) -> str:
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}"
    return repr(obj)


def _describe(obj: Any) -> str:
    if obj is _ABSENT:
        return "nothing (the attribute was deleted)"
    if _is_proxy(obj):
        layer = _OURS.get(id(obj))
        if layer is not None and layer.wrapper is obj:
            return f"the maxtext-compat wrapper of profile {layer.profile!r}"
        try:
            inner = _describe(obj.__wrapped__)
        except Exception:  # a broken proxy: say so instead of failing the error message
            inner = "?"
        return f"{type(obj).__qualname__}({inner})"
    if isinstance(obj, (staticmethod, classmethod)):
        return f"{type(obj).__name__}({_describe(obj.__func__)})"
    mod = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None)
    if isinstance(mod, str) and isinstance(name, str):
        return f"{mod}.{name}"
    text = repr(obj)
    return text if len(text) <= 80 else text[:77] + "..."


# A fork while another thread is inside a check-and-swap would leave the child's lock held
# forever; taking it around fork makes the child inherit a consistent, unlocked state.
def _after_fork_in_child() -> None:
    _PID[0] = os.getpid()
    LOCK.release()


os.register_at_fork(before=LOCK.acquire, after_in_parent=LOCK.release, after_in_child=_after_fork_in_child)
