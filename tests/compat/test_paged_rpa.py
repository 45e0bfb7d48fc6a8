"""The real tpu-inference RPA kernel on CPU, through maxtext_compat.kernel.rpa, against a float64 reference.

Every case compiles once per configuration (fixed padded shapes: 32 token rows, 4 sequence
slots, 4 pages per sequence, 16 pages of 16 tokens), so the batches of one configuration
reuse a single compiled kernel. q/k/v padding rows are NaN (poison): a kernel that reads or
forgets them shows it; the output aliases q, so a real row the kernel does not write keeps
q's value and fails the comparison.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from helpers.kernel_envs import (
    REAL_KERNEL_ENVS,
    SWEEP_ELSEWHERE_EXTENDED,
    installed_attention_interface,
    installed_hd64_kernel,
    jax_below,
)
from helpers.shipped import shipped_matrix

pytestmark = pytest.mark.envs(*REAL_KERNEL_ENVS)

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from helpers.reference_attention import make_ragged_step, reference_ragged_attention  # noqa: E402
from maxtext_compat import paged  # noqa: E402
from maxtext_compat.cpu import rpa as cpu_rpa  # noqa: E402
from maxtext_compat.errors import CacheCapacityError, InvalidArgumentError, KernelUnavailableError  # noqa: E402
from maxtext_compat.kernel import rpa  # noqa: E402

PAGES, PAGE, TOKENS, SEQS, PER_SEQ = 16, 16, 32, 4, 4
# bf16 keeps 8 significant bits: the output alone rounds to within 2^-8 of |out| (up to ~4.6 here, 0.018), and the
# probabilities and V rounded to bf16 add as much again. Measured on tpu-inference 0.20.0, gqa_bf16 over seeds
# 0-199: max 0.030 (median 0.016); one seed reached 0.044. A kernel that misreads a page is off by O(1).
TOL = {"float32": 1e-5, "bfloat16": 6e-2}
SCALE = 128**-0.5  # one sm_scale for the hd128 f32 tests: it is static, a new value recompiles

# (q_len, kv_len) per request, in the caller's order (prefills before decodes: the builder reorders)
BATCHES = {
    "decode_only": [(1, 37), (1, 16), (1, 64), (1, 1)],  # kv 16/64: full pages; kv 64: 4 pages
    "prefill_only": [(16, 16), (9, 9), (7, 40)],  # (7, 40): chunked prefill over 3 pages
    "mixed": [(9, 40), (1, 37), (5, 5), (1, 17)],
    "page_boundaries": [(16, 32), (1, 48), (15, 16)],  # context and new tokens end exactly on pages
}


@pytest.fixture(scope="module", autouse=True)
def shim():
    status = cpu_rpa.install()
    assert status.active, status.reason
    return status


def _run(step, mesh, **kw):
    cache = jax.device_put(step.kv_cache, step.layout.sharding(mesh))
    return rpa.ragged_paged_attention(step.q, step.k, step.v, cache, step.metadata, mesh=mesh, **kw)


def _check(step, out, new_cache, *, sm_scale, tol, **kw):
    """Compare with the float64 reference; returns the max abs error."""
    ref = reference_ragged_attention(step.q, step.k, step.v, step.kv_cache, step.metadata, step.layout,
                                     sm_scale=sm_scale, **kw)  # fmt: skip
    n = step.metadata.num_tokens
    got = np.asarray(out[:n]).astype(np.float64)
    assert np.isfinite(got).all(), "a real token row holds NaN: the kernel read poison or skipped it"
    # The output aliases q's buffer: rows the kernel never writes keep q's content. v3 hands back q's own
    # lanes (NaN poison); hd64 hands back lanes 64..127 of q padded to 128, i.e. zeros. Either way an
    # unwritten real row could not have matched the reference above.
    pad = np.asarray(out[n:]).astype(np.float32)
    assert (np.isnan(pad) if step.layout.kernel == "v3" else pad == 0).all(), "padding rows were written"
    err = float(np.abs(got - ref.out).max())
    assert err <= tol, f"max abs error {err:.3g} > {tol}"
    np.testing.assert_array_equal(np.asarray(new_cache), ref.kv_cache)  # element for element
    return err


def _step(layout, batch, *, num_q_heads, seed=0):
    return make_ragged_step(layout, BATCHES[batch], num_q_heads=num_q_heads, max_num_tokens=TOKENS,
                            max_num_seqs=SEQS, pages_per_seq=PER_SEQ, seed=seed)  # fmt: skip


# -- one configuration, every batch shape: one compile ------------------------------------------


@pytest.mark.parametrize("batch", list(BATCHES))
def test_gqa_f32_batches(batch):
    layout = paged.KVCacheLayout(PAGES, PAGE, 2, 128, "float32")
    step = _step(layout, batch, num_q_heads=4, seed=len(batch))
    out, new_cache = _run(step, paged.make_mesh(1), sm_scale=SCALE)
    _check(step, out, new_cache, sm_scale=SCALE, tol=TOL["float32"])


def test_outputs_map_back_to_caller_order_and_cache_reads_back():
    layout = paged.KVCacheLayout(PAGES, PAGE, 2, 128, "float32")
    step = _step(layout, "mixed", num_q_heads=4, seed=11)
    md = step.metadata
    assert md.request_order == (1, 3, 0, 2)  # decodes first
    out, new_cache = _run(step, paged.make_mesh(1), sm_scale=SCALE)
    caller_out = md.from_kernel_order(np.asarray(out))
    np.testing.assert_array_equal(md.to_kernel_order(caller_out)[: md.num_tokens], np.asarray(out)[: md.num_tokens])
    caller_k = md.from_kernel_order(np.asarray(step.k))
    start = 0
    for rid, (q_len, kv_len) in enumerate(BATCHES["mixed"]):
        pages = md.pages_of(md.request_order.index(rid))
        k_all, _ = paged.read_kv(new_cache, layout, pages, kv_len)
        np.testing.assert_array_equal(k_all[: kv_len - q_len], step.context_k[rid])
        np.testing.assert_array_equal(k_all[kv_len - q_len :], caller_k[start : start + q_len])
        start += q_len


def test_tpu_inference_attention_metadata_gives_the_same_result():
    layout = paged.KVCacheLayout(PAGES, PAGE, 2, 128, "float32")
    step = _step(layout, "mixed", num_q_heads=4, seed=5)
    tpi_md = step.metadata.to_attention_metadata()
    assert type(tpi_md).__name__ == "AttentionMetadata" and type(tpi_md).__module__.startswith("tpu_inference")
    mesh = paged.make_mesh(1)
    ours = _run(step, mesh, sm_scale=SCALE)
    cache = jax.device_put(step.kv_cache, layout.sharding(mesh))
    theirs = rpa.ragged_paged_attention(step.q, step.k, step.v, cache, tpi_md, mesh=mesh, sm_scale=SCALE)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(
            np.asarray(a)[: step.metadata.num_tokens], np.asarray(b)[: step.metadata.num_tokens]
        )


def test_dispatcher_under_jit_traced_metadata():
    layout = paged.KVCacheLayout(PAGES, PAGE, 2, 128, "float32")
    step = _step(layout, "mixed", num_q_heads=4, seed=6)
    mesh = paged.make_mesh(1)

    @jax.jit
    def f(q, k, v, cache, md):
        return rpa.ragged_paged_attention(q, k, v, cache, md, mesh=mesh, sm_scale=SCALE)

    out, new_cache = f(step.q, step.k, step.v, step.kv_cache, step.metadata.to_attention_metadata())
    _check(step, out, new_cache, sm_scale=SCALE, tol=TOL["float32"])


# -- one batch, many configurations: one compile each -------------------------------------------

CONFIGS = {
    # name: (q heads, kv heads, head_dim, dtype, extra kwargs)
    "gqa_bf16": (4, 2, 128, "bfloat16", {}),
    "mqa_f32": (4, 1, 128, "float32", {}),
    "hd96_f32": (4, 2, 96, "float32", {}),
    "hd64_f32": (4, 2, 64, "float32", {}),
    "hd64_bf16_sinks": (4, 2, 64, "bfloat16", {"attention_sink": "random"}),
    "sliding_window_12": (4, 2, 128, "float32", {"sliding_window": 12}),
    "soft_cap_5": (2, 1, 128, "float32", {"soft_cap": 5.0}),
}


@pytest.mark.extended_in(*SWEEP_ELSEWHERE_EXTENDED)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_configurations_mixed_batch(name):
    nq, nkv, hd, dtype, kw = CONFIGS[name]
    hd64 = hd == 64 and installed_hd64_kernel()  # tpu-inference 0.11 runs head_dim 64 through the v3 kernel
    layout = paged.KVCacheLayout(PAGES, PAGE, nkv, hd, dtype, hd64=None if hd64 else False)
    assert layout.kernel == ("hd64" if hd64 else "v3")
    # A seed per configuration that every run repeats (hash() of a str changes with each process).
    step = _step(layout, "mixed", num_q_heads=nq, seed=zlib.crc32(name.encode()) % 1000)
    kw = dict(kw)
    if kw.get("attention_sink") == "random":
        kw["attention_sink"] = jnp.asarray(np.random.default_rng(0).standard_normal(nq) * 2, jnp.float32)
    if hd == 64 and not hd64:  # tpu-inference 0.11: the hd64 layout and sinks are refused, typed
        hd64_layout = paged.KVCacheLayout(PAGES, PAGE, nkv, hd, dtype)
        hd64_step = _step(hd64_layout, "mixed", num_q_heads=nq, seed=1)
        with pytest.raises(InvalidArgumentError, match=r"\[kv_cache\].*layout the installed RPA kernel expects"):
            _run(hd64_step, paged.make_mesh(1), sm_scale=hd**-0.5)
        if "attention_sink" in kw:
            with pytest.raises(KernelUnavailableError, match=r"\[attention_sink\].*head_dim-64 kernel") as e:
                _run(step, paged.make_mesh(1), sm_scale=hd**-0.5, **kw)
            assert "tpu-inference >= 0.12" in e.value.fix
            return
    if "soft_cap" in kw and not _kernel_takes("attn_logits_soft_cap"):  # tpu-inference < 0.27: refused, typed
        with pytest.raises(KernelUnavailableError, match=r"\[soft_cap\].*does not support soft_cap") as e:
            _run(step, paged.make_mesh(1), sm_scale=hd**-0.5, **kw)
        assert "tpu-inference >= 0.27.0" in str(e.value)
        return
    out, new_cache = _run(step, paged.make_mesh(1), sm_scale=hd**-0.5, **kw)
    _check(step, out, new_cache, sm_scale=hd**-0.5, tol=TOL[dtype], **kw)


def _kernel_takes(name):
    """Whether the installed tpu-inference's own sharded_ragged_paged_attention has parameter `name`."""
    import inspect

    return name in inspect.signature(installed_attention_interface().sharded_ragged_paged_attention).parameters


