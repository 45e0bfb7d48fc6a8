"""`make bench-accel`'s step section: one MaxText decoder layer's decode step per shape, and the chip's copy ceiling.

Per shape (batch 1/8/32 sequences decoding one token each, context 512/2k; MaxText's llama2 decoder layer of the
installed release, 2,048 wide, 16 query / 8 KV heads of 128, bfloat16), every route jitted with the KV cache (or the
layer's state) donated and fed back, as a serving loop runs it:

- native: the layer's own new call (kv_cache, attention_metadata) on the installed RPA kernel (the compiled Pallas
  kernel on a TPU);
- through wrap(): the same call through the layer, the traced KV-write check on and off (its default: on on a
  CPU, off on an accelerator, paged/guard.py);
- native on rpa_xla: the same call with tpu-inference's kernel globals bound to rpa_xla (the XLA kernel; what a GPU
  runs);
- MaxText's dense decode: the layer in autoregressive mode with MaxText's own dense KV cache of the same context
  (attention dot_product).

The ratios are medians of repeated runs in one process (block_until_ready at the end of each run). wrap()'s outputs
and caches must equal the native call's bit for bit and rpa_xla's must agree within bfloat16 rounding, or the
shape's figures are not written. The copy ceiling (a jitted x + 1 and a sum over 1 GiB) is what this chip's memory
gives a plain XLA program in the same run: rpa_xla's and the kernel's KV bandwidth are set beside it.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any
from unittest import mock

from bench_timing import Cached, hbm, median_call

from helpers import accel_mode

DRY = accel_mode.dry()
SHAPES = ((1, 32), (4, 64)) if DRY else ((1, 512), (8, 512), (32, 512), (1, 2048), (8, 2048), (32, 2048))
LAYER = (
    {"base_emb_dim": 256, "base_num_query_heads": 4, "base_num_kv_heads": 2, "base_mlp_dim": 512}
    if DRY
    else {"base_emb_dim": 2048, "base_num_query_heads": 16, "base_num_kv_heads": 8, "base_mlp_dim": 5632}
)
DTYPE = "float32" if DRY else "bfloat16"  # the dry run's interpreted kernel is slow enough in float32
PAGE = 16
ROUNDS = (2, 2) if DRY else (20, 5)  # (steps per run, runs)
COPY_BYTES = (64 << 20) if DRY else (1 << 30)
MODE = "autoregressive"


def _config(batch: int, context: int, *, vllm: bool) -> Any:
    from maxtext_compat.testing import tiny

    dims = {**LAYER, "head_dim": 128, "dtype": DTYPE, "weight_dtype": DTYPE, "base_num_decoder_layers": 1}
    if not vllm:  # MaxText's dense cache: the context in its prefill part, room for the decoded tokens after it;
        # its batch is per device x the mesh's devices (4 CPU devices in the dry run's process, 1 on a v5e chip)
        import jax

        per_device = batch / len(jax.devices())
        dims.update(per_device_batch_size=per_device, max_prefill_predict_length=context)
        dims.update(max_target_length=context + 16)
    else:
        dims.update(max_target_length=context + 16, max_prefill_predict_length=context)
    return tiny.tiny_config("default", vllm=vllm, matmul_precision="default", **dims)


def _layer(cfg: Any, mesh: Any) -> Any:
    from flax import nnx

    from maxtext_compat.testing import tiny

    cls = tiny.installed_row().decoder_layers["llama2"].load()
    with tiny.mesh_context(cfg, mesh):
        return cls(config=cfg, model_mode=MODE, mesh=mesh, rngs=nnx.Rngs(params=0, dropout=1), quant=None)


def _timed_loop(
    step: Callable[[Any], tuple[Any, Any]], carry: Any, *, keep_carry: bool = True
) -> tuple[Any, float, bool, float]:
    """((first output, first carry) on the host, first call's seconds, from the compilation cache, median seconds per
    step): `step` takes the donated carry and returns (output, next carry); each run is ROUNDS[0] steps, the median
    over ROUNDS[1] runs."""
    import jax

    with Cached() as c:
        start = time.perf_counter()
        out, carry = step(carry)
        jax.block_until_ready((out, carry))
        first = time.perf_counter() - start
    first_out = jax.device_get((out, carry if keep_carry else None))
    steps, runs = ROUNDS
    per_step = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(steps):
            out, carry = step(carry)
        jax.block_until_ready((out, carry))
        per_step.append((time.perf_counter() - start) / steps)
    return first_out, first, c.cached, statistics.median(per_step)


def _paged_routes(batch: int, context: int) -> tuple[dict[str, Any], int]:
    """{route: ((y, cache) first, first s, cached, median s)} of the paged new call; the KV bytes a step reads."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from helpers import crossrun
    from helpers.xla_kernel import rpa_xla_bound
    from maxtext_compat import paged
    from maxtext_compat.adapters import wrap
    from maxtext_compat.paged import guard
    from maxtext_compat.testing import tiny

    cfg = _config(batch, context, vllm=True)
    mesh = crossrun.native_mesh(cfg, 1)
    pages = batch * paged.layout.cdiv(context, PAGE) + 2
    layout = paged.KVCacheLayout(pages, PAGE, cfg.num_kv_heads, cfg.head_dim, DTYPE)
    alloc = paged.PageAllocator(pages, PAGE)
    for s in range(batch):
        alloc.append(s, context - 1)
    seqs = [alloc.append(s, 1) for s in range(batch)]  # one decode token each, kv_len = context
    tokens = max(16, -(-batch // 16) * 16)
    md = paged.build_metadata(seqs, layout, max_num_tokens=tokens, max_num_seqs=max(batch, 1),
                              pages_per_seq=paged.layout.cdiv(context, PAGE))  # fmt: skip
    am = md.to_attention_metadata()
    rng = np.random.default_rng(0)
    host_cache = rng.standard_normal(layout.shape, np.float32).astype(layout.dtype)
    x = jnp.asarray(rng.standard_normal((tokens, 1, cfg.emb_dim)).astype(DTYPE))
    pos = jnp.asarray(np.asarray(md.input_positions, np.int32))[:, None]
    layer = _layer(cfg, mesh)
    routes: dict[str, tuple[Callable[[], Any], Callable[[], contextlib.AbstractContextManager[Any]]]] = {
        "native (installed kernel)": (lambda: layer, contextlib.nullcontext),
        "through wrap(), KV-write check on": (
            lambda: wrap(layer), lambda: mock.patch.dict(os.environ, {guard.TRACED_CHECKS_ENV: "1"})),
        "through wrap(), check off": (
            lambda: wrap(layer), lambda: mock.patch.dict(os.environ, {guard.TRACED_CHECKS_ENV: "0"})),
        "native on rpa_xla": (lambda: layer, rpa_xla_bound),
    }  # fmt: skip
    out = {}
    for name, (module, context_manager) in routes.items():
        graphdef, state = nnx.split(module())

        def call(state: Any, kv: Any, graphdef: Any = graphdef) -> Any:
            y, new_kv = nnx.merge(graphdef, state)(x, None, pos, True, MODE, kv_cache=kv, attention_metadata=am)
            return y, new_kv

        with tiny.mesh_context(cfg, mesh), context_manager():
            jitted = jax.jit(call, donate_argnums=1)
            result = _timed_loop(lambda kv: jitted(state, kv), jnp.asarray(host_cache))  # noqa: B023
        out[name] = result
    kv_bytes = batch * context * 2 * cfg.num_kv_heads * cfg.head_dim * np.dtype(layout.dtype).itemsize
    return out, kv_bytes


def _dense_route(batch: int, context: int) -> tuple[float, bool, float]:
    """MaxText's own decode step on its dense KV cache (the layer's state donated and fed back)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from maxtext_compat.testing import tiny

    cfg = _config(batch, context, vllm=False)
    if int(cfg.micro_batch_size_to_train_on) != batch:
        raise AssertionError(f"MaxText's dense cache holds {cfg.micro_batch_size_to_train_on} sequences, not {batch}")
    mesh = tiny.tiny_mesh(cfg)
    graphdef, state = nnx.split(_layer(cfg, mesh))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((batch, 1, cfg.emb_dim)).astype(DTYPE))
    pos = jnp.full((batch, 1), context - 1, jnp.int32)

    def call(state: Any) -> Any:
        model = nnx.merge(graphdef, state)
        y = model(x, None, pos, True, MODE)
        return (y[0] if isinstance(y, tuple) else y), nnx.state(model)

    with tiny.mesh_context(cfg, mesh):
        jitted = jax.jit(call, donate_argnums=0)
        _, first, cached, median = _timed_loop(jitted, state, keep_carry=False)
    return first, cached, median


def _agreement(routes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each route's first output and cache beside the native call's (wrap: bit for bit; rpa_xla: bf16 rounding)."""
    import numpy as np

    def bits(a: Any) -> Any:  # the raw bytes: equal caches are equal bit for bit, without a float64 copy
        a = np.ascontiguousarray(np.asarray(a))
        return a.view(np.uint8)

    ref_y, ref_kv = routes["native (installed kernel)"][0]
    ref_y64, ref_bits = np.asarray(ref_y, np.float64), bits(ref_kv)
    tol = 1e-3 if DTYPE == "float32" else 6e-2
    agree = {}
    for name, ((y, kv), *_) in routes.items():
        diff = float(np.abs(np.asarray(y, np.float64) - ref_y64).max())
        same_cache = bool(np.array_equal(bits(kv), ref_bits))
        agree[name] = {"max_abs_diff": diff, "caches_equal": same_cache}
        exact = "wrap" in name
        if not same_cache or (diff != 0.0 if exact else diff > tol):
            raise AssertionError(f"{name} disagrees with the native call ({agree[name]}): no figure")
    return agree


def _shape(batch: int, context: int) -> dict[str, Any]:
    routes, kv_bytes = _paged_routes(batch, context)
    agree = _agreement(routes)
    base = routes["native (installed kernel)"][3]
    rows = [
        {"route": name, "us": med * 1e6, "ratio_to_native": med / base, "first_call_s": first, "cached": cached,
         **agree[name]}
        for name, (_, first, cached, med) in routes.items()
    ]  # fmt: skip
    first, cached, dense = _dense_route(batch, context)
    rows.append({"route": "MaxText's dense decode (own KV cache)", "us": dense * 1e6, "ratio_to_native": dense / base,
                 "first_call_s": first, "cached": cached})  # fmt: skip
    xla = routes["native on rpa_xla"][3]
    return {
        "batch": batch, "context": context, "kv_bytes": kv_bytes, "rows": rows,
        "wrap_over_native": routes["through wrap(), KV-write check on"][3] / base,
        "wrap_check_off_over_native": routes["through wrap(), check off"][3] / base,
        "rpa_xla_over_dense": xla / dense, "kernel_over_dense": base / dense, "hbm_gib": hbm(),
    }  # fmt: skip


def copy_ceiling() -> dict[str, Any]:
    """GB/s a plain XLA program gets from this device's memory: x + 1 (read + write) and a sum (read) of COPY_BYTES."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((COPY_BYTES // 2,), jnp.bfloat16)
    add = jax.jit(lambda a: a + jnp.bfloat16(1))
    total = jax.jit(lambda a: jnp.sum(a, dtype=jnp.float32))
    calls, runs = (2, 2) if DRY else (20, 5)
    copy_s = median_call(lambda: add(x), calls, runs)[0]
    read_s = median_call(lambda: total(x), calls, runs)[0]
    copy_gbs, read_gbs = 2 * COPY_BYTES / copy_s / 1e9, COPY_BYTES / read_s / 1e9
    return {"bytes": COPY_BYTES, "copy_gbs": copy_gbs, "read_gbs": read_gbs, "ceiling_gbs": max(copy_gbs, read_gbs)}


def step_section(saved: Callable[[dict[str, Any]], None] = lambda _: None) -> dict[str, Any]:
    """The copy ceiling, then every shape's figures; `saved` gets the section as it grows."""
    out: dict[str, Any] = {"layer": {**LAYER, "head_dim": 128, "dtype": DTYPE, "page": PAGE},
                           "rounds": f"median of {ROUNDS[1]} runs of {ROUNDS[0]} steps", "shapes": []}  # fmt: skip
    out["copy"] = copy_ceiling()
    saved(out)
    for batch, context in SHAPES:
        start = time.perf_counter()
        try:
            out["shapes"].append(_shape(batch, context))
        except Exception as exc:  # one shape's failure must not hide the others' figures
            traceback.print_exc()
            out["shapes"].append({"batch": batch, "context": context, "error": f"{type(exc).__name__}: {exc}"[:500]})
        print(f"[bench-accel] step {batch} x {context}: {time.perf_counter() - start:.1f} s", file=sys.stderr,
              flush=True)  # fmt: skip
        saved(out)
    return out
