"""The bad-input catalog at kernel level: raw arrays into the RPA dispatcher, jax-backed layouts and metadata.

Same table format and the same check as tests/unit/test_bad_input_catalog.py (loaded from
there); these cases need jax arrays and tpu-inference's mesh axes, so they run in the
environments that install tpu-inference. Every error must come before the kernel runs (the
kernel entry point is replaced by a tripwire). The module imports no jax at import time, so
tools/gen_catalog_table.py can read CASES anywhere.
"""

from __future__ import annotations

import importlib.util
import types
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from maxtext_compat.errors import (
    CacheCapacityError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    KernelUnavailableError,
    KVCacheNotUpdatedError,
)

pytestmark = pytest.mark.envs("maxtext-0.2.5", "maxtext-0.2.1", "maxtext-0.1.0-jax011")


def _load_unit_catalog() -> Any:
    """The unit catalog module (Case, check_case, as_params), loaded by path under a private name."""
    name = "_catalog_unit"
    import sys

    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "unit" / "test_bad_input_catalog.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_unit = _load_unit_catalog()
Case = _unit.Case
PAGES, PAGE, TOKENS, SEQS, PER_SEQ = 16, 16, 32, 4, 4


@cache
def step(head_dim: int = 128) -> Any:
    """One mixed prefill/decode step (4 sequences, shuffled pages) with its cache and metadata."""
    from helpers.reference_attention import make_ragged_step
    from maxtext_compat import paged

    layout = paged.KVCacheLayout(PAGES, PAGE, 2, head_dim, "float32")
    return make_ragged_step(layout, [(9, 40), (1, 37), (5, 5), (1, 17)], num_q_heads=4, max_num_tokens=TOKENS,
                            max_num_seqs=SEQS, pages_per_seq=PER_SEQ, seed=3)  # fmt: skip


def raw(**changes: Any) -> Any:
    """tpu-inference-style metadata holding the step's raw arrays, some replaced via `changes` (name -> f(array))."""
    import jax.numpy as jnp

    a = step().metadata.arrays()
    arrays = {n: jnp.asarray(a[n]) for n in ("kv_lens", "page_indices", "cu_q_lens", "distribution")}
    for name, change in changes.items():
        arrays[name] = change(arrays[name])
    return types.SimpleNamespace(
        seq_lens=arrays["kv_lens"],
        block_tables=arrays["page_indices"],
        query_start_loc=arrays["cu_q_lens"],
        request_distribution=arrays["distribution"],
    )


def rpa_call(*, head_dim: int = 128, metadata: Any = None, mesh: Any = None, **arrays_and_options: Any) -> Any:
    """rpa.ragged_paged_attention on the step, with q/k/v/kv_cache or options replaced."""
    from maxtext_compat import paged
    from maxtext_compat.kernel import rpa

    s = step(head_dim)
    parts = {"q": s.q, "k": s.k, "v": s.v, "kv_cache": s.kv_cache}
    options = {k: v for k, v in arrays_and_options.items() if k not in parts}
    parts.update({k: v for k, v in arrays_and_options.items() if k in parts})
    md = s.metadata if metadata is None else metadata
    return rpa.ragged_paged_attention(*parts.values(), md, mesh=mesh or paged.make_mesh(1), **options)


def jnp() -> Any:
    import jax.numpy

    return jax.numpy


def edit(array_name: str, index: int, value: int) -> Any:
    """The step's metadata array with one entry changed."""
    import numpy as np

    a = np.asarray(step().metadata.arrays()[array_name]).copy()
    a[index] = value
    return lambda _: jnp().asarray(a)


def other_layout_cache() -> Any:
    from maxtext_compat import paged

    return jnp().zeros(paged.KVCacheLayout(PAGES, PAGE, 1, 128, "float32").shape)


def metadata_for_another_cache() -> Any:
    from maxtext_compat import paged

    other = paged.KVCacheLayout(PAGES, PAGE // 2, 2, 128, "float32")
    return paged.build_metadata([paged.SequenceSlice(1, 3, (1,))], other, max_num_tokens=TOKENS)


def mesh_without_model_axis() -> Any:
    import jax
    import numpy as np
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()[:1]), ("x",))


def curried_row() -> Any:
    from maxtext_compat.matrix import load_matrix

    return next(r for r in load_matrix().tpu_inference if r.rpa.call_form == "curried")


def allocate_sharded_with_another_tp() -> Any:
    from maxtext_compat import paged

    return paged.KVCacheLayout(6, 16, 2, 128, tp=2).allocate(mesh=paged.make_mesh(1))


