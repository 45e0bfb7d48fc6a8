"""Paged decode: one decode step through the plugin's vLLM path vs MaxText's native vllm_rpa path.

    MAXTEXT_COMPAT_ENV=maxtext-0.2.5 .envs/maxtext-0.2.5/bin/python benchmarks/bench_decode.py               # first
    MAXTEXT_COMPAT_ENV=maxtext-0.1.0-jax011 .envs/maxtext-0.1.0-jax011/bin/python benchmarks/bench_decode.py

Why: the plugin must cost nothing on top of MaxText's own serving path, and the backport must
serve 0.1.0 as fast as 0.2.5 serves itself. "Plugin path" is the serving backend's `forward`
as `MaxTextForCausalLM` calls it (jitted as tpu-inference jits the model step); "native" is
MaxText 0.2.5's `Transformer(..., kv_caches=, attention_metadata=, model_mode="autoregressive")`
called directly, on the same model (same weights). On 0.2.5 both run interleaved in one
process. The 0.1.0 run (BackportBackend.forward) loads 0.2.5's weights, KV caches and
inputs from $BENCH_WORK and is compared with 0.2.5's native time from the 0.2.5 run (another
process, run just before on the same idle machine) and with its hidden states (max |Δ|).
The step: 8 decode sequences with ragged contexts (5 to 63 tokens, 1 to 4 pages of 16), the
RPA kernel in CPU interpret mode; the time is the model step (hidden + KV caches), without
the logits (a separate call in tpu-inference).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import run_all

LENS = [5, 14, 21, 30, 40, 47, 55, 63]  # context lengths after this step's token
PAGE, ROUNDS = 16, 10
MODE = "autoregressive"
SERVED_KEYS = (
    "base_emb_dim", "base_num_query_heads", "base_num_kv_heads", "head_dim", "base_mlp_dim",
    "base_num_decoder_layers", "vocab_size", "max_target_length", "max_prefill_predict_length",
    "dtype", "weight_dtype", "matmul_precision",
)  # fmt: skip
NATIVE_FIGURE = "paged decode · step through the plugin's backend (NativeBackend.forward)"


def work_dir() -> Path:
    d = Path(os.environ.get("BENCH_WORK") or Path(tempfile.gettempdir()) / "maxtext_compat_bench")
    d.mkdir(parents=True, exist_ok=True)
    return d


def runner_mesh(cfg: Any, native: bool) -> Any:
    """The mesh the step runs on: vllm.yml's axes (0.2.5), or tpu-inference's runner axes (backport)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from helpers import crossrun
    from maxtext_compat.paged.sharding import axis_names

    if native:
        return crossrun.native_mesh(cfg, 1)
    if isinstance(axis_names()[1], tuple):  # NEW_MODEL_DESIGN: tpu-inference's 7 axes
        from tpu_inference.layers.common.sharding import MESH_AXIS_NAMES

        return Mesh(np.array(jax.devices()[:1]).reshape([1] * len(MESH_AXIS_NAMES)), MESH_AXIS_NAMES)
    return Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))


def step_inputs(cfg: Any, mesh: Any, caches_np: list[Any] | None) -> tuple[Any, ...]:
    """(layout, caches, token ids, positions, attention metadata) of the decode step, in kernel order."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from maxtext_compat import paged

    num_pages = sum(paged.layout.cdiv(n, PAGE) for n in LENS)
    layout = paged.KVCacheLayout(num_pages, PAGE, int(cfg.num_kv_heads), int(cfg.head_dim), "float32")
    alloc = paged.PageAllocator(num_pages, PAGE)
    for i, n in enumerate(LENS):
        alloc.append(i, n - 1)  # the context already in the cache
    md = paged.build_metadata([alloc.append(i, 1) for i in range(len(LENS))], layout, max_num_tokens=len(LENS),
                              max_num_seqs=len(LENS), pages_per_seq=4)  # fmt: skip
    if caches_np is None:  # random context K/V, shared with the backport run through the .npz
        rng = np.random.default_rng(0)
        caches_np = [rng.standard_normal(layout.shape).astype(np.float32) for _ in range(cfg.num_decoder_layers)]
    caches = [jax.device_put(c, layout.sharding(mesh)) for c in caches_np]
    ids = jnp.asarray(md.to_kernel_order(np.arange(1, len(LENS) + 1, dtype=np.int32)))
    pos = jnp.asarray(np.asarray(md.input_positions, np.int32))
    return layout, caches, ids, pos, md.to_attention_metadata(), caches_np


def timed(fns: dict[str, Any], args: tuple[Any, ...], ctx: Any) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Compile each fn, then ROUNDS interleaved warm calls: seconds per call and each fn's output."""
    import jax

    outs = {}
    for name, fn in fns.items():
        with ctx():
            outs[name] = jax.block_until_ready(fn(*args))
    times: dict[str, list[float]] = {n: [] for n in fns}
    for r in range(ROUNDS):
        for name in list(fns)[r % len(fns) :] + list(fns)[: r % len(fns)]:
            with ctx():
                start = time.perf_counter()
                jax.block_until_ready(fns[name](*args))
                times[name].append(time.perf_counter() - start)
    return times, outs


