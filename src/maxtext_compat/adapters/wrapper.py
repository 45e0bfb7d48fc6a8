"""`wrap()`: MaxText modules that accept both call conventions on every release.

Why subclasses: an adapted class is a subclass of the MaxText class, so an adapter is usable
wherever the module is (isinstance checks, `nnx.split`/`merge`/`state`, `nnx.jit`, as a
submodule, Linen `init`/`apply`), its parameter tree is the module's own, and wrapping an
instance shares the instance's parameters instead of copying them. Only `__call__` changes:
it translates the arguments (see translate.py), runs the native call by keyword, and returns
the convention the caller used (see returns.py). On a release without the vLLM path
(0.1.0) a new call runs through the backport (see maxtext_compat.backport and write_path).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from maxtext_compat.contract import checked
from maxtext_compat.convention import callers
from maxtext_compat.convention.kinds import CLASS_KINDS, kind_named
from maxtext_compat.convention.rule import CallSite, call_rule, is_row_class
from maxtext_compat.convention.signature import advertised_signature, kind_from_signature, native_signature
from maxtext_compat.errors import InvalidArgumentError, InvalidArgumentTypeError
from maxtext_compat.locks import fork_safe_lock
from maxtext_compat.matrix import MaxTextRow
from maxtext_compat.patching import original_beneath
from maxtext_compat.shims.backport_hooks import WRITE_PATH

_lock = fork_safe_lock()
_ADAPTED: dict[tuple[type, str, str, object], type] = {}
_DECLARING: dict[tuple[type, str], type] = {}


def _row(row: MaxTextRow | None) -> MaxTextRow:
    if row is not None:
        return row
    from maxtext_compat.resolution.installed import installed_row

    return installed_row(warn_unknown=True)  # an unknown release warns, as the README says


def kind_of(cls: type, row: MaxTextRow) -> str:
    """Which layer kind a MaxText class is: by the matrix row's classes, then by its signature."""
    for key, kind in CLASS_KINDS:
        if is_row_class(cls, row.classes.get(key)):
            return kind
    found = kind_from_signature(native_signature(cls.__call__))
    if found is None:
        raise InvalidArgumentTypeError(
            f"{cls.__module__}.{cls.__qualname__} is not a MaxText Attention, decoder layer, Decoder or Transformer",
            argument="module",
            expected="an instance or class of MaxText's Attention, a decoder layer, the Decoder or the Transformer",
            found=f"{cls.__qualname__}{native_signature(cls.__call__)}",
            fix="wrap one of those, or pass kind= explicitly",
        )
    return found


@checked
def adapted_class(cls: type, *, row: MaxTextRow | None = None, kind: str | None = None) -> type:
    """The subclass of `cls` whose __call__ follows the two-convention call rule (cached).

    >>> from maxtext_compat import load_matrix
    >>> class Attention:  # a stand-in with MaxText 0.2.5's Attention signature and return (no MaxText needed)
    ...     def __call__(self, inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, *,
    ...                  model_mode="train", kv_cache=None, attention_metadata=None):
    ...         return "out", kv_cache
    >>> from maxtext_compat.adapters import adapted_class
    >>> Compat = adapted_class(Attention, row=load_matrix().row("0.2.5"), kind="attention")
    >>> issubclass(Compat, Attention), Compat.__name__
    (True, 'CompatAttention')
    >>> Compat()("x", "x", model_mode="train"), Compat()("x", "x", kv_cache=None, attention_metadata=None)
    ('out', ('out', None))
    """
    if getattr(cls, "_mc_native", None) is not None:
        return cls  # already adapted
    r = _row(row)
    k = kind_named(kind or kind_of(cls, r)).name
    write_path = WRITE_PATH  # read per build: testing.checkless hands another one, which gets its own class
    key = (cls, r.name, k, write_path)
    with _lock:
        if key in _ADAPTED:
            return _ADAPTED[key]
        # The release's own signature, beneath any shim's advertised one: the native call below reaches a rule shim
        # only to pass through it (callers.NATIVE_CALL), so it must get only what the release itself takes.
        owner = callers.call_owner(cls)
        native = native_signature(original_beneath(owner.__dict__["__call__"] if owner else cls.__call__))
        advertised = advertised_signature(native, k)
        where = f"{cls.__qualname__}.__call__"
        marks_maxtext = callers.maxtext_code(cls)
        native_call_var = callers.NATIVE_CALL

        def native_call(module: Any, kw: dict[str, Any]) -> Any:
            token = native_call_var.set((id(module), marks_maxtext))  # a rule shim on the way passes it through
            try:
                return cls.__call__(module, **kw)  # looked up per call: a shim may be installed or removed since
            finally:
                native_call_var.reset(token)

        site = CallSite(k, r, native, advertised, where, write_path=write_path)

        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            return call_rule(site, self, native_call, args, kwargs)

        params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *advertised.parameters.values()]
        __call__.__signature__ = advertised.replace(parameters=params)  # type: ignore[attr-defined]
        __call__.__doc__ = (
            f"{cls.__qualname__}.__call__ with both call conventions (maxtext-compat, MaxText {r.name}).\n\n"
            "Old call (no kv_cache / attention_metadata): the pre-#2616 return. New call: the vLLM return."
        )
        namespace = {
            "__call__": __call__,
            "__module__": cls.__module__,
            "__qualname__": f"Compat{cls.__qualname__}",
            "_mc_kind": k,
            "_mc_row": r,
            "_mc_native": cls,
        }
        adapted = type(f"Compat{cls.__name__}", (cls,), namespace)
        _ADAPTED[key] = adapted
        return adapted