# -- tensor parallelism ---------------------------------------------------------------------------


@pytest.mark.extended_in(*SWEEP_ELSEWHERE_EXTENDED)
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tensor_parallel_matches_tp1(tp):
    """2 KV heads: TP=2 splits them, TP=4 repeats each twice (as tpu-inference does)."""
    if len(jax.devices()) < tp:
        pytest.fail(f"needs {tp} devices: conftest sets --xla_force_host_platform_device_count=4")
    base = paged.KVCacheLayout(PAGES, PAGE, 2, 128, "float32")
    step = _step(base, "mixed", num_q_heads=4, seed=21)
    out1, cache1 = _run(step, paged.make_mesh(1), sm_scale=SCALE)
    layout = base.with_tp(tp)
    assert layout.replication == (2 if tp == 4 else 1)
    # the same request contents in the TP layout (context copied to every replica)
    cache = step.kv_cache if tp == 1 else _relayout(step, base, layout)
    tp_step = type(step)(layout, step.metadata, step.q, step.k, step.v, cache, step.context_k, step.context_v)
    mesh = paged.make_mesh(tp)
    if tp > 1 and jax_below("0.9"):  # measured: 2 (jax 0.7.2) and 3 (0.8.0) of 30 TP=2 runs lost cache rows
        with pytest.raises(KernelUnavailableError, match=r"\[mesh\].*loses KV cache writes") as e:
            _run(tp_step, mesh, sm_scale=SCALE)
        assert "use tensor parallelism 1" in e.value.fix
        return
    if layout.replication > 1 and jax_below("0.11.2"):  # measured: 0.9.2 IndivisibleError, 0.10.0-0.11.0 hang
        with pytest.raises(KernelUnavailableError, match=r"\[mesh\].*replicated KV heads over the 'model' axis") as e:
            _run(tp_step, mesh, sm_scale=SCALE)
        assert "use tensor parallelism <= 2" in str(e.value)
        return
    out, new_cache = _run(tp_step, mesh, sm_scale=SCALE)
    assert new_cache.sharding.shard_shape(new_cache.shape) == layout.shard_shape  # heads split over devices
    n = step.metadata.num_tokens
    np.testing.assert_array_equal(np.asarray(out)[:n], np.asarray(out1)[:n])  # measured: bit-identical
    _check(tp_step, out, new_cache, sm_scale=SCALE, tol=TOL["float32"])
    for seq in range(step.metadata.num_seqs):  # same K/V per model head as TP=1
        for a, b in zip(paged.read_sequence(new_cache, layout, step.metadata, seq),
                        paged.read_sequence(cache1, base, step.metadata, seq), strict=True):  # fmt: skip
            np.testing.assert_array_equal(a, b)


