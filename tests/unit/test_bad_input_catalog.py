"""The bad-input catalog (no jax): every case is a typed error whose message names the argument and the fix.

One table, `CASES`: what the caller did, the error it gets, and the words its message must
contain (the argument, then the fix after "Fix:"). The project's errors render
`[argument] message. Expected: … Found: … Fix: …`. Cases whose message lacks a fix today
carry `defect` and run as xfail(strict=True), so fixing the message flips them to a failure
that asks for the mark to go. `docs/bad-input-catalog.md` is generated from this table and
the kernel-level one in tests/compat/test_bad_input_catalog_real.py
(`python tools/gen_catalog_table.py`); a test keeps it current.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import io
import os
import types
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any
from unittest import mock

import pytest
import yaml

from helpers.shipped import MATRIX_FILE, REPO
from maxtext_compat.errors import (
    CacheCapacityError,
    CompatError,
    ConventionMismatchError,
    IncompatibleVersionsError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    KernelUnavailableError,
    KVCacheNotUpdatedError,
    MatrixError,
    OldConventionError,
    ProfileError,
    ResolutionError,
    ShimRefusedError,
    StaleSliceError,
    UnknownReleaseWarning,
)


@dataclass(frozen=True)
class Case:
    """One bad input. kind: raises (a typed error), warns (a warning, no error), exit (the CLI exits 2)."""

    id: str
    area: str
    input: str  # what the caller did, for the docs table
    call: Callable[[], Any]
    error: type[BaseException]
    names: tuple[str, ...]  # words the message must contain: the argument first
    fix: str  # words the "Fix:" part must contain (warnings: words the message must contain)
    kind: str = "raises"
    defect: str | None = None  # why the message breaks the rule today (the case runs as strict xfail)


# ----------------------------------------------------------------------------------------------
# Fake MaxText classes with each release's exact signature (as in test_adapters_mocked_rows.py)
# ----------------------------------------------------------------------------------------------


@cache
def matrix() -> Any:
    from maxtext_compat.matrix import load_matrix

    return load_matrix(MATRIX_FILE)


SIGS = {
    ("attention", "0.1.0"): "inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, *, "
    "model_mode='train', deterministic=False, previous_chunk=None, slot=None, page_state=None, bidirectional_mask=None",
    ("attention", "0.2.5"): "inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, out_sharding=None, "
    "*, model_mode='train', deterministic=False, previous_chunk=None, slot=None, bidirectional_mask=None, "
    "rope_kwargs=None, kv_cache=None, attention_metadata=None, shared_key=None, shared_value=None",
    ("transformer", "0.1.0"): "decoder_input_tokens, decoder_positions, decoder_segment_ids=None, "
    "encoder_images=None, enable_dropout=True, previous_chunk=None, true_length=None, slot=None, page_state=None",
    ("transformer", "0.2.5"): "decoder_input_tokens, decoder_positions, decoder_segment_ids=None, "
    "encoder_images=None, enable_dropout=True, model_mode='train', previous_chunk=None, true_length=None, slot=None, "
    "kv_caches=None, attention_metadata=None",
}
RETURNS = {
    ("attention", "0.1.0"): "'OUT'",
    ("attention", "0.2.5"): "'OUT', kv_cache",
    ("transformer", "0.1.0"): "'L'",
    ("transformer", "0.2.5"): "'L'",  # bare logits: what 0.2.x returns outside a vLLM attention mode
}


@cache
def native(kind: str, release: str, returns: str | None = None, variant: str = "") -> type:
    """The native class; `returns` overrides what `__call__` returns (an expression of its parameters).

    `variant` makes a distinct class: adapted_class caches adapters per (class, release name, kind), so a
    changed row needs a class of its own."""
    ns: dict[str, Any] = {}
    exec(f"def __call__(self, {SIGS[kind, release]}):\n    return {returns or RETURNS[kind, release]}\n", ns)

    def __init__(self: Any, model_mode: str = "train") -> None:
        self.model_mode = model_mode

    name = "Attention" if kind == "attention" else "Transformer"
    return type(name, (), {"__call__": ns["__call__"], "__init__": __init__, "__module__": f"fake_{release}"})


def adapter(kind: str, release: str, **row_changes: Any) -> Any:
    """An instance of the adapter over the fake native class (of its own when the row is changed)."""
    from maxtext_compat.adapters.wrapper import adapted_class

    row = matrix().row(release)
    if row_changes:
        row = dataclasses.replace(row, **row_changes)
    cls = native(kind, release, variant=repr(sorted(row_changes.items())) if row_changes else "")
    return adapted_class(cls, row=row, kind=kind)()


def transformer_with_attention(attention: str) -> Any:
    """A 0.2.5 Transformer adapter whose config selects `attention`."""
    model = adapter("transformer", "0.2.5")
    model.config = types.SimpleNamespace(attention=attention)
    return model


def policy_row(policy: str) -> dict[str, Any]:
    return {"deprecation": dataclasses.replace(matrix().row("0.2.5").deprecation, policy=policy, ends_in="0.9.0")}


def write_path_with(hooks: Any) -> Any:
    from maxtext_compat.backport.write_path import WritePath

    return WritePath(ensure_hooks=hooks)


def set_interpret_mode(mode: Any) -> None:
    from maxtext_compat.kernel import interpret

    previous = interpret.set_interpret_mode(mode)
    interpret.set_interpret_mode(previous)  # not reached when refused; put back if it ever were


def mesh_limits(tp: int, *, jax_version: str, num_kv_heads: int | None = None) -> None:
    from maxtext_compat.kernel import mesh_limits

    mesh_limits.check_mesh(tp, interpret=True, jax_version=jax_version, num_kv_heads=num_kv_heads)


def strict_dropped() -> Any:
    from maxtext_compat.adapters.wrapper import adapted_class
    from maxtext_compat.convention import policy
    from maxtext_compat.testing.checkless import checkless_calls

    dropping = native("attention", "0.2.5", returns="'OUT', None")  # the layer loses the cache it was given
    with checkless_calls():  # strings stand in for the cache and metadata: no arrays to check here
        layer = adapted_class(dropping, row=matrix().row("0.2.5"), kind="attention")()
    with policy.strict_mode():
        return layer("x", "x", model_mode="autoregressive", kv_cache="KV", attention_metadata="MD")


def set_policy(name: str) -> None:
    from maxtext_compat.convention import policy

    policy.set_deprecation_policy(name)


def with_env(name: str, value: str, call: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        with mock.patch.dict(os.environ, {name: value}):
            return call()

    return run


class FakeCache:
    shape = (8, 16)


def mla_adapter() -> Any:
    """An adapter over a fake class named and placed as the 0.2.5 row's `mla` class (an Attention subclass)."""
    from maxtext_compat.adapters.wrapper import adapted_class

    ref = matrix().row("0.2.5").classes["mla"]
    mla = type(ref.qualname, (native("attention", "0.2.5"),), {"__module__": ref.module})
    return adapted_class(mla, row=matrix().row("0.2.5"), kind="attention")()