def _ms(xs: list[float]) -> tuple[float, str]:
    q = statistics.quantiles(xs, n=4)
    return statistics.median(xs) * 1e3, f"IQR {q[0] * 1e3:.0f} to {q[2] * 1e3:.0f}"


def run() -> list[dict[str, Any]]:
    run_all.cpu_env()
    import tpu_inference  # noqa: F401 - before MaxText (0.1.0's TensorFlow protobuf vs tpu_info's probe)

    from maxtext_compat.cpu import rpa as cpu_rpa

    cpu_rpa.install()
    import jax
    import numpy as np
    from flax import nnx

    from maxtext_compat.serving.backend import backend_for
    from maxtext_compat.serving.param_trees import load_npz, load_params, save_params
    from maxtext_compat.testing import tiny

    row = tiny.installed_row()
    native = row.has_kv_params
    backend = backend_for(row)
    work = work_dir()
    cfg = backend.load_config({"model_name": "default", **{k: tiny.TINY[k] for k in SERVED_KEYS},
                               "base_output_directory": tempfile.mkdtemp(prefix="maxtext_compat_")})  # fmt: skip
    mesh = runner_mesh(cfg, native)
    with jax.set_mesh(mesh):
        model = backend.create_model(cfg, mesh, jax.random.PRNGKey(0))
    saved = None
    if native:
        save_params(model, work / "decode_weights.npz")
    else:
        if not (work / "decode_io.npz").exists():
            raise FileNotFoundError(f"{work / 'decode_io.npz'}: run bench_decode.py in maxtext-0.2.5 first")
        load_params(model, load_npz(work / "decode_weights.npz"), where="the backport model (0.2.5's weights)")
        with np.load(work / "decode_io.npz") as f:
            saved = {k: f[k] for k in f.files}
    layout, caches, ids, pos, md, caches_np = step_inputs(
        cfg, mesh, None if saved is None else [saved[f"cache_{i}"] for i in range(cfg.num_decoder_layers)]
    )
    graphdef, state = nnx.split(model)

    @jax.jit
    def plugin(state: Any, caches: list[Any], ids: Any, pos: Any, md: Any) -> Any:
        m = nnx.merge(graphdef, state)
        out = backend.forward(m, cfg, mesh, input_ids=ids, positions=pos, kv_caches=caches, attention_metadata=md)
        return out.hidden, out.kv_caches

    fns = {"plugin": plugin}
    if native:

        @jax.jit
        def maxtext(state: Any, caches: list[Any], ids: Any, pos: Any, md: Any) -> Any:
            m = nnx.merge(graphdef, state)
            hidden, new = m(
                ids[:, None], pos[:, None], kv_caches=caches, attention_metadata=md, model_mode="autoregressive"
            )
            return hidden.reshape(-1, hidden.shape[-1]), list(new)

        fns["native"] = maxtext
    ctx = (lambda: tiny.mesh_context(cfg, mesh)) if native else (lambda: jax.set_mesh(mesh))
    times, outs = timed(fns, (state, caches, ids, pos, md), ctx)
    hidden = np.asarray(outs["plugin"][0])
    value, spread = _ms(times["plugin"])
    step = f"{len(LENS)} decode seqs, contexts {LENS[0]}-{LENS[-1]} tokens, {layout.num_pages} pages of {PAGE}"
    if native:
        np.savez(work / "decode_io.npz", hidden=hidden, **{f"cache_{i}": c for i, c in enumerate(caches_np)})
        diff = float(np.abs(hidden - np.asarray(outs["native"][0])).max())
        native_ms, native_spread = _ms(times["native"])
        how = (
            f"median of {ROUNDS} interleaved warm jitted steps ({native_spread} native); {step}; same model; "
            f"hidden max|Δ| vs native {diff:.1e}"
        )
        rows = [run_all.row(NATIVE_FIGURE, value, "ms/step", how, native=native_ms, spread=spread)]
    else:
        diff = float(np.abs(hidden - saved["hidden"]).max())
        how = (
            f"median of {ROUNDS} warm jitted steps; {step}; 0.2.5's weights, caches and inputs; hidden max|Δ| vs "
            f"0.2.5 native {diff:.1e}; native: 0.2.5's native step from its own run (another process)"
        )
        rows = [run_all.row("paged decode · backport step on 0.1.0 (BackportBackend.forward)", value,
                            "ms/step", how, spread=spread,
                            ref={"env": "maxtext-0.2.5", "figure": NATIVE_FIGURE})]  # fmt: skip
    print(f"  decode: {value:.1f} ms/step, max|Δ| {diff:.1e}", file=sys.stderr)
    return rows


if __name__ == "__main__":
    run_all.emit(run())