def _relayout(step, base, layout):
    cache = np.asarray(jnp.zeros(layout.shape, layout.dtype))
    md = step.metadata
    for seq in range(md.num_seqs):
        context = md.kv_lens[seq] - md.q_lens()[seq]
        if context:
            k, v = paged.read_kv(step.kv_cache, base, md.pages_of(seq), context)
            cache = paged.write_kv(cache, layout, md.pages_of(seq), 0, k, v)
    return jnp.asarray(cache)


# -- bad input: typed errors before the kernel runs -----------------------------------------------


@pytest.fixture
def no_kernel(mocker):
    """Fail the test if the dispatcher gets as far as the kernel."""
    return mocker.patch.object(rpa, "entry_point", side_effect=AssertionError("the kernel was reached"))


def _raw(step):
    a = step.metadata.arrays()
    return {n: jnp.asarray(a[n]) for n in ("kv_lens", "page_indices", "cu_q_lens", "distribution")}


class _Meta:  # an AttentionMetadata look-alike carrying raw arrays
    def __init__(self, kv_lens, page_indices, cu_q_lens, distribution):
        self.seq_lens, self.block_tables = kv_lens, page_indices
        self.query_start_loc, self.request_distribution = cu_q_lens, distribution


def _bad_call(step, *, cache=None, q=None, k=None, v=None, mesh=None, **meta):
    raw = {**_raw(step), **meta}
    return rpa.ragged_paged_attention(
        step.q if q is None else q, step.k if k is None else k, step.v if v is None else v,
        step.kv_cache if cache is None else cache, _Meta(**raw), mesh=mesh or paged.make_mesh(1),
    )  # fmt: skip


