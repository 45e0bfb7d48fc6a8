"""The call rule: which convention a call to a MaxText layer is, and what it gets back.

Why one function for both deliveries: an adapter (`wrap()`) and a shim profile (MaxText's own
classes patched in place) must answer every call the same way, so both run `call_rule`. An old
call (no KV arguments) gets the release's pre-#2616 return; a new call gets (out, kv_cache) and,
when it hands over a paged cache, writes it through the release's vLLM path or, on releases
without one, through the backport. A declared caller convention (see `declared`) fixes the
answer for calls that name nothing.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from maxtext_compat.convention import declared as callers
from maxtext_compat.convention import policy
from maxtext_compat.convention.kinds import KINDS, Kind, kind_named
from maxtext_compat.convention.returns import is_scan_carry
from maxtext_compat.convention.translate import Translated, check_kv_writes, describe, translate
from maxtext_compat.errors import ConventionMismatchError, InvalidArgumentError, KVCacheNotUpdatedError
from maxtext_compat.matrix import MaxTextRow

TRAIN = "train"
RULE_PROFILES = ("vllm-backport", "call-rule")  # shim profiles whose class wrappers apply the call rule
# The module whose call the adapter is running natively right now: a rule shim met on the way (one stacked
# under another profile's wrapper, which is_rule_wrapper cannot see) must not apply the rule a second time.
RULE_APPLIED: contextvars.ContextVar[int] = contextvars.ContextVar("maxtext_compat_rule_applied", default=0)


def _mode(module: Any, kind: str, t: Translated, explicit: Any) -> str:
    if explicit is not None:
        return str(explicit)
    mode = t.kwargs.get("model_mode")
    if mode is None:
        mode = getattr(module, "model_mode", None)
    return str(mode) if mode is not None else TRAIN


def rule_applied_to(module: Any) -> bool:
    """Whether an adapter is applying the call rule to `module` in this call (the shim then passes through)."""
    return RULE_APPLIED.get() == id(module)


def is_rule_wrapper(raw: Any) -> Any:
    """The shim (our innermost wrapper) when `raw`, a class-dict entry, applies the call rule; else None.

    The adapter then runs that shim instead of applying the rule a second time (an old call would
    otherwise be reduced twice: the second `out[0]` takes batch row 0).

    Decided from the object, not from the registry, so an uninstall racing with the call cannot
    make the adapter call a bare MaxText method with kv_cache= (the shim still wraps it).
    """
    from maxtext_compat.shims.patching import layer_of

    layer = layer_of(raw)
    return layer.shim if layer is not None and layer.profile in RULE_PROFILES else None


def call_rule_wrapper(shim: Any, module: Any, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run the shim's rule wrapper itself, whether or not its profile is still installed.

    Why not call the installed object: it runs the original once its profile is removed (so copies
    taken while installed stop patching), and an uninstall racing with this call must not turn a new
    call the adapter already handed to the shim into a bare MaxText call with kv_cache=.
    """
    return shim._self_wrapper(shim.__wrapped__.__get__(module, cls), module, args, kwargs)


@dataclass(frozen=True)
class CallSite:
    """One MaxText callable the rule serves: what it is, on which release, and how to run it natively.

    Built once per adapted class or patched method (not per call). `deprecation=False` skips the
    deprecation policy (the shim: MaxText's own internal old calls are not the user's to migrate)."""

    kind: str
    row: MaxTextRow
    native: inspect.Signature
    advertised: inspect.Signature
    where: str  # "Attention.__call__", for messages
    deprecation: bool = True

    def __post_init__(self) -> None:
        kind_named(self.kind)  # a typed error for a kind the table does not have


