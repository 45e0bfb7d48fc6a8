"""The call rule: which convention a call to a MaxText layer is, and what it gets back.

Why one function for both deliveries: an adapter (`wrap()`) and a shim profile (MaxText's own
classes patched in place) must answer every call the same way, so both run `call_rule`. An old
call (no KV arguments) gets the release's pre-#2616 return; a new call gets (out, kv_cache) and,
when it hands over a paged cache, writes it through the release's vLLM path or, on releases
without one, through the backport. A declared caller convention (see `declared`) fixes the
answer for calls that name nothing.

The rule sits below the paged KV cache, the kernel and the patching engine and imports none of them: a
writing call's checks and the backport reach it as the `WritePath` its call site was built with
(`maxtext_compat.shims.backport_hooks.WRITE_PATH`). Both deliveries run the native call inside
`callers.NATIVE_CALL`, which says what is MaxText's own call and keeps the rule from applying twice.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from maxtext_compat import names
from maxtext_compat.convention import callers, policy
from maxtext_compat.convention.binding import NEW, OLD, make_fast_call
from maxtext_compat.convention.kinds import KINDS, Kind, kind_named
from maxtext_compat.convention.returns import is_scan_carry
from maxtext_compat.convention.translate import Translated, Translator, describe
from maxtext_compat.errors import ConventionMismatchError, InvalidArgumentError, KVCacheNotUpdatedError
from maxtext_compat.matrix import MaxTextRow

TRAIN = names.TRAIN
_UNREAD = object()


class WritePath(Protocol):
    """What a writing new call needs beyond the rule, from the layers above it (shims.backport_hooks.WRITE_PATH)."""

    def prepare(self, kind: Kind, module: Any, row: MaxTextRow, t: Translated, where: str) -> None:
        """Check what the call hands over (caches, layouts, metadata, where each write lands) and put the
        metadata in the form the release's own vLLM path reads; a typed error before anything runs."""
        ...

    def legacy_call(
        self, module: Any, native_call: Callable[..., Any], kind: str, row: MaxTextRow, t: Translated,
        writes: bool, where: str,
    ) -> Any:  # fmt: skip
        """Run a new call on a release without the KV parameters (0.1.0); returns the new convention."""
        ...

    def same_metadata(self, a: Any, b: Any) -> bool:
        """Whether two metadata objects hold equal arrays (a per-layer dict of equal entries is one group)."""
        ...


@dataclass(frozen=True)
class CallSite:
    """One MaxText callable the rule serves: what it is, on which release, and how to run it natively.

    Built once per adapted class or patched method (not per call). `deprecation=False` skips the
    deprecation policy (the shim: MaxText's own internal old calls are not the user's to migrate).
    `write_path`: what a writing new call runs below the rule (maxtext_compat.shims.backport_hooks.WRITE_PATH)."""

    kind: str
    row: MaxTextRow
    native: inspect.Signature
    advertised: inspect.Signature
    where: str  # "Attention.__call__", for messages
    deprecation: bool = True
    write_path: WritePath = field(kw_only=True, repr=False, compare=False)  # required: no default path
    # Computed once here, read by every call (the eager path's cost: docs and benchmarks/bench_eager.py).
    k: Kind = field(init=False, repr=False, compare=False)
    translate: Translator = field(init=False, repr=False, compare=False)
    takes_model_mode: bool = field(init=False, repr=False, compare=False)
    row_default: callers.Declared = field(init=False, repr=False, compare=False)
    scan_carry: bool = field(init=False, repr=False, compare=False)  # k.takes_scan_carry
    has_kv_params: bool = field(init=False, repr=False, compare=False)  # row.has_kv_params
    is_mla: dict[type, bool] = field(init=False, repr=False, compare=False)  # per module class, asked once
    fast_call: Callable[..., tuple[Any, ...] | None] | None = field(init=False, repr=False, compare=False)
    deadline_passed: bool = field(init=False, repr=False, compare=False)  # policy.past_deadline(row)
    row_policy: str = field(init=False, repr=False, compare=False)  # row.deprecation.policy
    runs_kernel: bool = field(init=False, repr=False, compare=False)  # k.runs_kernel
    is_model: bool = field(init=False, repr=False, compare=False)  # k.is_model
    vllm_modes: tuple[str, ...] = field(init=False, repr=False, compare=False)  # the row's vLLM attention modes
    conventions: dict[type, Any] = field(init=False, repr=False, compare=False)  # wrap(convention=) per class

    def __post_init__(self) -> None:
        object.__setattr__(self, "k", kind_named(self.kind))  # a typed error for a kind the table does not have
        object.__setattr__(
            self,
            "translate",
            Translator(
                self.kind,
                self.row,
                self.native,
                self.advertised,
                self.where,
                same_metadata=self.write_path.same_metadata,
            ),
        )
        object.__setattr__(self, "takes_model_mode", "model_mode" in self.native.parameters)
        object.__setattr__(self, "row_default", callers.row_declaration(self.row))
        object.__setattr__(self, "scan_carry", self.k.takes_scan_carry)
        object.__setattr__(self, "has_kv_params", self.row.has_kv_params)
        object.__setattr__(self, "is_mla", {})
        object.__setattr__(self, "conventions", {})
        names = self.translate.native_names
        object.__setattr__(self, "fast_call", make_fast_call(self.advertised, names, self.k.new_params))
        object.__setattr__(self, "deadline_passed", policy.past_deadline(self.row))
        object.__setattr__(self, "row_policy", self.row.deprecation.policy)
        object.__setattr__(self, "runs_kernel", self.k.runs_kernel)
        object.__setattr__(self, "is_model", self.k.is_model)
        object.__setattr__(self, "vllm_modes", tuple(self.row.vllm.attention_modes) if self.row.vllm else ())


