"""The XLA kernel (`maxtext_compat.kernel.rpa_xla`) computes what tpu-inference's real RPA kernel computes.

The oracle is the real Pallas kernel itself (v3 and its head_dim-64 variant, tpu-inference 0.32.0) run in TPU
interpret mode by the CPU shim. For random valid metadata (decode sequences first, then prefill/mixed ones; the
v3 kernel's prefill-only segment [d, p) too; pages shuffled across sequences) both get the same arguments:
outputs equal within F32_TOLERANCE + F32_RTOL * |out| (float32) or BF16_TOLERANCE (bfloat16: the kernel's
blocked online softmax rounds per block), every page of the returned cache equal element for element, including
untouched pages.
Then the route: the CPU serving shim puts the XLA kernel behind `sharded_ragged_paged_attention` only.
"""

from __future__ import annotations

import pytest

# tpu-inference 0.32.0's kernels against ours: maxtext-0.2.3 has maxtext-0.2.5's pins, without its load.
pytestmark = [pytest.mark.needs_maxtext, pytest.mark.envs("maxtext-0.2.3")]

np = pytest.importorskip("numpy")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from maxtext_compat import platforms  # noqa: E402
from maxtext_compat.cpu import rpa as cpu_rpa  # noqa: E402
from maxtext_compat.cpu import serving as cpu_serving  # noqa: E402
from maxtext_compat.errors import InvalidArgumentError, ShimRefusedError  # noqa: E402
from maxtext_compat.kernel import rpa_xla  # noqa: E402

F32_TOLERANCE = 1e-6
# ... plus this much of |out| (~8 float32 ulps): the two kernels sum the softmax in another order, and an output of
# ~2.3 was seen 1.19e-6 away (5.1e-7 relative, 1 element of 8,192; hypothesis, seed 15947, two sequences)
F32_RTOL = 1e-6
BF16_TOLERANCE = 2e-2  # bfloat16 has 8 bits of mantissa; |out| <= ~3
Q_HEADS, KV_HEADS, TOKENS, SEQS, PAGES, PAGE_SIZE, PAGES_PER_SEQ = 4, 2, 16, 4, 16, 16, 4

CONFIGS = {
    "v3-f32": (128, jnp.float32, {}),
    "v3-bf16": (128, jnp.bfloat16, {}),
    "hd64-f32": (64, jnp.float32, {}),
    "hd64-bf16": (64, jnp.bfloat16, {}),
    "v3-sliding-window": (128, jnp.float32, {"sliding_window": 8}),
    "v3-soft-cap": (128, jnp.float32, {"soft_cap": 30.0}),
    "hd64-sliding-window": (64, jnp.float32, {"sliding_window": 5}),
}


@pytest.fixture(scope="module", autouse=True)
def real_kernel():
    cpu_rpa.install()
    from tpu_inference.kernels.ragged_paged_attention.v3 import kernel, kernel_hd64

    return kernel, kernel_hd64


@st.composite
def batches(draw):
    """(q_len, kv_len) per sequence (decode ones first), and p of the distribution (d <= p <= n)."""
    decode = draw(st.integers(0, 3))
    rest = draw(st.integers(0 if decode else 1, SEQS - decode))
    seqs, budget = [], TOKENS
    for i in range(decode + rest):
        q_len = 1 if i < decode else draw(st.integers(1, max(1, min(budget - (decode + rest - i - 1), 12))))
        budget -= q_len
        seqs.append((q_len, draw(st.integers(q_len, PAGE_SIZE * PAGES_PER_SEQ))))
    p = draw(st.integers(decode, len(seqs)))
    return seqs, p, draw(st.integers(0, 2**31 - 1))