@checked
def wrap(
    module: Any,
    *,
    row: MaxTextRow | None = None,
    kind: str | None = None,
    deprecation: str | None = None,
    strict: bool | None = None,
    convention: str | None = None,
) -> Any:
    """Wrap a MaxText module (class or instance) so it takes both call conventions.

    A class gives the adapted subclass (construct it as usual). An NNX instance gives an
    adapted instance sharing the wrapped instance's variables (no copies). An unbound Linen
    instance gives an adapted clone (Linen modules hold no parameters; init/apply as usual).
    deprecation / strict override the matrix row's policy and strict mode for this adapter.
    convention declares what the calling code expects ('legacy', 'kv_return' or 'auto'; see
    maxtext_compat.convention.callers); it holds for every instance of a wrapped class.

    With MaxText installed, `wrap(attention)` of your own module is all it takes (the installed release's row is
    used); here a stand-in with a release's signature shows the rule without MaxText:

    >>> from maxtext_compat import load_matrix
    >>> class Attention:  # a stand-in with MaxText 0.2.5's Attention signature and return (no MaxText needed)
    ...     def __call__(self, inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, *,
    ...                  model_mode="train", kv_cache=None, attention_metadata=None):
    ...         return "out", kv_cache
    >>> from maxtext_compat.adapters import wrap
    >>> attention = wrap(Attention, row=load_matrix().row("0.2.5"), kind="attention")()
    >>> attention("x", "x", model_mode="train")  # an old call, not migrated yet: the old return
    'out'
    >>> attention("x", "x", model_mode="train", kv_cache=None, attention_metadata=None)  # a new call
    ('out', None)
    >>> both = wrap(Attention, row=load_matrix().row("0.2.5"), kind="attention", convention="kv_return")()
    >>> both("x", "x", model_mode="train")  # code that always unpacks (out, kv_cache)
    ('out', None)
    """
    if deprecation is not None and deprecation not in ("ignore", "warn", "error"):
        raise InvalidArgumentError(
            "unknown deprecation policy",
            argument="deprecation",
            expected="ignore, warn or error",
            found=repr(deprecation),
            fix="pass deprecation='ignore', 'warn' or 'error', or leave it out (None) to use the matrix row's policy",
        )
    declared = None if convention is None else callers.check(convention, "convention")
    if isinstance(module, type):
        if deprecation is not None or strict is not None:
            raise InvalidArgumentError(
                "per-adapter deprecation/strict apply to instances",
                argument="deprecation/strict",
                expected="a module instance when deprecation= or strict= is given",
                found=f"the class {module.__qualname__}",
                fix="use maxtext_compat.adapters.set_deprecation_policy / set_strict for classes, "
                "or wrap an instance: wrap(module_instance, deprecation=..., strict=...)",
            )
        return _declaring(adapted_class(module, row=row, kind=kind), declared)
    cls = _declaring(adapted_class(type(module), row=row, kind=kind), declared)
    if type(module) is cls and deprecation is None and strict is None:
        return module
    new = _clone_into(module, cls)
    new.__dict__["_mc_policy"] = deprecation
    new.__dict__["_mc_strict"] = strict
    return new


def _declaring(adapted: type, value: str | None) -> type:
    """The adapted class itself, or its subclass that declares the caller convention `value` (cached).

    A class attribute and not an instance one: Linen clones modules inside init/apply and keeps
    only dataclass fields, so an instance attribute would be lost in the middle of a call.
    """
    if value is None or getattr(adapted, "_mc_convention", None) == value:
        return adapted
    base = adapted.__dict__.get("_mc_adapted", adapted)
    key = (base, value)
    with _lock:
        found = _DECLARING.get(key)
        if found is None:
            namespace = {
                "__module__": base.__module__,
                "__qualname__": base.__qualname__,
                "_mc_convention": value,
                "_mc_adapted": base,
            }
            found = _DECLARING[key] = type(base.__name__, (base,), namespace)
        return found


def _clone_into(module: Any, cls: type) -> Any:
    try:
        from flax import linen as nn
    except ImportError:  # pragma: no cover - MaxText always brings flax
        nn = None
    if nn is not None and isinstance(module, nn.Module):
        if module.scope is not None:
            raise InvalidArgumentError(
                "cannot wrap a bound Linen module (one inside init/apply)",
                argument="module",
                found=f"bound {type(module).__qualname__}",
                fix="wrap the class, or the unbound module before init/apply",
            )
        fields = {f.name: getattr(module, f.name) for f in dataclasses.fields(module) if f.init}
        return cls(**fields)
    new: Any = object.__new__(cls)
    new.__dict__.update(module.__dict__)  # same Variables and submodules: parameters are shared
    return new