def shims_install_convention(value: str) -> Any:
    from maxtext_compat import shims

    shims.register_profile("catalog-convention", list, replace=True)
    try:
        return shims.install("catalog-convention", convention=value)
    finally:
        shims.uninstall("catalog-convention")
        shims.unregister_profile("catalog-convention")


def validate_kernel_010(kernel: str) -> Any:
    """MaxText 0.1.0's pyconfig.validate_attention_kernel as the vllm-backport shim wraps it."""
    from maxtext_compat.shims.rule_patches import _accept_vllm_rpa

    def original(s: str) -> None:
        raise ValueError("Invalid attention kernel was passed")  # what MaxText 0.1.0 raises (untyped)

    return _accept_vllm_rpa(matrix().row("0.1.0"))(original)(original, None, (kernel,), {})


def wrap(*args: Any, **kwargs: Any) -> Any:
    from maxtext_compat.adapters.wrapper import wrap as _wrap

    return _wrap(*args, **kwargs)


def adapted(cls: type, **kw: Any) -> Any:
    from maxtext_compat.adapters.wrapper import adapted_class

    return adapted_class(cls, row=matrix().row("0.2.5"), **kw)


class NotALayer:
    def __call__(self, x: Any) -> Any:
        return x


# ----------------------------------------------------------------------------------------------
# Paged cache and metadata (pure python)
# ----------------------------------------------------------------------------------------------


def layout(**kw: Any) -> Any:
    from maxtext_compat.paged import KVCacheLayout

    base = {"num_pages": 16, "page_size": 16, "num_kv_heads": 2, "head_dim": 128, "dtype": "float32"}
    return KVCacheLayout(**{**base, **kw})


def seq(q_len: int, kv_len: int, pages: tuple[int, ...] = (0, 1, 2, 3)) -> Any:
    from maxtext_compat.paged import SequenceSlice

    return SequenceSlice(q_len, kv_len, pages)


def build(seqs: list[Any], **kw: Any) -> Any:
    from maxtext_compat.paged import build_metadata

    return build_metadata(seqs, layout(), **kw)


def check(kv_lens=(5, 0), page_indices=(0, 1, 2, 3), cu_q_lens=(0, 5, 5), distribution=(0, 0, 1), **kw: Any) -> Any:
    """check_metadata on host values; the defaults are one valid 5-token prefill in a 2-slot batch."""
    from maxtext_compat.paged import check_metadata

    args = {"num_pages": 16, "page_size": 16, "max_num_tokens": 8, **kw}
    return check_metadata(list(kv_lens), list(page_indices), list(cu_q_lens), list(distribution), **args)


_ALIVE: list[Any] = []  # the allocator must outlive its slices for them to be stale (a dead one hands out nothing)


def stale_slice() -> Any:
    """A slice of request 'a', cut and then freed (its pages may belong to another request now)."""
    from maxtext_compat.paged import PageAllocator

    alloc = PageAllocator(16, 16)
    _ALIVE.append(alloc)
    cut = alloc.append("a", 5)
    alloc.free("a")
    return cut


def freed_and_reused_pages() -> Any:
    """A slice built by hand from request 'a''s pages after 'a' was freed and 'b' got them."""
    from maxtext_compat.paged import PageAllocator, SequenceSlice

    alloc = PageAllocator(16, 16)
    _ALIVE.append(alloc)
    pages = alloc.pages(alloc.append("a", 20).request_id)
    alloc.free("a")
    alloc.append("b", 20)
    return SequenceSlice(1, 20, pages, "a")


def allocator(num_pages: Any = 2, page_size: Any = 4) -> Any:
    from maxtext_compat.paged import PageAllocator

    return PageAllocator(num_pages, page_size)


def fill(alloc: Any, *steps: tuple[str, int]) -> Any:
    for rid, n in steps:
        alloc.append(rid, n)
    return alloc


def cache_like(shape: tuple[int, ...], dtype: str = "float32") -> Any:
    return types.SimpleNamespace(shape=shape, dtype=dtype)


def layout_for(shape: tuple[int, ...]) -> Any:
    from maxtext_compat.paged import layout_for as _layout_for

    return _layout_for(kv_cache_shape=shape, kv_cache_dtype="float32", num_kv_heads=2, head_dim=128, tp=1)


def metadata_arrays(**fields: Any) -> Any:
    from maxtext_compat.paged.metadata import metadata_arrays as arrays

    return arrays(types.SimpleNamespace(**fields))


# ----------------------------------------------------------------------------------------------
# Matrix, resolver, CLI
# ----------------------------------------------------------------------------------------------


@cache
def base_doc() -> dict[str, Any]:
    return yaml.safe_load(MATRIX_FILE.read_text())


def parse(text: str) -> Any:
    from maxtext_compat.matrix import parse_matrix

    return parse_matrix(text, "user/compat_matrix.yaml")


def mutated(mutate: Callable[[dict[str, Any]], Any]) -> Callable[[], Any]:
    def run() -> Any:
        doc = copy.deepcopy(base_doc())
        mutate(doc)
        return parse(yaml.safe_dump(doc, sort_keys=False))

    return run


def load_matrix(path: str) -> Any:
    from maxtext_compat.matrix import load_matrix as _load_matrix

    return _load_matrix(path)


def resolve(**versions: str) -> Any:
    from maxtext_compat.resolution.resolver import resolve as _resolve

    return _resolve({k.replace("_", "-"): v for k, v in versions.items()}, matrix=matrix())


def shims_call(name: str, *args: Any, **kw: Any) -> Callable[[], Any]:
    def run() -> Any:
        from maxtext_compat import shims

        return getattr(shims, name)(*args, **kw)

    return run