def _arguments(real_kernel, head_dim, dtype, seqs, p, seed):
    kernel, kernel_hd64 = real_kernel
    rng = np.random.default_rng(seed)
    shape_fn = kernel_hd64.get_kv_cache_shape if head_dim == 64 else kernel.get_kv_cache_shape
    cache = jnp.asarray(rng.standard_normal(shape_fn(PAGES, PAGE_SIZE, KV_HEADS, head_dim, dtype)), dtype)
    q, k, v = (jnp.asarray(rng.standard_normal((TOKENS, h, head_dim)), dtype) for h in (Q_HEADS, KV_HEADS, KV_HEADS))
    kv_lens, cu, pages = (
        np.zeros(SEQS, np.int32),
        np.zeros(SEQS + 1, np.int32),
        np.zeros(SEQS * PAGES_PER_SEQ, np.int32),
    )
    perm = rng.permutation(PAGES)
    for i in range(SEQS):
        q_len, kv_len = seqs[i] if i < len(seqs) else (0, 0)
        kv_lens[i], cu[i + 1] = kv_len, cu[i] + q_len
        pages[i * PAGES_PER_SEQ : (i + 1) * PAGES_PER_SEQ] = perm[i * PAGES_PER_SEQ : (i + 1) * PAGES_PER_SEQ]
    decode = next((i for i, (q_len, _) in enumerate(seqs) if q_len != 1), len(seqs))
    dist = np.array([decode, max(p, decode), len(seqs)], np.int32)
    return (q, k, v, cache, *(jnp.asarray(a) for a in (kv_lens, pages, cu, dist)))


def _both(real_kernel, name, seqs, p, seed):
    head_dim, dtype, kw = CONFIGS[name]
    kernel, kernel_hd64 = real_kernel
    args = _arguments(real_kernel, head_dim, dtype, seqs, p, seed)
    real_fn = kernel_hd64.ragged_paged_attention_hd64 if head_dim == 64 else kernel.ragged_paged_attention
    xla_fn = rpa_xla.ragged_paged_attention_hd64 if head_dim == 64 else rpa_xla.ragged_paged_attention
    with cpu_rpa.interpret_mode():  # the kernel donates q and the cache: it gets copies
        real = real_fn(*[jnp.array(a, copy=True) for a in args], sm_scale=0.125, **kw)
    ours = xla_fn(*args, sm_scale=0.125, **kw)
    return real, ours, dtype


@pytest.mark.parametrize("name", list(CONFIGS))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=batches())
@example(batch=([(1, 1), (4, 59)], 1, 15947))  # 1.19e-6 away at |out| ~2.3 (F32_RTOL's case)
def test_the_xla_kernel_equals_the_real_kernel(real_kernel, name, batch):
    seqs, p, seed = batch
    (real_out, real_cache), (out, cache), dtype = _both(real_kernel, name, seqs, p, seed)
    np.testing.assert_array_equal(np.asarray(cache.astype(jnp.float32)), np.asarray(real_cache.astype(jnp.float32)))
    tol, rtol = (F32_TOLERANCE, F32_RTOL) if dtype == jnp.float32 else (BF16_TOLERANCE, 0)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(real_out, np.float32), rtol=rtol, atol=tol)


@pytest.mark.parametrize("name", ["v3-f32", "v3-bf16", "hd64-f32", "hd64-bf16"])
def test_a_donated_cache_is_written_in_place(real_kernel, name):
    """A server's step donates each layer's cache: the compiled kernel updates it without copying it.

    Before, a reshape that merged the size-1 packing axis gave the scatter a layout of its own, and XLA:CPU
    copied the whole cache in and back out (two `copy` ops of the cache's shape per call; ~115 ms of a 460 ms
    served SmolLM2 decode step with a 610-page cache). Counted in the compiled HLO: no op of the cache's shape
    may be a copy."""
    import re

    head_dim, dtype, _ = CONFIGS[name]
    q, k, v, cache, *meta = _arguments(real_kernel, head_dim, dtype, [(1, 20), (3, 9)], 2, 0)
    fn = rpa_xla.ragged_paged_attention_hd64 if head_dim == 64 else rpa_xla.ragged_paged_attention
    step = jax.jit(lambda c, q, k, v: fn(q, k, v, c, *meta, sm_scale=0.125)[::-1], donate_argnums=0)
    text = step.lower(cache, q, k, v).compile().as_text()
    short = {"float32": "f32", "bfloat16": "bf16"}[jnp.dtype(dtype).name]
    shape = f"{short}[{','.join(map(str, cache.shape))}]"
    ops = re.findall(rf"%([\w.\-]+) = {re.escape(shape)}\{{[^}}]*\}} (\w+)\(", text)
    assert ops, f"no op of the cache's shape {shape} in the compiled program"
    copies = [(n, op) for n, op in ops if op == "copy" or "copy" in n]
    assert not copies, f"the cache {shape} is copied: {copies}"