def allocate_no_layers() -> Any:
    from maxtext_compat import paged

    return paged.KVCacheLayout(6, 16, 2, 128).allocate(0)


@cache
def tiny_model() -> Any:
    """(cfg, mesh, the wrapped tiny Transformer) of the installed release, as a server would build it."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from maxtext_compat.adapters import wrap
    from maxtext_compat.cpu import rpa as cpu_rpa
    from maxtext_compat.testing import tiny

    assert cpu_rpa.install().active
    row = tiny.installed_row()
    cfg = tiny.tiny_config("default", vllm=row.has_kv_params)
    if row.has_kv_params:  # vllm.yml meshes have no ici knob for 'model': one device, every axis 1
        mesh = Mesh(np.array(jax.devices()[:1]).reshape([1] * len(cfg.mesh_axes)), cfg.mesh_axes)
    else:
        mesh = tiny.tiny_mesh(cfg)
    with tiny.mesh_context(cfg, mesh):
        model = tiny.tiny_transformer(cfg, mesh, model_mode="autoregressive" if row.has_kv_params else None)
    return cfg, mesh, wrap(model)


def new_call(layers_delta: int = 0, *, attention: bool = False, cache: Any = None) -> Any:
    """A writing new call of the tiny model with `layers_delta` caches more than layers, or (attention=True) of a
    tiny Attention with `cache` as its kv_cache; eager, so each check runs before anything is traced."""
    from maxtext_compat.adapters import wrap
    from maxtext_compat.testing import tiny

    cfg, mesh, model = tiny_model()
    tokens, pos, caches, md = _new_call_step(cfg)
    mode = {"model_mode": "autoregressive"} if tiny.installed_row().has_kv_params else {}
    with tiny.mesh_context(cfg, mesh):
        if attention:
            attn = wrap(tiny.tiny_attention(cfg, mesh, batch=40, seq=1, **mode))
            x = jnp().zeros((40, 1, cfg.emb_dim))
            return attn(x, x, pos, None, model_mode="autoregressive", kv_cache=cache, attention_metadata=md)
        kvs = (
            list(caches) + list(caches[:layers_delta])
            if layers_delta > 0
            else list(caches)[: len(caches) + layers_delta]
        )
        return model(tokens, pos, kv_caches=kvs, attention_metadata=md, model_mode="autoregressive")


def a_cache(dtype: str = "float32", *, as_list: bool = False) -> Any:
    from maxtext_compat import paged

    cfg = tiny_model()[0]
    one = paged.KVCacheLayout(8, 16, cfg.num_kv_heads, cfg.head_dim, dtype).allocate(1)[0]
    return [one] if as_list else one


def kernel_order_wrong_rows() -> Any:
    import numpy as np

    return step().metadata.to_kernel_order(np.zeros((3, 4, 128), np.float32))


CASES: list[Any] = [
    Case("rpa-cache-of-another-layout", "paged cache", "a kv_cache allocated for 1 KV head, q/k/v with 2",
         lambda: rpa_call(kv_cache=other_layout_cache()), InvalidArgumentError, ("[kv_cache]", "v3 layout"),
         "KVCacheLayout(...).allocate"),
    Case("rpa-cache-dtype", "paged cache", "a bfloat16 kv_cache with float32 q/k/v",
         lambda: rpa_call(kv_cache=step().kv_cache.astype(jnp().bfloat16)), InvalidArgumentError,
         ("[kv_cache]", "bfloat16"), "cast q/k/v to the cache dtype"),
    Case("rpa-q-not-3d", "paged cache", "q of shape [tokens, heads * head_dim]",
         lambda: rpa_call(q=step().q.reshape(TOKENS, -1)), InvalidArgumentError, ("[q]", "3-D"),
         "reshape q to [tokens, heads, head_dim]"),
    Case("rpa-k-v-shapes", "paged cache", "v with one KV head fewer than k",
         lambda: rpa_call(v=step().v[:, :1]), InvalidArgumentError, ("[v]",),
         "pass v with the same [tokens, KV heads, head_dim] shape as k"),
    Case("rpa-token-rows", "paged cache", "k/v with fewer token rows than q",
         lambda: rpa_call(k=step().k[:8], v=step().v[:8]), InvalidArgumentError, ("[k]", "rows"),
         "pass k and v with one row per q row"),
    Case("rpa-head-dim", "paged cache", "k/v with head_dim 64, q with 128",
         lambda: rpa_call(k=step().k[..., :64], v=step().v[..., :64]), InvalidArgumentError, ("[k]", "head_dim"),
         "pass k and v with head_dim 128"),
    Case("rpa-gqa-heads", "paged cache", "3 query heads over 2 KV heads",
         lambda: rpa_call(q=step().q[:, :3]), InvalidArgumentError, ("[q]", "multiple of 2"),
         "pass q with a multiple of 2 heads"),
    Case("rpa-metadata-dtype", "metadata arrays", "kv_lens as float32",
         lambda: rpa_call(metadata=raw(kv_lens=lambda a: a.astype(jnp().float32))), InvalidArgumentError,
         ("[kv_lens]", "int32", "float32"), "kv_lens.astype(jnp.int32)"),
    Case("rpa-metadata-2d", "metadata arrays", "page_indices as a 2-D [seqs, pages] block table",
         lambda: rpa_call(metadata=raw(page_indices=lambda a: a.reshape(SEQS, PER_SEQ))), InvalidArgumentError,
         ("[page_indices]", "1-D"), "flatten page_indices: page_indices.reshape(-1)"),
    Case("rpa-cu-q-lens-length", "metadata arrays", "cu_q_lens one entry short (array)",
         lambda: rpa_call(metadata=raw(cu_q_lens=lambda a: a[:-1])), InvalidArgumentError,
         ("[cu_q_lens]", "length 5"), "pass cu_q_lens with len(kv_lens) + 1 = 5 entries"),
    Case("rpa-distribution-length", "metadata arrays", "distribution with 6 entries (array)",
         lambda: rpa_call(metadata=raw(distribution=lambda a: jnp().concatenate([a, a]))), InvalidArgumentError,
         ("[distribution]", "length 3"), "pass distribution as 3 int32 values"),
    Case("rpa-block-table-out-of-range", "metadata arrays", "page_indices[0] = 16 in a 16-page cache (array)",
         lambda: rpa_call(metadata=raw(page_indices=edit("page_indices", 0, PAGES))), InvalidArgumentError,
         ("[page_indices[0]]", "16"), "use page ids of this cache"),
    Case("rpa-q-len-over-kv-len", "metadata arrays", "kv_lens[3] = 3 for a 5-token prefill (array)",
         lambda: rpa_call(metadata=raw(kv_lens=edit("kv_lens", 3, 3))), InvalidArgumentError,
         ("[kv_lens[3]]", "q_len=5"), "kv_lens counts the cached tokens"),
    Case("rpa-more-tokens-than-q-rows", "metadata arrays", "8 rows of q/k/v for a 16-token batch",
         lambda: rpa_call(q=step().q[:8], k=step().k[:8], v=step().v[:8]), CacheCapacityError,
         ("[cu_q_lens]", "<= 8"), "pad q/k/v"),
    Case("rpa-kv-len-beyond-block-table", "metadata arrays", "kv_lens[2] = 65 with 4 pages of 16 per sequence",
         lambda: rpa_call(metadata=raw(kv_lens=edit("kv_lens", 2, PER_SEQ * PAGE + 1))), CacheCapacityError,
         ("[kv_lens[2]]", "<= 64"), "raise pages_per_seq"),
    Case("rpa-metadata-for-another-cache", "metadata arrays", "metadata built for 8-token pages, cache of 16",
         lambda: rpa_call(metadata=metadata_for_another_cache()), InvalidArgumentError,
         ("[metadata]", "page_size 8"), "build the metadata with the layout of this kv_cache"),
    Case("rpa-mesh-without-model-axis", "paged cache", "a mesh with one axis 'x'",
         lambda: rpa_call(mesh=mesh_without_model_axis()), InvalidArgumentError, ("[mesh]", "'x'"),
         "maxtext_compat.paged.make_mesh(tp)"),
    Case("rpa-sliding-window-zero", "kernel options", "sliding_window=0",
         lambda: rpa_call(sliding_window=0), InvalidArgumentError, ("[sliding_window]",),
         "pass sliding_window=None for full attention"),
    Case("rpa-soft-cap-zero", "kernel options", "soft_cap=0.0",
         lambda: rpa_call(soft_cap=0.0), InvalidArgumentError, ("[soft_cap]",), "pass soft_cap=None"),
    Case("rpa-sink-shape", "kernel options", "attention_sink with 3 logits for 4 query heads",
         lambda: rpa_call(attention_sink=jnp().zeros(3, jnp().float32)), InvalidArgumentError,
         ("[attention_sink]", "(4,)"), "one float per query head, shape (4,)"),
    Case("rpa-sink-on-v3", "kernel options", "attention_sink with head_dim 128 (v3 kernel)",
         lambda: rpa_call(attention_sink=jnp().zeros(4, jnp().float32)), KernelUnavailableError,
         ("[attention_sink]", "head_dim-64"), "drop attention_sink, or use head_dim 64"),
    Case("rpa-no-cache-write-on-hd64", "kernel options", "update_kv_cache=False with head_dim 64",
         lambda: rpa_call(head_dim=64, update_kv_cache=False), KernelUnavailableError,
         ("[update_kv_cache]", "head_dim-64"), "pass update_kv_cache=True with head_dim 64"),
    Case("rpa-non-causal-on-hd64", "kernel options", "use_causal_mask=False with head_dim 64",
         lambda: rpa_call(head_dim=64, use_causal_mask=False), KernelUnavailableError,
         ("[use_causal_mask]", "causal only"), "pass use_causal_mask=True with head_dim 64"),
    Case("rpa-feature-the-release-lacks", "kernel options", "soft_cap=5.0 on tpu-inference 0.11 (curried form)",
         lambda: rpa_call(soft_cap=5.0, row=curried_row()), KernelUnavailableError,
         ("[soft_cap]", "does not support soft_cap", ">=0.11.1"), "upgrade to tpu-inference >= 0.27.0"),
    Case("allocate-on-a-mesh-of-another-tp", "paged cache", "a tp=2 layout allocated on a 1-device mesh",
         allocate_sharded_with_another_tp, InvalidArgumentError, ("[mesh]", "model axis of size 2"),
         "layout.with_tp"),
    Case("allocate-no-layers", "paged cache", "`layout.allocate(0)`",
         allocate_no_layers, InvalidArgumentError, ("[num_layers]",), "pass num_layers >= 1"),
    Case("rpa-sm-scale-nan", "kernel options", "sm_scale=float('nan') (every output row would be NaN)",
         lambda: rpa_call(sm_scale=float("nan")), InvalidArgumentError, ("[sm_scale]", "finite", "nan"),
         "pass sm_scale as a finite float"),
    Case("rpa-kv-cache-as-list", "paged cache", "kv_cache given as a Python list of numbers",
         lambda: rpa_call(kv_cache=step().kv_cache.tolist()), InvalidArgumentTypeError, ("[kv_cache]", "list"),
         "not a Python list"),
    Case("rpa-metadata-as-lists", "metadata arrays", "tpu-inference-style metadata whose arrays are Python lists",
         lambda: rpa_call(metadata=types.SimpleNamespace(**{k: list(v) for k, v in vars(raw()).items()})),
         InvalidArgumentTypeError, ("[metadata]", "int32 arrays"), "Python lists are not arrays"),
    Case("transformer-one-cache-fewer", "adapters",
         "a Transformer new call with one KV cache fewer than its decoder layers (0.2.5: a raw IndexError before)",
         lambda: new_call(-1), InvalidArgumentError, ("[kv_caches]", "1 KV cache(s) for 2 decoder layers"),
         "pass exactly one KV cache per decoder layer"),
    Case("transformer-one-cache-more", "adapters",
         "a Transformer new call with one KV cache more than its decoder layers (0.2.5: handed back unwritten before)",
         lambda: new_call(1), InvalidArgumentError, ("[kv_caches]", "3 KV cache(s) for 2 decoder layers"),
         "pass exactly one KV cache per decoder layer"),
    Case("attention-cache-as-list", "adapters", "an Attention new call with kv_cache=[cache] (a list of one)",
         lambda: new_call(attention=True, cache=a_cache(as_list=True)), InvalidArgumentTypeError,
         ("[kv_cache]", "not a list"), "pass this layer's cache"),
    Case("attention-cache-of-another-dtype", "adapters",
         "a bfloat16 KV cache for a float32 layer (0.2.5: a raw ValueError inside tpu-inference; 0.1.0 cast it)",
         lambda: new_call(attention=True, cache=a_cache("bfloat16")), InvalidArgumentError,
         ("[kv_cache]", "float32"), "KVCacheLayout(...).allocate"),
    Case("kernel-order-wrong-rows", "metadata builder", "3 token rows for a 16-token batch in `to_kernel_order`",
         kernel_order_wrong_rows, InvalidArgumentError, ("[x]", "16 rows"),
         "pass x with one row per new token of this step"),
]  # fmt: skip


@pytest.fixture
def no_kernel(mocker):
    """Every case must be refused before the kernel: reaching its entry point fails the case."""
    from maxtext_compat.kernel import rpa

    return mocker.patch.object(rpa, "entry_point", side_effect=AssertionError("the kernel was reached"))


@pytest.mark.parametrize("case", _unit.as_params(CASES))
def test_kernel_level_bad_input_is_a_typed_error_naming_the_argument_and_the_fix(case, no_kernel):
    pytest.importorskip("jax")
    _unit.check_case(case)


# ----------------------------------------------------------------------------------------------
# Strict mode: a layer that drops its KV cache, in each family (the "not updated" half is
# test_adapters_new_call.py::test_strict_mode_catches_a_cache_returned_unchanged_in_each_family)
# ----------------------------------------------------------------------------------------------


def _new_call_step(cfg: Any) -> tuple[Any, ...]:
    """(tokens, positions, caches, AttentionMetadata) of one prefill step of two sequences (20 and 13 tokens)."""
    import numpy as np

    from maxtext_compat import paged

    layout = paged.KVCacheLayout(8, 16, cfg.num_kv_heads, cfg.head_dim, "float32")
    alloc = paged.PageAllocator(8, 16)
    seqs = [paged.SequenceSlice(n, n, alloc.allocate(r, n), r) for r, n in (("A", 20), ("C", 13))]
    md = paged.build_metadata(seqs, layout, max_num_tokens=40, max_num_seqs=4, pages_per_seq=2)
    rng = np.random.default_rng(0)
    tokens = jnp().asarray(rng.integers(0, cfg.vocab_size, (40, 1)).astype(np.int32))
    pos = jnp().asarray(md.to_kernel_order(np.concatenate([np.arange(20), np.arange(13)]).astype(np.int32)))[:, None]
    return tokens, pos, layout.allocate(cfg.num_decoder_layers), md.to_attention_metadata()


def _drop_every_cache(row: Any, mocker: Any) -> None:
    """Fault injection: each attention layer computes its output but hands back no KV cache."""
    if row.has_kv_params:  # MaxText's own vLLM path (0.2.x)
        from helpers.serve_faults import replace_returned_cache

        replace_returned_cache(row.classes["attention"].load(), mocker, lambda given: None)
        return
    from maxtext_compat.backport import attention as backport_attention

    def drop_backport(session, op, query, key, value, sinks=None):  # the backport (0.1.0)
        session.take()
        session.give(None)
        return query

    mocker.patch.object(backport_attention, "attend", drop_backport)
    mocker.patch("maxtext_compat.shims.backport_hooks.attend", drop_backport)


@pytest.mark.parametrize("family", ["default", "qwen3", "gemma3"])
def test_strict_mode_catches_a_dropped_cache_in_each_family(family, mocker):
    nnx = pytest.importorskip("flax.nnx")
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from maxtext_compat.adapters import wrap
    from maxtext_compat.convention import policy
    from maxtext_compat.cpu import rpa as cpu_rpa
    from maxtext_compat.testing import tiny

    assert cpu_rpa.install().active
    row = tiny.installed_row()
    cfg = tiny.tiny_config(family, vllm=row.has_kv_params)
    if row.has_kv_params:  # vllm.yml meshes have no ici knob for 'model': one device, every axis 1
        mesh = Mesh(np.array(jax.devices()[:1]).reshape([1] * len(cfg.mesh_axes)), cfg.mesh_axes)
    else:
        mesh = tiny.tiny_mesh(cfg)
    model = wrap(tiny.tiny_transformer(cfg, mesh, model_mode="autoregressive" if row.has_kv_params else None))
    tokens, pos, caches, md = _new_call_step(cfg)
    _drop_every_cache(row, mocker)

    def step(m, tok, p, kvs, metadata):
        return m(tok, p, kv_caches=kvs, attention_metadata=metadata, model_mode="autoregressive")

    with tiny.mesh_context(cfg, mesh), policy.strict_mode(), pytest.raises(KVCacheNotUpdatedError) as err:
        nnx.jit(step)(model, tokens, pos, list(caches), md)
    msg = str(err.value)  # 0.2.5's decoder keeps the given cache for a layer that returns None: "unchanged"
    assert msg.startswith("[kv_caches]") and "Fix:" in msg
    assert "no KV cache for layer 0" in msg or "the KV cache unchanged for layer 0" in msg
