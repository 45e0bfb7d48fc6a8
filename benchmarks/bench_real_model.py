"""Real model: SmolLM2-135M greedy-decoding 16 tokens on this CPU, against MaxText's own dense decode.

    MAXTEXT_COMPAT_ENV=maxtext-0.2.5 .envs/maxtext-0.2.5/bin/python benchmarks/bench_real_model.py

Why: serving a 30-layer model on CPU is usable only if the RPA kernel is fast. Three figures, all in one
process on the converted weights: (1) MaxText's own dense decode (train-mode forward over the whole padded
sequence each step, no KV cache) of 16 tokens for 4 prompts -- the native reference; (2) the same 16 tokens
through the paged KV cache and MaxText's vLLM path with the XLA kernel (`maxtext_compat.kernel.rpa_xla`), the path a
CPU server runs, as a ratio to (1); (3) one head_dim-64 RPA call of a 4-sequence decode batch: the XLA kernel vs
the real kernel in Pallas interpret mode (the ratio is the speed-up). Every figure is the median of warm runs
(compilation excluded); the greedy tokens of (1) and (2) must be equal or the figure is not written.
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

import run_all

STEPS = 16
ROUNDS = 3
KERNEL_ROUNDS = 5


def _median_seconds(fn: Any, rounds: int) -> tuple[float, str]:
    fn()  # warm: compiles
    times = run_all.timings(fn, rounds)
    return statistics.median(times), f"min {min(times):.3g} s, max {max(times):.3g} s over {rounds}"


def _kernel_rows() -> list[dict[str, Any]]:
    import jax.numpy as jnp
    import numpy as np
    from tpu_inference.kernels.ragged_paged_attention.v3 import kernel_hd64

    from maxtext_compat.cpu import rpa as cpu_rpa
    from maxtext_compat.kernel import rpa_xla

    rng = np.random.default_rng(0)
    pages, page, heads, kv_heads, tokens, seqs = 64, 16, 9, 3, 16, 4
    cache = jnp.asarray(
        rng.standard_normal(kernel_hd64.get_kv_cache_shape(pages, page, kv_heads, 64, jnp.float32)), jnp.float32
    )
    q, k, v = (jnp.asarray(rng.standard_normal((tokens, h, 64)), jnp.float32) for h in (heads, kv_heads, kv_heads))
    kv_lens = jnp.asarray([20, 31, 9, 17], jnp.int32)
    page_indices = jnp.asarray(rng.permutation(pages)[: seqs * 2].astype(np.int32))
    cu = jnp.asarray([0, 1, 2, 3, 4], jnp.int32)
    dist = jnp.asarray([4, 4, 4], jnp.int32)

    def real() -> None:
        args = [jnp.array(a, copy=True) for a in (q, k, v, cache)]  # the kernel donates q and the cache
        with cpu_rpa.interpret_mode():
            kernel_hd64.ragged_paged_attention_hd64(*args, kv_lens, page_indices, cu, dist)[0].block_until_ready()

    def xla() -> None:
        rpa_xla.ragged_paged_attention_hd64(q, k, v, cache, kv_lens, page_indices, cu, dist)[0].block_until_ready()

    t_real, s_real = _median_seconds(real, KERNEL_ROUNDS)
    t_xla, s_xla = _median_seconds(xla, KERNEL_ROUNDS)
    how = "one head_dim-64 RPA call, 4 decode sequences (9 q / 3 KV heads, pages of 16), float32"
    return [
        run_all.row(
            "real model · RPA call, real kernel (Pallas interpret mode)", t_real * 1e3, "ms", how, spread=s_real
        ),
        run_all.row(
            "real model · RPA call, XLA kernel (maxtext_compat.kernel.rpa_xla)",
            t_xla * 1e3,
            "ms",
            how,
            native=t_real * 1e3,
            spread=s_xla,
        ),
    ]


def run() -> list[dict[str, Any]]:
    run_all.cpu_env()
    import tpu_inference  # noqa: F401 - before MaxText

    from maxtext_compat.cpu import rpa as cpu_rpa

    cpu_rpa.install()
    from maxtext_compat.cpu import serving as cpu_serving
    from maxtext_compat.decode import PagedEngine
    from maxtext_compat.testing import real_model as rm

    ckpt, tokenizer = rm.smollm2()
    prompts = [tokenizer.encode(p).ids for p in rm.PROMPTS]

    dense_cfg, dense_mesh, dense_model = rm.maxtext_model(ckpt)
    dense_tokens: list[list[int]] = []

    def dense() -> None:
        dense_tokens[:] = rm.maxtext_greedy(dense_cfg, dense_mesh, dense_model, prompts, STEPS)

    t_dense, s_dense = _median_seconds(dense, ROUNDS)

    cpu_serving.install(parts=("rpa",))  # the XLA kernel where a CPU server has it: behind sharded_rpa
    try:
        _, _, served = rm.maxtext_model(ckpt, vllm=True)
        engine = PagedEngine(served, num_pages=16, page_size=16)
        paged_tokens: list[list[int]] = []

        def paged() -> None:
            paged_tokens[:] = [list(t) for t in engine.generate(prompts, STEPS - 1).tokens()]

        t_paged, s_paged = _median_seconds(paged, ROUNDS)
    finally:
        cpu_serving.uninstall()
    if paged_tokens != dense_tokens:
        print(f"[bench] paged {paged_tokens} != dense {dense_tokens}", file=sys.stderr)
        raise AssertionError("the paged decode's tokens differ from MaxText's dense decode: no figure written")
    how = f"SmolLM2-135M (30 layers), 4 prompts x {STEPS} greedy tokens, float32, tokens equal"
    return [
        run_all.row("real model · 16 tokens, MaxText's own dense decode", t_dense, "s", how, spread=s_dense),
        run_all.row(
            "real model · 16 tokens, paged KV + vLLM path + XLA kernel",
            t_paged,
            "s",
            how,
            native=t_dense,
            spread=s_paged,
        ),
        *_kernel_rows(),
    ]


if __name__ == "__main__":
    run_all.emit(run())
