"""`make bench-tpu`: the TPU tier's figures, measured in one process on the chip (or rehearsed on a CPU: dry).

    python benchmarks/bench_tpu.py kernel|model|all --json OUT.json      (MAXTEXT_COMPAT_TPU=1 on a TPU, =dry on CPU)
    python benchmarks/bench_tpu.py render --doc docs/accelerators.md OUT.json ...  (bench_tpu_render.py)

kernel: per shape, the raw kernel of the installed tpu-inference (jitted), our dispatcher called as a function (its
checks and the metadata upload every call) and inside a jitted step (what a model step pays), `rpa_xla` on the same
arrays: the median time per call of repeated runs, ratios to the raw kernel, the KV bytes read per call as GB/s and
as a fraction of the chip's HBM bandwidth (v5e: 819 GB/s), each compile time, the HBM peak. The outputs must agree
(caches element for element) or the shape's figures are not written.
model: SmolLM2-135M (converted GGUF, float32; MaxText's matmul_precision 'highest' as testing.tiny configures it,
jax's default elsewhere), 4 prompts x 16 greedy tokens: time to
first token (the prefill step) and decode tokens/s of the paged KV cache through MaxText 0.2.3's vLLM path on the
kernel, driven by the layer's engine (maxtext_compat.decode.PagedEngine: the model through wrap()) and by the same
engine loop on the unwrapped model (MaxText native); MaxText's own dense decode beside them; compile times, HBM.
The native and the layer's tokens must be equal or no figure is written.

Dry (CPU): the kernel interpreted, small shapes, few rounds; the JSON says so and the renderer labels it a CPU
rehearsal, never a TPU figure.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]  # bench_tpu_render; helpers (reference attention, torch aid)

from bench_timing import Cached, count_cache_events, first_call, hbm, median_call  # noqa: E402  (path above)

from helpers import accel_mode  # noqa: E402  (tests/ on the path above)

MODE = accel_mode.mode() or "1"
DRY = accel_mode.dry()
HBM_PEAK_GBS = {"TPU v5 lite": 819.0, "TPU v5e": 819.0}  # HBM bandwidth per chip, GB/s


@dataclass(frozen=True)
class Shape:
    name: str
    lens: tuple[tuple[int, int], ...]  # (q_len, kv_len) per sequence
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    page: int = 16
    eager: bool = True  # also time the dispatcher called as a function (one more kernel compile: 8-25 s on a v5e)


TPU_SHAPES = (
    Shape("decode 8 x 1,000, 8q/2kv, hd128, bf16", ((1, 1000),) * 8, 8, 2, 128, "bfloat16"),
    Shape("mixed: 2 decodes, prefill 40 of 300, prefill 16, bf16", ((1, 500), (1, 77), (40, 300), (16, 16)), 8, 2,
          128, "bfloat16", eager=False),
    Shape("decode 32 x 2,000, 32q/8kv, hd128, bf16", ((1, 2000),) * 32, 32, 8, 128, "bfloat16", eager=False),
    Shape("SmolLM2 decode 4 x 64, 9q/3kv, hd64, f32", ((1, 64),) * 4, 9, 3, 64, "float32"),
)  # fmt: skip
DRY_SHAPES = (
    Shape("decode 4 x 40, 8q/2kv, hd128, bf16", ((1, 40),) * 4, 8, 2, 128, "bfloat16"),
    Shape("mixed: decode, prefill 9 of 20, prefill 5, bf16", ((1, 30), (9, 20), (5, 5)), 8, 2, 128, "bfloat16"),
    Shape("SmolLM2 decode 4 x 20, 9q/3kv, hd64, f32", ((1, 20),) * 4, 9, 3, 64, "float32"),
)
SECTIONS = ("kernel", "step", "model")  # in the order `all` runs them; step: bench_accel_step.py
# (calls per run, runs) for the kernel timings; (generations, prompts, tokens) for the model
KERNEL_ROUNDS = (3, 3) if DRY else (50, 7)
MODEL_RUNS, MODEL_PROMPTS, MODEL_TOKENS = (2, 2, 4) if DRY else (5, 4, 16)


# ----------------------------------------------------------------------------------------------
# Set-up shared by both sections
# ----------------------------------------------------------------------------------------------


def _start() -> dict[str, Any]:
    """Check the mode against the backend (a dry figure never passes for a TPU one); what ran where."""
    os.environ.setdefault("TPU_NAME", "local")
    os.environ.setdefault("TPU_WORKER_ID", "0")
    if DRY:
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", "cpu")
    from helpers.torch_overloads import allow_removed_dimname_overloads

    allow_removed_dimname_overloads()  # before tpu_inference imports torchax (the machine's torch 2.13)
    import jax

    backend = jax.default_backend()
    if (backend in ("tpu", "gpu")) == DRY:
        raise SystemExit(f"bench_tpu: {accel_mode.ENV}={MODE} but jax's backend is {backend!r}")
    if accel_mode.without_pallas(backend):  # the GPU route: MaxText's vLLM attention on rpa_xla for this process
        from helpers.xla_kernel import rpa_xla_bound

        _PROCESS.enter_context(rpa_xla_bound())
    elif DRY:
        from maxtext_compat.cpu import rpa as cpu_rpa

        assert cpu_rpa.install().active
    count_cache_events()
    import importlib.metadata

    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    dists = ("jax", "jaxlib", "libtpu", "flax", "maxtext", "tpu-inference", "vllm-tpu", "torch", "maxtext-compat")
    return {
        "mode": "dry" if DRY else backend,
        "pallas": not accel_mode.without_pallas(backend),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "device": jax.devices()[0].device_kind,
        "devices": len(jax.devices()),
        "python": platform.python_version(),
        "versions": {d: version(d) for d in dists},
        "compilation_cache": jax.config.jax_compilation_cache_dir,
    }


RESULT_RUN: dict[str, Any] = {}  # this run's facts (_start), for the sections
_PROCESS = contextlib.ExitStack()  # what the GPU route binds for the whole run


# ----------------------------------------------------------------------------------------------
# kernel
# ----------------------------------------------------------------------------------------------


def _kernel_shape(shape: Shape) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from helpers.reference_attention import make_ragged_step
    from maxtext_compat import paged
    from maxtext_compat.kernel import rpa, rpa_xla
    from maxtext_compat.paged.metadata import metadata_arrays

    hd64 = shape.head_dim == 64
    if hd64:
        from tpu_inference.kernels.ragged_paged_attention.v3.kernel_hd64 import ragged_paged_attention_hd64 as raw
    else:
        from tpu_inference.kernels.ragged_paged_attention.v3.kernel import ragged_paged_attention as raw
    pages_per_seq = max(-(-kv // shape.page) for _, kv in shape.lens)
    num_pages = sum(-(-kv // shape.page) for _, kv in shape.lens) + 2
    tokens = max(16, -(-sum(q for q, _ in shape.lens) // 16) * 16)
    layout = paged.KVCacheLayout(num_pages, shape.page, shape.kv_heads, shape.head_dim, shape.dtype)
    step = make_ragged_step(layout, list(shape.lens), num_q_heads=shape.q_heads, max_num_tokens=tokens,
                            max_num_seqs=len(shape.lens), pages_per_seq=pages_per_seq, poison=False)  # fmt: skip
    scale = shape.head_dim**-0.5
    mesh = paged.make_mesh(1)
    cache = jax.device_put(step.kv_cache, layout.sharding(mesh))
    arrays = metadata_arrays(step.metadata)
    am = step.metadata.to_attention_metadata()
    q, k, v = step.q, step.k, step.v
    raw_jit = jax.jit(functools.partial(raw, sm_scale=scale))
    xla_fn = rpa_xla.ragged_paged_attention_hd64 if hd64 else rpa_xla.ragged_paged_attention
    xla_jit = jax.jit(functools.partial(xla_fn, sm_scale=scale))
    disp_jit = jax.jit(lambda q, k, v, c, md: rpa.ragged_paged_attention(q, k, v, c, md, mesh=mesh, sm_scale=scale))
    calls = {
        "raw kernel": lambda: raw_jit(q, k, v, cache, *arrays),
        "dispatcher, called as a function": lambda: rpa.ragged_paged_attention(q, k, v, cache, step.metadata,
                                                                                 mesh=mesh, sm_scale=scale),
        "dispatcher inside a jitted step": lambda: disp_jit(q, k, v, cache, am),
        "rpa_xla (XLA, no Pallas)": lambda: xla_jit(q, k, v, cache, *arrays),
    }  # fmt: skip
    if not shape.eager:
        del calls["dispatcher, called as a function"]
    firsts = {name: first_call(fn) for name, fn in calls.items()}  # name -> (seconds, from the cache)
    outs = {name: jax.block_until_ready(fn()) for name, fn in calls.items()}
    n = step.metadata.num_tokens
    ref_out, ref_cache = (np.asarray(x) for x in outs["raw kernel"])
    tol = 6e-2 if shape.dtype == "bfloat16" else 2e-3  # default matmul precision on the chip (the probe: ~1e-3)
    agree = {}
    for name, (out, new_cache) in outs.items():
        diff = float(np.abs(np.asarray(out[:n], np.float64) - ref_out[:n].astype(np.float64)).max())
        same_cache = bool(np.array_equal(np.asarray(new_cache), ref_cache))
        agree[name] = {"max_abs_diff": diff, "caches_equal": same_cache}
        if not (diff <= tol and same_cache):
            raise AssertionError(f"{shape.name}: {name} disagrees with the raw kernel ({agree[name]}): no figure")
    timed = {name: median_call(fn, *KERNEL_ROUNDS) for name, fn in calls.items()}
    itemsize = jnp.dtype(shape.dtype).itemsize
    kv_bytes = sum(kv for _, kv in shape.lens) * 2 * shape.kv_heads * shape.head_dim * itemsize
    base = timed["raw kernel"][0]
    rows = []
    for name, (med, lo, hi) in timed.items():
        rows.append({
            "call": name, "us": med * 1e6, "min_us": lo * 1e6, "max_us": hi * 1e6, "ratio": med / base,
            "kv_gbs": kv_bytes / med / 1e9, "first_call_s": firsts[name][0], "cached": firsts[name][1],
            **agree[name],
        })  # fmt: skip
    return {"shape": shape.name, "kv_bytes": kv_bytes, "rows": rows, "hbm_gib": hbm()}


def kernel_section(saved: Callable[[dict[str, Any]], None] = lambda _: None) -> dict[str, Any]:
    """Every shape's figures; `saved` gets the section after each shape (written out as it grows)."""
    import jax

    calls, runs = KERNEL_ROUNDS
    peak = HBM_PEAK_GBS.get(jax.devices()[0].device_kind)
    out: dict[str, Any] = {"peak_gbs": None if DRY else peak, "rounds": f"median of {runs} runs of {calls} calls",
                           "shapes": []}  # fmt: skip
    if not RESULT_RUN.get("pallas", True):
        out["skipped"] = accel_mode.PALLAS_REASON  # the raw kernel and the dispatcher on it: TPU only
        return out
    for shape in DRY_SHAPES if DRY else TPU_SHAPES:
        start = time.perf_counter()
        try:
            out["shapes"].append(_kernel_shape(shape))
        except Exception as exc:  # one shape's failure must not hide the others' figures
            out["shapes"].append({"shape": shape.name, "error": f"{type(exc).__name__}: {exc}"[:500]})
        print(f"[bench-tpu] kernel {shape.name}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        saved(out)
    return out


# ----------------------------------------------------------------------------------------------
# model
# ----------------------------------------------------------------------------------------------


def _native_engine(model: Any, **kwargs: Any) -> Any:
    """The layer's engine loop driving the unwrapped model (MaxText's own new call): the baseline it is measured
    against. Same buckets, metadata, pages and jitted step; only the called module differs."""
    from flax import nnx

    from maxtext_compat.decode import PagedEngine
    from maxtext_compat.decode.paged import _step
    from maxtext_compat.decode.timing import TraceCountingJit

    engine = PagedEngine(model, **kwargs)
    engine.model = model
    engine._graphdef = nnx.split(model)[0]
    engine._step = TraceCountingJit(functools.partial(_step, engine._graphdef))
    return engine


def _paged_figures(engine: Any, ids: list[list[int]]) -> dict[str, Any]:
    with Cached() as c:
        first = time.perf_counter()
        gen = engine.generate(ids, MODEL_TOKENS - 1)
        first = time.perf_counter() - first
    cached = c.cached
    walls, prefill, decode = [], [], []
    tokens = gen.tokens()
    for _ in range(MODEL_RUNS):
        start = time.perf_counter()
        g = engine.generate(ids, MODEL_TOKENS - 1)
        walls.append(time.perf_counter() - start)
        assert g.tokens() == tokens, "the same greedy run gave other tokens"
        prefill.append(g.steps[0].seconds)
        decode += [s.seconds for s in g.steps[1:]]
    step = statistics.median(decode)
    return {
        "tokens": tokens, "ttft_ms": statistics.median(prefill) * 1e3, "decode_step_ms": step * 1e3,
        "decode_tokens_per_s": len(ids) / step, "wall_s": statistics.median(walls),
        "end_to_end_tokens_per_s": len(ids) * MODEL_TOKENS / statistics.median(walls),
        "compile_s": gen.compile_seconds, "compiles": gen.compiles, "first_generate_s": first, "cached": cached,
    }  # fmt: skip


def model_section() -> dict[str, Any]:
    from maxtext_compat.decode import PagedEngine
    from maxtext_compat.testing import real_model as rm

    ckpt, tokenizer = rm.smollm2()
    ids = [tokenizer.encode(p).ids for p in rm.PROMPTS[:MODEL_PROMPTS]]
    out: dict[str, Any] = {"prompts": list(rm.PROMPTS[:MODEL_PROMPTS]), "new_tokens": MODEL_TOKENS,
                           "runs": MODEL_RUNS}  # fmt: skip
    _, _, served = rm.maxtext_model(ckpt, vllm=True)
    out["layer"] = _paged_figures(PagedEngine(served, num_pages=16, page_size=16), ids)
    out["native"] = _paged_figures(_native_engine(served, num_pages=16, page_size=16), ids)
    if out["layer"]["tokens"] != out["native"]["tokens"]:
        raise AssertionError(f"native {out['native']['tokens']} != layer {out['layer']['tokens']}: no figure")
    out["paged_hbm_gib"] = hbm()
    del served
    cfg, mesh, model = rm.maxtext_model(ckpt)
    with Cached() as c:
        start = time.perf_counter()
        dense_tokens = rm.maxtext_greedy(cfg, mesh, model, ids, MODEL_TOKENS)
        first = time.perf_counter() - start
    cached = c.cached
    forward_times, walls = [], []
    for _ in range(MODEL_RUNS):
        start = time.perf_counter()
        rm.maxtext_logits(cfg, mesh, model, ids)  # one dense forward of the batch: the prefill, and every step
        forward_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        assert rm.maxtext_greedy(cfg, mesh, model, ids, MODEL_TOKENS) == dense_tokens
        walls.append(time.perf_counter() - start)
    step = statistics.median(forward_times)
    out["dense"] = {
        "tokens": dense_tokens, "ttft_ms": step * 1e3, "decode_step_ms": step * 1e3,
        "decode_tokens_per_s": len(ids) / step, "wall_s": statistics.median(walls),
        "end_to_end_tokens_per_s": len(ids) * MODEL_TOKENS / statistics.median(walls),
        "compile_s": max(first - statistics.median(walls), 0.0), "first_generate_s": first, "cached": cached,
    }  # fmt: skip
    out["dense_hbm_gib"] = hbm()
    out["paged_equals_dense"] = out["layer"]["tokens"] == dense_tokens
    out["layer_over_native_tokens_per_s"] = out["layer"]["decode_tokens_per_s"] / out["native"]["decode_tokens_per_s"]
    return out


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("section", help="kernel, step, model or all, several joined by commas (kernel,step); or render")
    ap.add_argument("inputs", nargs="*", type=Path, help="render: the JSON files to render")
    ap.add_argument("--json", type=Path, help="where the figures go (kernel/model/all)")
    ap.add_argument(
        "--doc", type=Path, default=Path("docs/accelerators.md"), help="render: the page whose section is rewritten"
    )
    a = ap.parse_intermixed_args(argv)
    sections = SECTIONS if a.section == "all" else tuple(a.section.split(","))
    if a.section != "render" and not set(sections) <= set(SECTIONS):
        ap.error(f"section {a.section!r}: name {', '.join(SECTIONS)} or all (several joined by commas), or render")
    if a.section == "render":
        from bench_tpu_render import render_into

        print(render_into(a.doc, [json.loads(p.read_text(encoding="utf-8")) for p in a.inputs]))
        return 0
    start = time.perf_counter()
    result: dict[str, Any] = {"run": _start()}
    RESULT_RUN.update(result["run"])

    def save(section: str | None = None, part: dict[str, Any] | None = None) -> None:
        """Write what is measured so far (a call stopped at its limit still brings the finished shapes back)."""
        if section is not None:
            result[section] = part
        result["run"]["seconds"] = round(time.perf_counter() - start, 1)
        if a.json:
            a.json.parent.mkdir(parents=True, exist_ok=True)
            a.json.write_text(json.dumps(result, indent=1, default=float), encoding="utf-8")

    if "kernel" in sections:
        save("kernel", kernel_section(lambda part: save("kernel", part)))
    if "step" in sections:
        from bench_accel_step import step_section

        save("step", step_section(lambda part: save("step", part)))
    if "model" in sections:
        save("model", model_section())
    print(json.dumps(result, indent=1, default=float) if not a.json else f"[bench-tpu] {a.section}: {a.json} in "
          f"{result['run']['seconds']} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