def call_rule(
    site: CallSite, self: Any, native_call: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """The call rule: translate, run `native_call(module, **kwargs)`, return the caller's convention."""
    kind, row, native, where = site.kind, site.row, site.native, site.where
    explicit_mode = None
    if "model_mode" in kwargs and "model_mode" not in native.parameters:
        explicit_mode = kwargs.pop("model_mode")  # a construction field in this release: consumed here
    decl = callers.for_call(row, getattr(type(self), "_mc_convention", None))
    k = KINDS[kind]
    force_new = decl.value == callers.KV_RETURN and (not k.is_model or _vllm_config(self, row))
    t = translate(kind, row, native, site.advertised, args, kwargs, where=where, force_new=force_new)
    if decl.value == callers.LEGACY and t.written:
        _refuse_new_call(kind, where, decl)
    if decl.value == callers.NATIVE and not t.written:
        return native_call(self, **t.kwargs)  # MaxText's own call: exactly what the release returns
    first = next(iter(t.kwargs.values()), None)
    if k.takes_scan_carry and is_scan_carry(first):
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
        if site.deprecation:
            policy.check_old_call(row, kind, where, self.__dict__.get("_mc_policy"))
        result = native_call(self, **t.kwargs)
        if row.has_kv_params:  # else the release's own return is the old convention, bit for bit
            result = k.old_return(row, self, result)
        return _constrain(result, t)
    mode = _mode(self, kind, t, explicit_mode)
    # Only a call that hands over a paged cache writes it; a new call with both None (MaxText's own
    # layers in training, or decoding with MaxText's own KV cache) runs natively and returns the new shape.
    writes = mode != TRAIN and (t.kv is not None or t.metadata is not None)
    if writes and (t.kv is None or t.metadata is None):
        missing = "attention_metadata" if t.metadata is None else k.kv_name
        raise InvalidArgumentError(
            f"a new call in model_mode {mode!r} needs both {k.kv_name} and attention_metadata",
            argument=missing,
            expected="a value (the vLLM path writes the KV cache)",
            found="None",
            fix=f"pass {missing}=...; build both with maxtext_compat.paged (layout + build_metadata)",
        )
    if writes and k.runs_kernel and _is_mla(self, row):
        raise InvalidArgumentError(
            f"{where}: MaxText's multi-head latent attention has no ragged-paged-attention path (MaxText {row.name})",
            argument="kv_cache",
            expected="None: MLA keeps its KV in MaxText's own cache (MaxText 0.2.x returns a paged cache unwritten)",
            found=describe(t.kv),
            fix="call MLA without kv_cache / attention_metadata (prefill / autoregressive use MaxText's own cache), "
            "or serve a model whose attention is MaxText's Attention",
        )
    if row.has_kv_params and (writes or k.is_model):
        _check_native_vllm(self, row, where, kind)
    if row.has_kv_params:
        if writes:
            check_kv_writes(kind, t, where)
        result = k.new_return(native_call(self, **t.kwargs))
    else:
        from maxtext_compat.convention.backport.call import backport_call

        result = backport_call(self, native_call, kind, row, t, writes, where)
    if writes and policy.effective_strict(self.__dict__.get("_mc_strict")):
        _check_kv(k, t.kv, result, where)
    return result


def _vllm_config(module: Any, row: MaxTextRow) -> bool:
    """Whether the module's config selects a vLLM attention mode (the Transformer then returns (hidden, kv))."""
    modes = row.vllm.attention_modes if row.vllm else ("vllm_rpa",)
    return getattr(getattr(module, "config", None), "attention", None) in modes


def _refuse_new_call(kind: str, where: str, decl: callers.Declared) -> None:
    names = f"{KINDS[kind].kv_name} / attention_metadata"
    raise ConventionMismatchError(
        f"{where} was called the new way ({names}) but the caller convention is declared 'legacy' (by {decl.source})",
        argument=names,
        expected="an old call (no KV arguments) under the declared 'legacy' convention",
        found=f"a call naming {names}",
        fix="declare 'kv_return' (or 'auto') for this code: wrap(module, convention='kv_return'), "
        "with maxtext_compat.adapters.caller_convention('kv_return'), or $MAXTEXT_COMPAT_CONVENTION",
    )


def is_row_class(cls: type, ref: Any) -> bool:
    """Whether `cls` is the class a matrix row names (`ref`, a ClassRef or None)."""
    return ref is not None and cls.__name__ == ref.qualname and cls.__module__ == ref.module


def _is_mla(module: Any, row: MaxTextRow) -> bool:
    ref = row.classes.get("mla")
    return any(is_row_class(c, ref) for c in type(module).__mro__)


def _constrain(result: Any, t: Translated) -> Any:
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
        what = "returns (hidden, kv_caches)" if KINDS[kind].is_model else "writes the paged KV cache"
        raise InvalidArgumentError(
            f"MaxText {row.name}'s {where} only {what} when its config says attention='vllm_rpa'",
            argument="config.attention",
            expected=f"one of {list(modes)}",
            found=repr(attention),
            fix="build the config from MaxText's configs/inference/vllm.yml (maxtext_compat.testing.tiny."
            "tiny_config(vllm=True)), or call the old way (without kv_caches / kv_cache / attention_metadata)",
        )


def _check_kv(kind: Kind, given: Any, result: Any, where: str) -> None:
    returned = result[1] if kind.is_model else result[-1]
    pairs = list(zip(given, returned, strict=False)) if kind.per_layer else [(given, returned)]
    if kind.per_layer and (returned is None or len(returned) != len(given)):
        pairs = [(given, None)]
    for i, (before, after) in enumerate(pairs):
        if after is None or (isinstance(after, (list, tuple)) and len(after) == 0) or after is before:
            what = "no KV cache" if after is None or isinstance(after, (list, tuple)) else "the KV cache unchanged"
            raise KVCacheNotUpdatedError(
                f"strict mode: {where} returned {what}" + (f" for layer {i}" if len(pairs) > 1 else ""),
                argument=kind.kv_name,
                expected="an updated KV cache (the step writes new tokens)",
                found=what,
                fix="fix the layer (see `maxtext-compat doctor` known defects, e.g. scan-kv-carry-missing) "
                "or install the shim that does (maxtext_compat.shims.install())",
            )