def register_twice() -> None:
    from maxtext_compat import shims

    shims.register_profile("catalog-twice", list, replace=True)
    try:
        shims.register_profile("catalog-twice", list)
    finally:
        shims.unregister_profile("catalog-twice")


def patch_spec(target: str) -> Any:
    from maxtext_compat.shims import PatchSpec

    return PatchSpec(target, lambda original: None)


def cli(*argv: str, matrix_text: str | None = None) -> Callable[[], tuple[int, str]]:
    """Run `maxtext-compat ARGV`; returns (exit code, stderr). matrix_text: a user matrix file to point at."""

    def run() -> tuple[int, str]:
        from maxtext_compat.cli import main

        env = {}
        if matrix_text is not None:
            import tempfile

            with tempfile.NamedTemporaryFile("w", suffix="-matrix.yaml", delete=False) as f:
                f.write(matrix_text)
            env["MAXTEXT_COMPAT_MATRIX"] = f.name
        err, out = io.StringIO(), io.StringIO()
        try:
            with mock.patch.dict(os.environ, env), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
                code = main(list(argv))
        finally:
            if env:
                os.unlink(env["MAXTEXT_COMPAT_MATRIX"])
        return code, err.getvalue()

    return run


NO_FIX = "the message has no Fix: (the error is raised without fix=)"
NEW = {"model_mode": "autoregressive"}


def _row0(d: dict[str, Any]) -> dict[str, Any]:
    return d["maxtext"][0]


