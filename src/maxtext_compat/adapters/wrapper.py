"""`wrap()`: MaxText modules that accept both call conventions on every release.

Why subclasses: an adapted class is a subclass of the MaxText class, so an adapter is usable
wherever the module is (isinstance checks, `nnx.split`/`merge`/`state`, `nnx.jit`, as a
submodule, Linen `init`/`apply`), its parameter tree is the module's own, and wrapping an
instance shares the instance's parameters instead of copying them. Only `__call__` changes:
it translates the arguments (see translate.py), runs the native call by keyword, and returns
the convention the caller used (see returns.py). On a release without the vLLM path
(0.1.0) a new call runs through the backport (see maxtext_compat.backport).
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import threading
from collections.abc import Callable
from typing import Any

from maxtext_compat import convention as callers
from maxtext_compat.adapters import policy
from maxtext_compat.adapters.returns import is_scan_carry, new_return, old_return
from maxtext_compat.adapters.signature import (
    CLASS_KINDS,
    KINDS,
    advertised_signature,
    kind_from_signature,
    native_signature,
)
from maxtext_compat.adapters.translate import Translated, check_kv_writes, describe, translate
from maxtext_compat.errors import InvalidArgumentError, InvalidArgumentTypeError
from maxtext_compat.matrix import MaxTextRow

TRAIN = "train"
_lock = threading.Lock()
# The module whose call the adapter is running natively right now: a rule shim met on the way (one stacked
# under another profile's wrapper, which is_rule_wrapper cannot see) must not apply the rule a second time.
_RULE_APPLIED: contextvars.ContextVar[int] = contextvars.ContextVar("maxtext_compat_rule_applied", default=0)
_ADAPTED: dict[tuple[type, str, str], type] = {}
_DECLARING: dict[tuple[type, str], type] = {}

RULE_PROFILES = ("vllm-backport", "call-rule")  # shim profiles whose class wrappers apply the call rule
ADAPTER_ATTRS = ("_mc_kind", "_mc_row", "_mc_native", "_mc_policy", "_mc_strict")


def _row(row: MaxTextRow | None) -> MaxTextRow:
    if row is not None:
        return row
    from maxtext_compat.testing.tiny import installed_row

    return installed_row(warn_unknown=True)  # an unknown release warns, as the README says


def kind_of(cls: type, row: MaxTextRow) -> str:
    """Which layer kind a MaxText class is: by the matrix row's classes, then by its signature."""
    for key, kind in CLASS_KINDS:
        if _is_row_class(cls, row.classes.get(key)):
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


def adapted_class(cls: type, *, row: MaxTextRow | None = None, kind: str | None = None) -> type:
    """The subclass of `cls` whose __call__ follows the two-convention call rule (cached)."""
    if getattr(cls, "_mc_native", None) is not None:
        return cls  # already adapted
    r = _row(row)
    k = kind or kind_of(cls, r)
    if k not in KINDS:
        raise InvalidArgumentError(
            "unknown kind",
            argument="kind",
            expected=f"one of {list(KINDS)}",
            found=repr(k),
            fix=f"pass kind= as one of {', '.join(map(repr, KINDS))} (e.g. kind='attention'), "
            "or leave it out to detect the kind from the class",
        )
    key = (cls, r.name, k)
    with _lock:
        if key in _ADAPTED:
            return _ADAPTED[key]
        native = native_signature(cls.__call__)
        advertised = advertised_signature(native, k)
        where = f"{cls.__qualname__}.__call__"

        def native_call(module: Any, **kw: Any) -> Any:
            token = _RULE_APPLIED.set(id(module))  # a rule shim further down passes this call through
            try:
                return cls.__call__(module, **kw)  # looked up per call: backport hooks may be installed since
            finally:
                _RULE_APPLIED.reset(token)

        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            raw = inspect.getattr_static(cls, "__call__")  # one read: the decision and the call agree
            shim = is_rule_wrapper(raw)
            if shim is not None:  # the vllm-backport shim already applies the rule to this class
                return call_rule_wrapper(shim, self, cls, args, kwargs)
            return call_rule(self, native_call, k, r, native, advertised, where, args, kwargs)

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
    maxtext_compat.convention); it holds for every instance of a wrapped class.
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
    new = object.__new__(cls)
    new.__dict__.update(module.__dict__)  # same Variables and submodules: parameters are shared
    return new


# ----------------------------------------------------------------------------------------------
# The call rule
# ----------------------------------------------------------------------------------------------


def _mode(module: Any, kind: str, t: Translated, explicit: Any) -> str:
    if explicit is not None:
        return str(explicit)
    mode = t.kwargs.get("model_mode")
    if mode is None:
        mode = getattr(module, "model_mode", None)
    return str(mode) if mode is not None else TRAIN