@pytest.fixture(scope="module")
def small_step():
    layout = paged.KVCacheLayout(PAGES, PAGE, 2, 128, "float32")
    return _step(layout, "mixed", num_q_heads=4, seed=3)


def test_layout_mismatch(small_step, no_kernel):
    wrong = jnp.zeros(paged.KVCacheLayout(PAGES, PAGE, 1, 128, "float32").shape)
    with pytest.raises(InvalidArgumentError, match="layout") as info:
        _bad_call(small_step, cache=wrong)
    assert info.value.argument == "kv_cache" and "allocate" in info.value.fix


def test_dtype_mismatch(small_step, no_kernel):
    with pytest.raises(InvalidArgumentError, match="dtype") as info:
        _bad_call(small_step, cache=small_step.kv_cache.astype(jnp.bfloat16))
    assert info.value.argument == "kv_cache"


def test_page_size_not_multiple_of_packing():
    with pytest.raises(InvalidArgumentError) as info:
        paged.KVCacheLayout(PAGES, 15, 2, 128, "bfloat16")
    assert info.value.argument == "page_size" and "16" in info.value.fix


def test_block_table_entry_out_of_range(small_step, no_kernel):
    pi = np.asarray(small_step.metadata.page_indices, np.int32)
    pi[0] = PAGES
    with pytest.raises(InvalidArgumentError, match="block table") as info:
        _bad_call(small_step, page_indices=jnp.asarray(pi))
    assert info.value.argument == "page_indices[0]"


def test_q_len_greater_than_kv_len(small_step, no_kernel):
    kv = np.asarray(small_step.metadata.kv_lens, np.int32)
    kv[2] = 3  # sequence 2 (5 new tokens) claims kv_len 3
    with pytest.raises(InvalidArgumentError, match="q_len exceeds kv_len") as info:
        _bad_call(small_step, kv_lens=jnp.asarray(kv))
    assert info.value.argument == "kv_lens[2]"