def call_rule(
    site: CallSite, self: Any, native_call: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """The call rule: translate, run `native_call(module, native_kwargs)`, return the caller's convention."""
    kind, row, where, k = site.kind, site.row, site.where, site.k
    explicit_mode = None
    if "model_mode" in kwargs and not site.takes_model_mode:
        explicit_mode = kwargs.pop("model_mode")  # a construction field in this release: consumed here
    cls = type(self)
    declared_by_class = site.conventions.get(cls, _UNREAD)
    if declared_by_class is _UNREAD:  # getattr with a default on a class without it raises inside: once per class
        declared_by_class = site.conventions[cls] = getattr(cls, "_mc_convention", None)
    fast = None
    if site.fast_call is not None:
        try:
            fast = site.fast_call(*args, **kwargs)  # the common calls in one step (convention.binding)
        except TypeError:
            fast = None  # a call that does not fit: the translator's typed error says why
    if fast is not None and fast[0] is NEW and not isinstance(fast[3], Mapping):
        # A call naming a KV argument follows the rule whoever makes it; only a declared 'legacy' refuses it, and
        # only in code outside MaxText and us: who the caller is (a walk up the stack) is asked only then.
        decl = callers.declared(row, declared_by_class, site.row_default)
        if decl.value == callers.LEGACY:
            decl = callers.for_call(row, declared_by_class, site.row_default)
        t = Translated(fast[1], True, True, fast[2], fast[3])
    else:
        decl = callers.for_call(row, declared_by_class, site.row_default)
        force_new = decl.value == callers.KV_RETURN and (not k.is_model or _vllm_config(self, row))
        if fast is not None and fast[0] is OLD and not force_new:
            return _old_call(site, self, native_call, fast[1], decl, explicit_mode, None)
        t = site.translate(args, kwargs, force_new=force_new)
    if decl.value == callers.LEGACY and t.written:
        _refuse_new_call(kind, where, decl)
    if not t.is_new:
        return _old_call(site, self, native_call, t.kwargs, decl, explicit_mode, t)
    if site.scan_carry and is_scan_carry(next(iter(t.kwargs.values()), None)):
        return native_call(self, t.kwargs)  # the 0.2.2+ scan-carry protocol: neither convention
    # The model mode: the caller's explicit one, else the call's model_mode, else the layer's, else training.
    mode = explicit_mode if explicit_mode is not None else t.kwargs.get("model_mode")
    if mode is None:
        mode = getattr(self, "model_mode", None)
    mode = TRAIN if mode is None else str(mode)
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
    if writes and site.runs_kernel and _is_mla(site, self):
        raise InvalidArgumentError(
            f"{where}: MaxText's multi-head latent attention has no ragged-paged-attention path (MaxText {row.name})",
            argument="kv_cache",
            expected="None: MLA keeps its KV in MaxText's own cache (MaxText 0.2.x returns a paged cache unwritten)",
            found=describe(t.kv),
            fix="call MLA without kv_cache / attention_metadata (prefill / autoregressive use MaxText's own cache), "
            "or serve a model whose attention is MaxText's Attention",
        )
    if site.has_kv_params and (writes or site.is_model):
        cfg = getattr(self, "config", None)
        if cfg is not None and getattr(cfg, "attention", None) not in site.vllm_modes:
            _check_native_vllm(self, row, where, kind)  # refuses: the config selects no vLLM path
    if writes:  # one set of checks before either path: the same input gets the same answer on every release
        site.write_path.prepare(k, self, row, t, where)
    if site.has_kv_params:
        result = k.new_return(row, native_call(self, t.kwargs), where)
    else:
        result = site.write_path.legacy_call(self, native_call, kind, row, t, writes, where)
    if writes and policy.effective_strict(self.__dict__.get("_mc_strict")):
        _check_kv(k, t.kv, result, where)
    return result


def _old_call(
    site: CallSite,
    self: Any,
    native_call: Callable[..., Any],
    kwargs: dict[str, Any],
    decl: callers.Declared,
    explicit_mode: Any,
    t: Translated | None,
) -> Any:
    """An old call (no KV argument named): the release's pre-#2616 return (`t`: the translation, when one was
    needed, e.g. for out_sharding on 0.1.0)."""
    if decl.value == callers.NATIVE:
        return native_call(self, kwargs)  # MaxText's own call: exactly what the release returns
    if site.scan_carry and is_scan_carry(next(iter(kwargs.values()), None)):
        return native_call(self, kwargs)  # the 0.2.2+ scan-carry protocol: neither convention
    if explicit_mode is not None and explicit_mode != getattr(self, "model_mode", explicit_mode):
        raise InvalidArgumentError(
            f"MaxText {site.row.name} fixes model_mode when {type(self).__qualname__} is constructed",
            argument="model_mode",
            expected=repr(getattr(self, "model_mode", None)),
            found=repr(explicit_mode),
            fix=f"construct the module with model_mode={explicit_mode!r}",
        )
    if site.deprecation:
        override = self.__dict__.get("_mc_policy")
        if site.deadline_passed or override is not None or site.row_policy != "ignore" or policy.forced_policy():
            policy.check_old_call(site.row, site.kind, site.where, override, deadline_passed=site.deadline_passed)
    result = native_call(self, kwargs)
    if site.has_kv_params:  # else the release's own return is the old convention, bit for bit
        result = site.k.old_return(site.row, self, result, site.where)
    return result if t is None or t.out_sharding is None else _constrain(result, t)


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


def _is_mla(site: CallSite, module: Any) -> bool:
    cls = type(module)
    found = site.is_mla.get(cls)
    if found is None:
        ref = site.row.classes.get("mla")
        found = site.is_mla[cls] = any(is_row_class(c, ref) for c in cls.__mro__)
    return found


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