def rule_applied_to(module: Any) -> bool:
    """Whether an adapter is applying the call rule to `module` in this call (the shim then passes through)."""
    return _RULE_APPLIED.get() == id(module)


def is_rule_wrapper(raw: Any) -> Any:
    """The shim (our innermost wrapper) when `raw`, a class-dict entry, applies the call rule; else None.

    The adapter then runs that shim instead of applying the rule a second time (an old call would
    otherwise be reduced twice: the second `out[0]` takes batch row 0).

    Decided from the object, not from the registry, so an uninstall racing with the call cannot
    make the adapter call a bare MaxText method with kv_cache= (the shim still wraps it).
    """
    from maxtext_compat.shims import patching

    layer = patching._OURS.get(id(raw))
    ours = layer is not None and layer.profile in RULE_PROFILES and layer.wrapper is raw
    return layer.shim if ours else None


def call_rule_wrapper(shim: Any, module: Any, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run the shim's rule wrapper itself, whether or not its profile is still installed.

    Why not call the installed object: it runs the original once its profile is removed (so copies
    taken while installed stop patching), and an uninstall racing with this call must not turn a new
    call the adapter already handed to the shim into a bare MaxText call with kv_cache=.
    """
    return shim._self_wrapper(shim.__wrapped__.__get__(module, cls), module, args, kwargs)


def call_rule(
    self: Any,
    native_call: Callable[..., Any],
    kind: str,
    row: MaxTextRow,
    native: inspect.Signature,
    advertised: inspect.Signature,
    where: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    deprecation: bool = True,
) -> Any:
    """The call rule: translate, run `native_call(module, **kwargs)`, return the caller's convention.

    deprecation=False skips the deprecation policy (the shim: MaxText's own internal old calls).
    """
    explicit_mode = None
    if "model_mode" in kwargs and "model_mode" not in native.parameters:
        explicit_mode = kwargs.pop("model_mode")  # a construction field in this release: consumed here
    decl = callers.for_call(row, getattr(type(self), "_mc_convention", None))
    force_new = decl.value == callers.KV_RETURN and (kind != "transformer" or _vllm_config(self, row))
    t = translate(kind, row, native, advertised, args, kwargs, where=where, force_new=force_new)
    if decl.value == callers.LEGACY and t.written:
        _refuse_new_call(kind, where, decl)
    if decl.value == callers.NATIVE and not t.written:
        return native_call(self, **t.kwargs)  # MaxText's own call: exactly what the release returns
    first = next(iter(t.kwargs.values()), None)
    if kind == "decoder_layer" and is_scan_carry(first):
        return native_call(self, **t.kwargs)  # the 0.2.2+ scan-carry protocol: neither convention
    if not t.is_new:
        if explicit_mode is not None and explicit_mode != getattr(self, "model_mode", explicit_mode):
            raise InvalidArgumentError(
                f"MaxText {row.name} fixes model_mode when {type(self).__qualname__} is constructed",
                argument="model_mode",
                expected=repr(getattr(self, "model_mode", None)),
                found=repr(explicit_mode),
                fix=f"construct the module with model_mode={explicit_mode!r}",
            )
        if deprecation:
            policy.check_old_call(row, kind, where, self.__dict__.get("_mc_policy"))
        result = native_call(self, **t.kwargs)
        return _constrain(old_return(kind, row, self, result), t, kind)
    mode = _mode(self, kind, t, explicit_mode)
    # Only a call that hands over a paged cache writes it; a new call with both None (MaxText's own
    # layers in training, or decoding with MaxText's own KV cache) runs natively and returns the new shape.
    writes = mode != TRAIN and (t.kv is not None or t.metadata is not None)
    if writes and (t.kv is None or t.metadata is None):
        missing = "attention_metadata" if t.metadata is None else _kv_name(kind)
        raise InvalidArgumentError(
            f"a new call in model_mode {mode!r} needs both {_kv_name(kind)} and attention_metadata",
            argument=missing,
            expected="a value (the vLLM path writes the KV cache)",
            found="None",
            fix=f"pass {missing}=...; build both with maxtext_compat.paged (layout + build_metadata)",
        )
    if writes and kind == "attention" and _is_mla(self, row):
        raise InvalidArgumentError(
            f"{where}: MaxText's multi-head latent attention has no ragged-paged-attention path (MaxText {row.name})",
            argument="kv_cache",
            expected="None: MLA keeps its KV in MaxText's own cache (MaxText 0.2.x returns a paged cache unwritten)",
            found=describe(t.kv),
            fix="call MLA without kv_cache / attention_metadata (prefill / autoregressive use MaxText's own cache), "
            "or serve a model whose attention is MaxText's Attention",
        )
    if row.has_kv_params and (writes or kind == "transformer"):
        _check_native_vllm(self, row, where, kind)
    if row.has_kv_params:
        if writes:
            check_kv_writes(kind, t, where)
        result = new_return(kind, row, self, native_call(self, **t.kwargs))
    else:
        from maxtext_compat.backport.call import backport_call

        result = backport_call(self, native_call, kind, row, t, writes, where)
    if writes and policy.effective_strict(self.__dict__.get("_mc_strict")):
        _check_kv(kind, t.kv, result, where)
    return result


def _vllm_config(module: Any, row: MaxTextRow) -> bool:
    """Whether the module's config selects a vLLM attention mode (the Transformer then returns (hidden, kv))."""
    modes = row.vllm.attention_modes if row.vllm else ("vllm_rpa",)
    return getattr(getattr(module, "config", None), "attention", None) in modes


def _refuse_new_call(kind: str, where: str, decl: callers.Declared) -> None:
    names = f"{_kv_name(kind)} / attention_metadata"
    raise callers.ConventionMismatchError(
        f"{where} was called the new way ({names}) but the caller convention is declared 'legacy' (by {decl.source})",
        argument=names,
        expected="an old call (no KV arguments) under the declared 'legacy' convention",
        found=f"a call naming {names}",
        fix="declare 'kv_return' (or 'auto') for this code: wrap(module, convention='kv_return'), "
        "with maxtext_compat.adapters.caller_convention('kv_return'), or $MAXTEXT_COMPAT_CONVENTION",
    )


def _is_row_class(cls: type, ref: Any) -> bool:
    """Whether `cls` is the class a matrix row names (`ref`, a ClassRef or None)."""
    return ref is not None and cls.__name__ == ref.qualname and cls.__module__ == ref.module


def _is_mla(module: Any, row: MaxTextRow) -> bool:
    ref = row.classes.get("mla")
    return any(_is_row_class(c, ref) for c in type(module).__mro__)


def _kv_name(kind: str) -> str:
    return "kv_caches" if kind in ("decoder", "transformer") else "kv_cache"


def _constrain(result: Any, t: Translated, kind: str) -> Any:
    if t.out_sharding is None:
        return result
    import jax

    return jax.lax.with_sharding_constraint(result, t.out_sharding)


def _check_native_vllm(module: Any, row: MaxTextRow, where: str, kind: str) -> None:
    """The release's vLLM path is what its config selects: refuse a new call the config cannot answer.

    The Transformer returns (hidden, kv_caches) only under a vLLM attention mode, else bare logits, which a
    caller's `hidden, kv_caches = ...` would silently unpack along the batch axis.
    """
    cfg = getattr(module, "config", None)
    modes = row.vllm.attention_modes if row.vllm else ()
    attention = getattr(cfg, "attention", None)
    if cfg is not None and attention not in modes:
        what = "returns (hidden, kv_caches)" if kind == "transformer" else "writes the paged KV cache"
        raise InvalidArgumentError(
            f"MaxText {row.name}'s {where} only {what} when its config says attention='vllm_rpa'",
            argument="config.attention",
            expected=f"one of {list(modes)}",
            found=repr(attention),
            fix="build the config from MaxText's configs/inference/vllm.yml (maxtext_compat.testing.tiny."
            "tiny_config(vllm=True)), or call the old way (without kv_caches / kv_cache / attention_metadata)",
        )


def _check_kv(kind: str, given: Any, result: Any, where: str) -> None:
    returned = result[-1] if kind != "transformer" else result[1]
    pairs = list(zip(given, returned, strict=False)) if kind in ("decoder", "transformer") else [(given, returned)]
    if kind in ("decoder", "transformer") and (returned is None or len(returned) != len(given)):
        pairs = [(given, None)]
    for i, (before, after) in enumerate(pairs):
        if after is None or (isinstance(after, (list, tuple)) and len(after) == 0) or after is before:
            what = "no KV cache" if after is None or isinstance(after, (list, tuple)) else "the KV cache unchanged"
            raise policy.KVCacheNotUpdatedError(
                f"strict mode: {where} returned {what}" + (f" for layer {i}" if len(pairs) > 1 else ""),
                argument=_kv_name(kind),
                expected="an updated KV cache (the step writes new tokens)",
                found=what,
                fix="fix the layer (see `maxtext-compat doctor` known defects, e.g. scan-kv-carry-missing) "
                "or install the shim that does (maxtext_compat.shims.install())",
            )