def test_more_tokens_than_the_cache_holds(small_step, no_kernel):
    with pytest.raises(CacheCapacityError):
        paged.PageAllocator(PAGES, PAGE).append("long", PAGES * PAGE + 1)
    with pytest.raises(CacheCapacityError):  # more tokens than q rows
        _bad_call(small_step, q=small_step.q[:8], k=small_step.k[:8], v=small_step.v[:8])
    kv = np.asarray(small_step.metadata.kv_lens, np.int32)
    kv[2] = PER_SEQ * PAGE + 1  # longer than a block-table row
    with pytest.raises(CacheCapacityError):
        _bad_call(small_step, kv_lens=jnp.asarray(kv))


@pytest.mark.parametrize(
    ("field", "bad", "argument"),
    [
        ("kv_lens", lambda a: a.astype(jnp.float32), "kv_lens"),
        ("distribution", lambda a: a.astype(jnp.int16), "distribution"),
        ("cu_q_lens", lambda a: a[:-1], "cu_q_lens"),
        ("distribution", lambda a: jnp.concatenate([a, a]), "distribution"),
        ("page_indices", lambda a: a[:-1], "page_indices"),
        ("page_indices", lambda a: a.reshape(SEQS, PER_SEQ), "page_indices"),
    ],
)
def test_metadata_dtype_and_length(small_step, no_kernel, field, bad, argument):
    with pytest.raises(InvalidArgumentError) as info:
        _bad_call(small_step, **{field: bad(_raw(small_step)[field])})
    assert info.value.argument == argument


def test_static_checks_run_under_jit_value_checks_do_not(small_step, no_kernel):
    raw = _raw(small_step)
    mesh = paged.make_mesh(1)

    def call(kv_lens):
        md = _Meta(kv_lens, raw["page_indices"], raw["cu_q_lens"], raw["distribution"])
        return rpa.ragged_paged_attention(small_step.q, small_step.k, small_step.v, small_step.kv_cache, md, mesh=mesh)

    with pytest.raises(InvalidArgumentError, match="int32"):
        jax.jit(call)(raw["kv_lens"].astype(jnp.float32))
    bad_values = raw["kv_lens"].at[2].set(3)  # q_len > kv_len: only visible on concrete values
    with pytest.raises(AssertionError, match="kernel was reached"):  # passed the checks, stopped at the kernel
        jax.jit(call)(bad_values)


def test_features_and_kernel_limits(small_step, no_kernel):
    with pytest.raises(KernelUnavailableError, match="head_dim-64"):
        _bad_call_kw(small_step, attention_sink=jnp.zeros(4, jnp.float32))
    with pytest.raises(InvalidArgumentError, match="sliding_window"):
        _bad_call_kw(small_step, sliding_window=0)
    curried = shipped_matrix().tpu_inference[0]
    with pytest.raises(KernelUnavailableError, match=r"0\.27\.0") as info:
        _bad_call_kw(small_step, soft_cap=5.0, row=curried)
    assert "tpu-inference" in str(info.value)


def _bad_call_kw(step, **kw):
    cache = step.kv_cache
    return rpa.ragged_paged_attention(step.q, step.k, step.v, cache, step.metadata, mesh=paged.make_mesh(1), **kw)


def test_metadata_built_for_another_cache(small_step, no_kernel):
    other = paged.KVCacheLayout(PAGES, PAGE // 2, 2, 128, "float32")
    md = paged.build_metadata([paged.SequenceSlice(1, 3, (1,))], other, max_num_tokens=TOKENS)
    with pytest.raises(InvalidArgumentError, match="another cache"):
        rpa.ragged_paged_attention(
            small_step.q, small_step.k, small_step.v, small_step.kv_cache, md, mesh=paged.make_mesh(1)
        )


def test_mesh_without_the_model_axis(small_step, no_kernel):
    from jax.sharding import Mesh

    with pytest.raises(InvalidArgumentError, match="axes") as info:
        _bad_call(small_step, mesh=Mesh(np.array(jax.devices()[:1]), ("x",)))
    assert info.value.argument == "mesh"