CASES: list[Case] = [
    # -- adapters ----------------------------------------------------------------------------------------------
    Case("page-state-on-0.2.5", "adapters", "`page_state=` on MaxText 0.2.3+ (0.2.5 here)",
         lambda: adapter("attention", "0.2.5")("x", "x", page_state="pages"), InvalidArgumentError,
         ("[page_state]", "MaxText 0.2.5", "PR #3948"), "pass kv_cache= and attention_metadata="),
    Case("rope-kwargs-on-0.1.0", "adapters", "`rope_kwargs=` on MaxText 0.1.0",
         lambda: adapter("attention", "0.1.0")("x", "x", rope_kwargs={"max_timescale": 10}), InvalidArgumentError,
         ("[rope_kwargs]", "MaxText 0.1.0"), "configure RoPE in the MaxText config"),
    Case("shared-key-on-0.1.0", "adapters", "`shared_key=` (Gemma 4 KV sharing) on MaxText 0.1.0",
         lambda: adapter("attention", "0.1.0")("x", "x", shared_key="k"), InvalidArgumentError,
         ("[shared_key]",), "needs MaxText 0.2.3 or newer"),
    Case("kv-cache-without-metadata", "adapters", "new call with `kv_cache=` but no `attention_metadata=`",
         lambda: adapter("attention", "0.2.5")("x", "x", kv_cache="KV", **NEW), InvalidArgumentError,
         ("[attention_metadata]", "needs both kv_cache and attention_metadata"), "maxtext_compat.paged"),
    Case("metadata-without-kv-cache", "adapters", "new call with `attention_metadata=` but no `kv_cache=`",
         lambda: adapter("attention", "0.2.5")("x", "x", attention_metadata="MD", **NEW), InvalidArgumentError,
         ("[kv_cache]",), "pass kv_cache=..."),
    Case("transformer-new-call-outside-vllm-mode", "adapters",
         "`model(tokens, pos, kv_caches=None)` on a 0.2.x Transformer whose config has attention='dot_product'",
         lambda: transformer_with_attention("dot_product")("t", "p", kv_caches=None), InvalidArgumentError,
         ("[config.attention]", "returns (hidden, kv_caches)", "'dot_product'"), "call the old way"),
    Case("unknown-kwarg", "adapters", "`kv_caches=` (the Decoder's name) passed to Attention",
         lambda: adapter("attention", "0.2.5")("x", "x", kv_caches=["KV"]), InvalidArgumentTypeError,
         ("[arguments]", "kv_caches", "Attention.__call__(inputs_q"), "pass the arguments by keyword"),
    Case("too-many-positional", "adapters", "six positional arguments to Attention",
         lambda: adapter("attention", "0.2.5")(1, 2, 3, 4, 5, 6), InvalidArgumentTypeError,
         ("[arguments]", "too many positional arguments"), "pass the arguments by keyword"),
    Case("model-mode-fixed-0.1.0", "adapters", "`model_mode=` per call on 0.1.0's Transformer (fixed at construction)",
         lambda: adapter("transformer", "0.1.0")("tokens", "positions", model_mode="autoregressive"),
         InvalidArgumentError, ("[model_mode]", "MaxText 0.1.0"),
         "construct the module with model_mode='autoregressive'"),
    Case("old-call-under-policy-error", "adapters", "old call while the deprecation policy is `error`",
         lambda: adapter("attention", "0.2.5", **policy_row("error"))("x", "x"), OldConventionError,
         ("[call convention]", "removed in 0.9.0"), "out, kv_cache = attention(...)"),
    Case("bad-policy-in-wrap", "adapters", "`wrap(module, deprecation='sometimes')`",
         lambda: wrap(native("attention", "0.2.5")(), deprecation="sometimes"), InvalidArgumentError,
         ("[deprecation]", "sometimes"), "pass deprecation='ignore', 'warn' or 'error'"),
    Case("new-call-under-declared-legacy", "adapters",
         "`attention(x, x, kv_cache=None, attention_metadata=None)` when the caller convention is declared 'legacy'",
         lambda: adapter("attention", "0.2.5", callers="legacy")("x", "x", kv_cache=None, attention_metadata=None),
         ConventionMismatchError, ("[kv_cache / attention_metadata]", "declared 'legacy'", "compat_matrix.yaml row"),
         "declare 'kv_return'"),
    Case("paged-cache-into-mla", "adapters", "a new call with a paged `kv_cache=` on MaxText's MLA attention",
         lambda: mla_adapter()("x", "x", kv_cache=FakeCache(), attention_metadata="MD", **NEW), InvalidArgumentError,
         ("[kv_cache]", "multi-head latent attention", "(8, 16)"), "call MLA without kv_cache"),
    Case("bad-convention-in-wrap", "adapters", "`wrap(module, convention='tuple')`",
         lambda: wrap(native("attention", "0.2.5")(), convention="tuple"), InvalidArgumentError,
         ("[convention]", "'tuple'", "auto, legacy, kv_return"), "use 'kv_return'"),
    Case("bad-convention-in-environment", "adapters", "`MAXTEXT_COMPAT_CONVENTION=new`, then an adapter call",
         with_env("MAXTEXT_COMPAT_CONVENTION", "new", lambda: adapter("attention", "0.2.5")("x", "x")),
         InvalidArgumentError, ("[MAXTEXT_COMPAT_CONVENTION]", "'new'"), "use 'kv_return'"),
    Case("bad-convention-in-install", "shims", "`shims.install(profile, convention='new')`",
         lambda: shims_install_convention("new"), InvalidArgumentError, ("[convention]", "'new'"), "use 'kv_return'"),
    Case("batched-rpa-on-shimmed-0.1.0", "shims",
         "`attention='vllm_batched_rpa'` in a MaxText 0.1.0 config under the vllm-backport shim",
         lambda: validate_kernel_010("vllm_batched_rpa"), ShimRefusedError,
         ("[attention]", "MaxText 0.1.0", "'vllm_batched_rpa'"), "set attention='vllm_rpa'"),
    Case("bad-policy-setter", "adapters", "`set_deprecation_policy('sometimes')`",
         lambda: set_policy("sometimes"), InvalidArgumentError, ("[policy]", "sometimes"),
         "set_deprecation_policy('ignore')"),
    Case("bad-policy-env", "adapters", "MAXTEXT_COMPAT_DEPRECATION=loud, then an old call",
         with_env("MAXTEXT_COMPAT_DEPRECATION", "loud", lambda: adapter("attention", "0.2.5")("x", "x")),
         InvalidArgumentError, ("[MAXTEXT_COMPAT_DEPRECATION]", "loud"),
         "set MAXTEXT_COMPAT_DEPRECATION to ignore, warn or error"),
    Case("strict-flags-on-a-class", "adapters", "`wrap(SomeClass, strict=True)`",
         lambda: wrap(native("attention", "0.2.5"), strict=True), InvalidArgumentError,
         ("[deprecation/strict]",), "set_deprecation_policy / set_strict"),
    Case("not-a-maxtext-layer", "adapters", "`wrap()` of a module that is no Attention/layer/Decoder/Transformer",
         lambda: wrap(NotALayer(), row=matrix().row("0.2.5")), InvalidArgumentTypeError, ("[module]", "NotALayer"),
         "pass kind= explicitly"),
    Case("unknown-kind", "adapters", "`adapted_class(cls, kind='attn')`",
         lambda: adapted(native("attention", "0.2.5"), kind="attn"), InvalidArgumentError, ("[kind]", "attn"),
         "kind='attention'"),
    Case("kv-cache-not-an-array", "adapters", "a writing new call whose `kv_cache=` is not an array",
         lambda: adapter("attention", "0.2.5")("x", "x", kv_cache="KV", attention_metadata="MD", **NEW),
         InvalidArgumentTypeError, ("[kv_cache]", "must be an array", "'KV'"), "KVCacheLayout(...).allocate"),
    Case("kv-caches-entry-not-an-array", "adapters", "a writing Transformer call whose `kv_caches=` holds a None",
         lambda: transformer_with_attention("vllm_rpa")("t", "p", kv_caches=[None], attention_metadata="MD", **NEW),
         InvalidArgumentTypeError, ("[kv_caches[0]]", "must be an array"), "KVCacheLayout(...).allocate"),
    Case("strict-cache-dropped", "adapters", "strict mode: the layer returns no KV cache to a new call",
         strict_dropped, KVCacheNotUpdatedError, ("[kv_cache]", "no KV cache"), "maxtext_compat.shims.install()"),
    # -- shims -------------------------------------------------------------------------------------------------
    Case("unknown-profile", "shims", "`shims.install('no-such-profile')`",
         shims_call("install", "no-such-profile"), ProfileError, ("[no-such-profile]", "vllm-backport"),
         "register it with register_profile()"),
    Case("profile-registered-twice", "shims", "`register_profile` twice under one name",
         register_twice, ProfileError, ("[catalog-twice]", "already registered"), "replace=True"),
    Case("patch-target-without-colon", "shims", "`PatchSpec('pkg.mod.Class.attr', ...)`",
         lambda: patch_spec("MaxText.layers.attentions.Attention.__call__"), InvalidArgumentError,
         ("[PatchSpec.target]", "module.path:Class.attribute"), "separate the module from the attribute path"),
    Case("tensor-parallel-interpreted-on-old-jax", "shims", "tensor parallelism 2 on CPU (interpret mode), jax 0.8.0",
         lambda: mesh_limits(2, jax_version="0.8.0"), KernelUnavailableError,
         ("[mesh]", "loses KV cache writes", "'model' axis 2"), "use tensor parallelism 1, or jax >= 0.9"),
    Case("replicated-kv-heads-interpreted-on-old-jax", "shims",
         "tensor parallelism 4 over 2 KV heads on CPU (interpret mode), jax 0.10.2",
         lambda: mesh_limits(4, jax_version="0.10.2", num_kv_heads=2), KernelUnavailableError,
         ("[mesh]", "deadlocks", "each held 2 times"), "use tensor parallelism <= 2, or jax >= 0.11.2"),
    Case("write-path-hooks-not-callable", "shims", "`WritePath(ensure_hooks=...)` given a value, not a function",
         lambda: write_path_with(hooks="backport-hooks"), InvalidArgumentTypeError,
         ("[ensure_hooks]", "callable", "'backport-hooks'"), "pass the function itself"),
    Case("interpret-mode-not-callable", "shims", "`kernel.interpret.set_interpret_mode(a context, not its factory)`",
         lambda: set_interpret_mode(contextlib.nullcontext()), InvalidArgumentTypeError,
         ("[mode]", "not callable", "nullcontext"), "pass the function that returns the context"),
    # -- paged cache ---------------------------------------------------------------------------------------------
    Case("page-size-vs-packing", "paged cache", "page_size 15 for a bfloat16 cache (packing 2)",
         lambda: layout(page_size=15, dtype="bfloat16"), InvalidArgumentError, ("[page_size]", "multiple of 2"),
         "use page_size=16"),
    Case("integer-cache-dtype", "paged cache", "an int8 KV cache",
         lambda: layout(dtype="int8"), InvalidArgumentError, ("[dtype]", "int8"), "quantise outside the kernel"),
    Case("tp-does-not-split-heads", "paged cache", "tp=3 over 2 KV heads",
         lambda: layout(tp=3), InvalidArgumentError, ("[tp]", "num_kv_heads=2"), "use tp=2 or another multiple of 2"),
    Case("zero-pages", "paged cache", "num_pages=0",
         lambda: layout(num_pages=0), InvalidArgumentError, ("[num_pages]", ">= 1"), "pass num_pages >= 1"),
    Case("float-page-count", "paged cache", "num_pages=2.0",
         lambda: layout(num_pages=2.0), InvalidArgumentTypeError, ("[num_pages]", "2.0"),
         "pass num_pages as an int >= 1: a float would be truncated"),
    Case("hd64-for-head-dim-128", "paged cache", "hd64=True with head_dim 128",
         lambda: layout(hd64=True), InvalidArgumentError, ("[hd64]", "128"), "leave hd64=None"),
    Case("cache-wrong-shape", "paged cache", "a cache of another layout (shape (16, 16, 2, 1, 128))",
         lambda: layout().check_cache(cache_like((16, 16, 2, 1, 128))), InvalidArgumentError,
         ("[kv_cache]", "(16, 16, 4, 1, 128)", "(16, 16, 2, 1, 128)"), "KVCacheLayout(...).allocate"),
    Case("cache-wrong-dtype", "paged cache", "a bfloat16 cache for a float32 layout",
         lambda: layout().check_cache(cache_like((16, 16, 4, 1, 128), "bfloat16")), InvalidArgumentError,
         ("[kv_cache]", "bfloat16"), "allocate the cache in float32"),
    Case("cache-not-5d", "paged cache", "a 4-D cache (heads and packing merged)",
         lambda: layout_for((16, 16, 4, 128)), InvalidArgumentError, ("[kv_cache]", "5-D"),
         "KVCacheLayout(...).allocate"),
    Case("allocator-out-of-pages", "paged cache", "a request needing more pages than are free",
         lambda: fill(allocator(), ("a", 4), ("b", 5)), CacheCapacityError, ("[num_tokens]", "1 free"),
         "free finished requests"),
    Case("allocator-unknown-request", "paged cache", "pages of a request the allocator never saw",
         lambda: allocator().pages("nope"), InvalidArgumentError, ("[request_id]", "'nope'"),
         "allocate (or append to) the request first"),
    Case("allocator-without-pages", "paged cache", "`PageAllocator(0, 4)`",
         lambda: allocator(0, 4), InvalidArgumentError, ("[num_pages]", ">= 1"), "pass num_pages >= 1"),
    Case("allocator-beyond-int32", "paged cache", "`PageAllocator(2**40, 16)` (more token slots than int32 counts)",
         lambda: allocator(2**40, 16), InvalidArgumentError, ("[num_pages]", "2**31 - 1", "int32"),
         "at most 134,217,727 pages of 16 tokens"),
    Case("allocator-page-size-beyond-int32", "paged cache", "`PageAllocator(1, 2**31)` (one page past int32)",
         lambda: allocator(1, 2**31), InvalidArgumentError, ("[page_size]", "2**31 - 1"),
         "size the cache from its memory"),
    Case("allocator-float-count", "paged cache", "`PageAllocator(16.0, 16)` (a whole float)",
         lambda: allocator(16.0, 16), InvalidArgumentTypeError, ("[num_pages]", "16.0 (float)"),
         "a float would be truncated"),
    Case("allocator-str-count", "paged cache", "`PageAllocator(\"16\", 16)`",
         lambda: allocator("16", 16), InvalidArgumentTypeError, ("[num_pages]", "'16' (str)"),
         "a str is not converted"),
    Case("allocator-bool-count", "paged cache", "`PageAllocator(True, 16)` (a bool is an int to Python)",
         lambda: allocator(True, 16), InvalidArgumentTypeError, ("[num_pages]", "True (bool)"),
         "True/False is not a count"),
    Case("allocator-float-page-size", "paged cache", "`PageAllocator(16, 16.5).append(\"a\", 1)`",
         lambda: allocator(16, 16.5).append("a", 1), InvalidArgumentTypeError, ("[page_size]", "16.5"),
         "pass page_size as an int >= 1"),
    Case("append-float-q-len", "paged cache", "`append(\"a\", q_len=2.5)`",
         lambda: allocator(16, 16).append("a", q_len=2.5), InvalidArgumentTypeError, ("[q_len]", "2.5"),
         "pass q_len as an int >= 1"),
    Case("append-list-request-id", "paged cache", "`append([\"a\"], 3)` (a list as the request id)",
         lambda: allocator(16, 16).append(["a"], 3), InvalidArgumentTypeError, ("[request_id]", "hashable"),
         "pass request_id as a hashable value"),
    Case("block-table-too-narrow", "paged cache", "a block table narrower than a request's pages",
         lambda: fill(allocator(8, 4), ("a", 9)).block_table(["a"], 2), CacheCapacityError,
         ("[pages_per_seq]", "3"), "raise pages_per_seq"),
    # -- metadata builder ----------------------------------------------------------------------------------------
    Case("empty-step", "metadata builder", "`build_metadata([])`",
         lambda: build([]), InvalidArgumentError, ("[seqs]",), "skip the kernel call"),
    Case("no-new-token", "metadata builder", "a sequence with q_len 0",
         lambda: build([seq(0, 4)]), InvalidArgumentError, ("[seqs[0].q_len]",), "drop sequences with nothing"),
    Case("q-len-over-kv-len", "metadata builder", "q_len 5 > kv_len 3",
         lambda: build([seq(5, 3)]), InvalidArgumentError, ("[seqs[0].kv_len]", "q_len=5"),
         "kv_len = tokens already cached + q_len"),
    Case("more-tokens-than-the-cache", "metadata builder", "kv_len 257 in a 16 x 16-token cache",
         lambda: build([seq(1, 257, tuple(range(16)))]), CacheCapacityError, ("[seqs[0].kv_len]", "<= 256"),
         "allocate a cache with more pages"),
    Case("too-few-pages", "metadata builder", "kv_len 40 with 2 pages of 16",
         lambda: build([seq(8, 40, (0, 1))]), CacheCapacityError, ("[seqs[0].pages]", ">= 3 pages"),
         "allocate the pages first"),
    Case("page-id-out-of-range", "metadata builder", "page id 16 in a 16-page cache",
         lambda: build([seq(1, 3, (16,))]), InvalidArgumentError, ("[seqs[0].pages]", "16"),
         "PageAllocator of this cache"),
    Case("max-num-tokens-too-small", "metadata builder", "9 new tokens, max_num_tokens=8",
         lambda: build([seq(9, 9)], max_num_tokens=8), CacheCapacityError, ("[max_num_tokens]", ">= 9"),
         "raise max_num_tokens"),
    Case("max-num-seqs-too-small", "metadata builder", "3 sequences, max_num_seqs=2",
         lambda: build([seq(1, 1, (0,)), seq(1, 1, (1,)), seq(1, 1, (2,))], max_num_seqs=2), CacheCapacityError,
         ("[max_num_seqs]", ">= 3"), "raise max_num_seqs"),
    Case("pages-per-seq-too-small", "metadata builder", "kv_len 40 (3 pages), pages_per_seq=2",
         lambda: build([seq(1, 40)], pages_per_seq=2), CacheCapacityError, ("[pages_per_seq]", ">= 3"),
         "raise pages_per_seq"),
    Case("cu-q-lens-length", "metadata arrays", "cu_q_lens one entry short",
         lambda: check(cu_q_lens=(0, 5)), InvalidArgumentError, ("[cu_q_lens]", "length 3"),
         "pass cu_q_lens with len(kv_lens) + 1 = 3 entries"),
    Case("distribution-length", "metadata arrays", "distribution with 2 entries",
         lambda: check(distribution=(0, 1)), InvalidArgumentError, ("[distribution]", "length 3"),
         "pass distribution as 3 int32 values"),
    Case("block-table-length", "metadata arrays", "page_indices not a multiple of len(kv_lens)",
         lambda: check(page_indices=(0, 1, 2)), InvalidArgumentError, ("[page_indices]", "multiple"),
         "pass page_indices as the block table flattened"),
    Case("cu-q-lens-start", "metadata arrays", "cu_q_lens[0] = 1",
         lambda: check(cu_q_lens=(1, 5, 5)), InvalidArgumentError, ("[cu_q_lens[0]]",),
         "make cu_q_lens cumulative from 0"),
    Case("empty-kv-lens", "metadata arrays", "kv_lens = []",
         lambda: check(kv_lens=(), cu_q_lens=(0,)), InvalidArgumentError, ("[kv_lens]",),
         "pass kv_lens with one entry per batch slot"),
    Case("prefill-only-segment", "metadata arrays", "distribution (0, 1, 1): a prefill-only segment",
         lambda: check(distribution=(0, 1, 1)), InvalidArgumentError, ("[distribution]", "(0, 0, 1)"),
         "put non-decode sequences in the mixed segment"),
    Case("block-table-out-of-range", "metadata arrays", "page_indices[0] = 16 in a 16-page cache",
         lambda: check(page_indices=(16, 1, 2, 3)), InvalidArgumentError, ("[page_indices[0]]", "16"),
         "use page ids of this cache"),
    Case("kv-len-under-q-len", "metadata arrays", "kv_lens[0] = 3 for 5 new tokens",
         lambda: check(kv_lens=(3, 0)), InvalidArgumentError, ("[kv_lens[0]]", "q_len=5"),
         "kv_lens counts the cached tokens"),
    Case("decode-with-two-tokens", "metadata arrays", "a decode-segment sequence with 2 new tokens",
         lambda: check(kv_lens=(5, 0), cu_q_lens=(0, 2, 2), distribution=(1, 1, 1)), InvalidArgumentError,
         ("[cu_q_lens[0:2]]", "q_len=2"), "order sequences decode-first"),
    Case("two-writers-one-page", "metadata arrays", "two sequences writing new tokens into page 0",
         lambda: check(kv_lens=(2, 2), page_indices=(0, 0), cu_q_lens=(0, 2, 4), distribution=(0, 0, 2)),
         InvalidArgumentError, ("[page_indices[1]]", "page 0"), "give each request its own pages"),
    Case("page-listed-twice", "metadata arrays", "a block-table row listing page 3 twice for one 20-token request",
         lambda: check(kv_lens=(20, 0), page_indices=(3, 3, 0, 0), cu_q_lens=(0, 8, 8), max_num_tokens=8,
                       distribution=(0, 0, 1)), InvalidArgumentError,
         ("[page_indices[1]]", "lists one page twice"), "give each position range its own page"),
    Case("distribution-counts-fewer", "metadata arrays", "distribution[2] = 1 with two sequences in cu_q_lens",
         lambda: check(kv_lens=(5, 3), page_indices=(0, 1, 2, 3), cu_q_lens=(0, 5, 8), distribution=(0, 0, 1)),
         InvalidArgumentError, ("[distribution]", "never be written"), "set distribution[2]"),
    Case("float-page-id", "metadata arrays", "page id 1.7 in page_indices",
         lambda: check(page_indices=(1.7, 1, 2, 3)), InvalidArgumentTypeError, ("[page_indices[0]]", "truncated"),
         "never round a page id"),
    Case("negative-position", "metadata arrays", "input_positions[0] = -1 for a 5-token prefill",
         lambda: check(input_positions=[-1, 1, 2, 3, 4]), InvalidArgumentError,
         ("[input_positions[0]]", "RoPE"), "kv_len - q_len ... kv_len - 1"),
    Case("max-num-seqs-float", "metadata builder", "`build_metadata(..., max_num_seqs=2.0)`",
         lambda: build([seq(1, 1, (0,))], max_num_seqs=2.0), InvalidArgumentTypeError, ("[max_num_seqs]", "2.0"),
         "pass max_num_seqs as an int >= 1 or None"),
    Case("slice-from-freed-pages", "metadata builder",
         "a SequenceSlice built by hand from pages freed and handed to another request (it wrote over their K/V)",
         lambda: build([freed_and_reused_pages()], max_num_tokens=8, max_num_seqs=2, pages_per_seq=4),
         StaleSliceError, ("[seqs[0] (request 'a').pages]", "belongs to request 'b' now"),
         "cut a new slice with PageAllocator.append"),
    Case("slice-after-free", "metadata builder", "a SequenceSlice used after PageAllocator.free()",
         lambda: build([stale_slice()], max_num_tokens=8, max_num_seqs=2, pages_per_seq=4), StaleSliceError,
         ("[seqs[0] (request 'a')]", "was freed"), "cut a new slice with PageAllocator.append"),
    Case("more-tokens-than-q-rows", "metadata arrays", "cu_q_lens ends at 9 with 8 q rows",
         lambda: check(kv_lens=(9, 0), cu_q_lens=(0, 9, 9)), CacheCapacityError, ("[cu_q_lens]", "<= 8"),
         "pad q/k/v"),
    Case("metadata-missing-fields", "metadata arrays", "an AttentionMetadata without request_distribution",
         lambda: metadata_arrays(seq_lens=[1], block_tables=[0], query_start_loc=[0, 1]), InvalidArgumentError,
         ("[metadata]", "request_distribution"), "build_metadata"),
    # -- matrix loader -------------------------------------------------------------------------------------------
    Case("malformed-yaml", "matrix loader", "`schema_version: [1` (unclosed flow list)",
         lambda: parse("schema_version: [1\n"), MatrixError, ("[user/compat_matrix.yaml]", "line 2"),
         "fix the YAML syntax"),
    Case("unsafe-python-tag", "matrix loader", "`!!python/object/apply:os.system [...]`",
         lambda: parse("x: !!python/object/apply:os.system ['true']\n"), MatrixError,
         ("[user/compat_matrix.yaml]", "python/object/apply:os.system"), "no !!python tags"),
    Case("custom-tag", "matrix loader", "`!custom 1`",
         lambda: parse("x: !custom 1\n"), MatrixError, ("[user/compat_matrix.yaml]", "!custom"), "custom tags"),
    Case("duplicate-key", "matrix loader", "`a: 1` twice in one mapping",
         lambda: parse("a: 1\na: 2\n"), MatrixError, ("[user/compat_matrix.yaml]", "duplicate key 'a'"),
         "fix the YAML syntax"),
    Case("unhashable-key", "matrix loader", "a list as a mapping key (`? [a, b]: 1`)",
         lambda: parse("? [a, b]\n: 1\n"), MatrixError, ("[user/compat_matrix.yaml]", "unhashable key"),
         "fix the YAML syntax"),
    Case("impossible-date", "matrix loader", "`date: 2025-02-30` (unquoted, not a date)",
         lambda: parse("date: 2025-02-30\n"), MatrixError, ("[user/compat_matrix.yaml]", "day is out of range"),
         "quote unusual scalars"),
    Case("missing-required-key", "matrix loader", "a row without `convention:`",
         mutated(lambda d: _row0(d).pop("convention")), MatrixError, ("maxtext[0].convention", "missing"),
         "add `convention:` under `maxtext[0]`"),
    Case("unknown-key", "matrix loader", "a typo at the top level (`environmnets:`)",
         mutated(lambda d: d.update(environmnets={})), MatrixError, ("environmnets",), "remove or rename the key"),
    Case("unsupported-schema", "matrix loader", "`schema_version: 2`",
         mutated(lambda d: d.update(schema_version=2)), MatrixError, ("schema_version", "unsupported"),
         "upgrade maxtext-compat"),
    Case("wrong-type", "matrix loader", "`schema_version: one`",
         mutated(lambda d: d.update(schema_version="one")), MatrixError, ("schema_version", "an integer"),
         "set `schema_version` to an integer"),
    Case("unknown-convention", "matrix loader", "`convention: newest`",
         mutated(lambda d: _row0(d).update(convention="newest")), MatrixError,
         ("maxtext[0].convention", "kv_scan_carry"), "set `maxtext[0].convention` to one of"),
    Case("convention-vs-params", "matrix loader", "`convention: legacy` with kv_cache in params.attention",
         mutated(lambda d: _row0(d)["params"].update(attention=["kv_cache"])), MatrixError,
         ("maxtext[0].convention", "disagrees", "Expected: kv_return or kv_scan_carry"),
         "set convention: legacy when Attention.__call__ has no kv_cache"),
    Case("bad-requirement", "matrix loader", "requirement `jax==` in a pin set",
         mutated(lambda d: d["pin_sets"]["maxtext-0.2.5"]["requirements"].append("jax==")), MatrixError,
         ("pin_sets.maxtext-0.2.5", "'jax=='"), "PEP 508"),
    Case("pin-set-test-plan", "matrix loader", "`serving: true` in a pin set (a CI key)",
         mutated(lambda d: d["pin_sets"]["maxtext-0.2.5"].update(serving=True)), MatrixError,
         ("pin_sets.maxtext-0.2.5.serving", "not to a pin set"), "tests/environments.yaml"),
    Case("overlapping-ranges", "matrix loader", "two tpu_inference rows covering 0.11.5",
         mutated(lambda d: d["tpu_inference"][1].update(versions=">=0.11.5,<0.18.0")), MatrixError,
         ("tpu_inference", "overlap"), "disjoint"),
    Case("missing-matrix-file", "matrix loader", "`load_matrix('nope.yaml')`",
         lambda: load_matrix("nope.yaml"), MatrixError,
         ("[nope.yaml]", "not found"), "set MAXTEXT_COMPAT_MATRIX"),
    Case("unknown-environment", "matrix loader", "`matrix.environment('nope')`",
         lambda: matrix().environment("nope"), MatrixError, ("environments", "'nope'"), "maxtext-compat envs"),
    Case("unknown-pin-set", "matrix loader", "`matrix.pin_set('9.9')`",
         lambda: matrix().pin_set("9.9"), MatrixError, ("pin_sets", "'9.9'", "0.2.5", "maxtext-0.1.0-jax011"),
         "maxtext-compat pins"),
    Case("row-of-unknown-release", "matrix loader", "`matrix.row('9.9')`",
         lambda: matrix().row("9.9"), ResolutionError, ("9.9",), "maxtext_compat.resolve()"),
    # -- resolver ------------------------------------------------------------------------------------------------
    Case("unknown-release", "resolver", "maxtext 0.3.0 (not in the matrix)",
         lambda: resolve(maxtext="0.3.0"), UnknownReleaseWarning, ("0.3.0", "nearest row 0.2.5"),
         "maxtext-compat doctor", kind="warns"),
    Case("unknown-tpu-inference", "resolver", "tpu-inference 0.99.0 (newer than every row)",
         lambda: resolve(tpu_inference="0.99.0"), UnknownReleaseWarning, ("0.99.0", "nearest row"),
         "not covered by", kind="warns"),
    Case("incompatible-pair", "resolver", "maxtext 0.2.0 + tpu-inference 0.32.0",
         lambda: resolve(maxtext="0.2.0", tpu_inference="0.32.0"), IncompatibleVersionsError,
         ("[versions]", "maxtext 0.2.0", "tpu-inference 0.32.0"), "nearest compatible pairs"),
    Case("jax-not-pinned", "resolver", "tpu-inference 0.32.0 + jax 0.7.0",
         lambda: resolve(tpu_inference="0.32.0", jax="0.7.0"), IncompatibleVersionsError,
         ("[versions]", "jax 0.7.0"), "install jax==0.11.2"),
    Case("vllm-tpu-mismatch", "resolver", "tpu-inference 0.32.0 + vllm-tpu 0.31.0",
         lambda: resolve(tpu_inference="0.32.0", vllm_tpu="0.31.0"), IncompatibleVersionsError,
         ("[versions]", "vllm-tpu 0.31.0"), "install vllm-tpu==0.32.0"),
    Case("not-a-version", "resolver", "maxtext 'zero'",
         lambda: resolve(maxtext="zero"), InvalidArgumentError, ("[versions['maxtext']]", "'zero'"),
         "as published on PyPI"),
    # -- CLI -----------------------------------------------------------------------------------------------------
    Case("cli-incompatible", "CLI", "`maxtext-compat resolve --maxtext 0.2.0 --tpu-inference 0.32.0`",
         cli("resolve", "--maxtext", "0.2.0", "--tpu-inference", "0.32.0"), IncompatibleVersionsError,
         ("[versions]", "tpu-inference 0.32.0"), "nearest compatible pairs", kind="exit"),
    Case("cli-not-a-version", "CLI", "`maxtext-compat resolve --maxtext zero`",
         cli("resolve", "--maxtext", "zero"), InvalidArgumentError, ("[versions['maxtext']]",),
         "as published on PyPI", kind="exit"),
    Case("cli-broken-matrix", "CLI", "MAXTEXT_COMPAT_MATRIX pointing at a file with a duplicate key",
         cli("resolve", "--maxtext", "0.2.5", matrix_text="a: 1\na: 2\n"), MatrixError,
         ("-matrix.yaml]", "duplicate key"), "fix the YAML syntax", kind="exit"),
    Case("cli-envs-python-no-name", "CLI", "`maxtext-compat envs python` without a name",
         cli("envs", "python"), CompatError, ("[names]", "exactly one"), "envs python maxtext-0.2.5", kind="exit"),
    Case("cli-envs-list-unknown", "CLI", "`maxtext-compat envs list no-such-env` (listed every environment, exit 0)",
         cli("envs", "list", "no-such-env"), MatrixError, ("environments", "'no-such-env'"),
         "maxtext-compat envs", kind="exit"),
    Case("cli-envs-python-unknown", "CLI", "`maxtext-compat envs python no-such-env`",
         cli("envs", "python", "no-such-env"), MatrixError, ("environments", "'no-such-env'"),
         "maxtext-compat envs", kind="exit"),
]  # fmt: skip