def test_the_xla_kernel_refuses_debug_mode(real_kernel):
    args = _arguments(real_kernel, 128, jnp.float32, [(1, 4)], 1, 0)
    with pytest.raises(InvalidArgumentError, match="debug_mode"):
        rpa_xla.ragged_paged_attention(*args, debug_mode=True)


# ------------------------------------------------------------------ the route


@pytest.fixture
def serving_shim(monkeypatch):
    """The CPU serving shim installed for one test (and removed), with MAXTEXT_COMPAT_RPA_KERNEL as set."""
    cpu_serving.uninstall()
    yield cpu_serving
    cpu_serving.uninstall()
    cpu_rpa.install()


def _interface():
    from tpu_inference.layers.common import attention_interface

    return attention_interface


def test_unset_puts_the_xla_kernel_behind_sharded_rpa_only(serving_shim, monkeypatch, real_kernel):
    monkeypatch.delenv(platforms.KERNEL_ENV, raising=False)
    iface, kernel = _interface(), real_kernel[0]
    before = iface.ragged_paged_attention
    status = serving_shim.install()
    assert status.kernel == "xla"
    assert f"{cpu_serving.ATTENTION_INTERFACE}:ragged_paged_attention" in status.patches
    assert iface.ragged_paged_attention is not before and kernel.ragged_paged_attention is before
    # The routed global runs the XLA kernel: same result as calling it directly.
    args = _arguments(real_kernel, 64, jnp.float32, [(1, 9), (5, 7)], 2, 3)
    routed = iface.ragged_paged_attention_hd64(*args, sm_scale=0.125)
    direct = rpa_xla.ragged_paged_attention_hd64(*args, sm_scale=0.125)
    np.testing.assert_array_equal(np.asarray(routed[0]), np.asarray(direct[0]))
    serving_shim.uninstall()
    assert iface.ragged_paged_attention is before


def test_pallas_keeps_the_real_kernel(serving_shim, monkeypatch):
    monkeypatch.setenv(platforms.KERNEL_ENV, "pallas")
    iface = _interface()
    before = iface.ragged_paged_attention
    assert serving_shim.install().kernel == "pallas"
    assert iface.ragged_paged_attention is before


def test_an_unknown_kernel_name_is_refused_before_anything_is_patched(serving_shim, monkeypatch):
    monkeypatch.setenv(platforms.KERNEL_ENV, "fast")
    with pytest.raises(InvalidArgumentError) as err:
        serving_shim.install()
    assert err.value.argument == platforms.KERNEL_ENV and "'fast'" in str(err.value)
    assert not serving_shim.installed()


def test_xla_is_refused_where_another_kernel_is_bound(serving_shim, monkeypatch):
    """tpu-inference binds the experimental batched kernel at import under USE_BATCHED_RPA_KERNEL (simulated)."""
    iface = _interface()
    monkeypatch.setattr(iface, "ragged_paged_attention", lambda *a, **k: None)
    monkeypatch.setenv(platforms.KERNEL_ENV, "xla")
    with pytest.raises(ShimRefusedError, match="pallas"):
        serving_shim.install()
    assert not serving_shim.installed()
    monkeypatch.delenv(platforms.KERNEL_ENV)
    assert serving_shim.install().kernel == "pallas"  # unset: the bound kernel runs, interpreted


def test_an_unchecked_tpu_inference_runs_the_real_kernel_unless_asked(serving_shim, monkeypatch, caplog):
    """rpa_xla was held to tpu-inference 0.32.0's kernels: another release gets the real kernel by default."""
    from maxtext_compat import platforms
    from maxtext_compat.cpu import kernel_choice as cpu_kernel

    monkeypatch.setattr(cpu_kernel, "_tpu_inference_version", lambda: "0.31.0")
    monkeypatch.delenv(platforms.KERNEL_ENV, raising=False)
    assert cpu_kernel.resolve_kernel(None) == "pallas"
    with caplog.at_level("WARNING", logger=cpu_kernel.__name__):
        assert cpu_kernel.resolve_kernel("xla") == "xla"
    assert "0.31.0" in caplog.text and "0.32.0" in caplog.text