class MessageDefect(AssertionError):
    """The error breaks the catalog's rule (untyped, no argument, no Fix:): what a `defect` case expects."""


def check_case(case: Case) -> None:
    """The assertion every catalog row makes (also used by the kernel-level catalog).

    Mismatches with the case itself (another error class, a missing word) are plain AssertionErrors;
    only a message that breaks the rule raises MessageDefect, which is all a `defect` case may xfail on."""
    if case.kind == "warns":
        with pytest.warns(case.error) as record:
            case.call()
        msg = " ".join(str(w.message) for w in record if issubclass(w.category, case.error))
        for word in (*case.names, case.fix):
            assert word in msg, f"{word!r} not in {msg!r}"
        return
    if case.kind == "exit":
        code, err = case.call()
        assert code == 2, err
        assert f"maxtext-compat: error: {case.error.__name__}: " in err, err
        msg = err
    else:
        with pytest.raises(Exception) as info:
            case.call()
        exc = info.value
        if not isinstance(exc, CompatError):
            raise MessageDefect(f"untyped {type(exc).__name__}: {exc}")
        assert isinstance(exc, case.error), f"{type(exc).__name__} instead of {case.error.__name__}: {exc}"
        msg = str(exc)
        if not exc.argument:
            raise MessageDefect(f"the error names no argument: {msg!r}")
        assert msg.startswith(f"[{exc.argument}]"), msg
    for word in case.names:
        assert word in msg, f"{word!r} not in {msg!r}"
    if "Fix:" not in msg:
        raise MessageDefect(f"no Fix: in {msg!r}")
    assert case.fix in msg.split("Fix:", 1)[1], f"{case.fix!r} not in the fix of {msg!r}"


def as_params(cases: list[Case]) -> list[Any]:
    """Parameters with strict xfail marks on `defect` cases (they may only fail with MessageDefect)."""

    def marks(c: Case) -> list[Any]:
        return [pytest.mark.xfail(strict=True, raises=MessageDefect, reason=f"defect: {c.defect}")] if c.defect else []

    return [pytest.param(c, id=c.id, marks=marks(c)) for c in cases]


@pytest.mark.parametrize("case", as_params(CASES))
def test_bad_input_is_a_typed_error_naming_the_argument_and_the_fix(case: Case):
    check_case(case)


def test_the_catalog_is_large_and_its_ids_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) and len(CASES) >= 30
    areas = {c.area for c in CASES}
    assert {"adapters", "paged cache", "metadata builder", "matrix loader", "resolver", "CLI"} <= areas


def test_the_docs_table_is_generated_from_the_catalog():
    spec = importlib.util.spec_from_file_location("_gen_catalog_table", REPO / "tools" / "gen_catalog_table.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    current = (REPO / "docs" / "bad-input-catalog.md").read_text()
    assert current == gen.render(), "docs/bad-input-catalog.md is stale: run `python tools/gen_catalog_table.py`"
