"""Benchmark: real RPA kernel (CPU interpret mode) vs dense float64 reference; paged vs contiguous KV bytes.

    make bench            # writes build/bench.md
    .envs/maxtext-0.2.5/bin/python benchmarks/bench_paged.py [--out build/bench.md] [--repeat 3]

Why: interpret mode exists to prove correctness on CPU, not speed; the numbers say how much a
test costs (compile once, then per call) and show what paging buys in memory: a paged cache
holds only the pages requests use, a contiguous one reserves max_len tokens per request.
Not a timed test: numbers vary with the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import run_all

# Before jax is imported: CPU only, and keep tpu-inference from polling GCE metadata.
for _key, _value in (
    ("JAX_PLATFORMS", "cpu"),
    ("TPU_NAME", "cpu-test"),
    ("TPU_WORKER_ID", "0"),
    ("TPU_ACCELERATOR_TYPE", "cpu"),
):
    os.environ.setdefault(_key, _value)

PAGE_SIZE = 16
MAX_LEN = 512  # tokens a contiguous cache reserves per request


@dataclass(frozen=True)
class Shape:
    name: str
    lens: list[tuple[int, int]]  # (q_len, kv_len) per request
    num_q_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 128
    dtype: str = "float32"


SHAPES = [
    Shape("decode x8", [(1, 40 + 23 * i) for i in range(8)]),
    Shape("prefill 2x64", [(64, 64), (64, 64)]),
    Shape("mixed 6 decode + 1 chunked prefill", [(1, 30 + 50 * i) for i in range(6)] + [(32, 72)]),
    Shape("long decode x4 (bf16)", [(1, 500), (1, 380), (1, 260), (1, 140)], dtype="bfloat16"),
]


def _median_time(fn, repeat: int) -> float:
    return statistics.median(run_all.timings(fn, repeat))


def run(repeat: int) -> list[dict[str, str]]:
    import jax
    import numpy as np

    from helpers.reference_attention import make_ragged_step
    from helpers.reference_attention import reference_ragged_attention as reference
    from maxtext_compat import paged
    from maxtext_compat.kernel import rpa

    mesh = paged.make_mesh(1)
    rows = []
    for shape in SHAPES:
        total_pages = sum(paged.layout.cdiv(kv, PAGE_SIZE) for _, kv in shape.lens)
        layout = paged.KVCacheLayout(total_pages + 4, PAGE_SIZE, shape.num_kv_heads, shape.head_dim, shape.dtype)
        step = make_ragged_step(
            layout,
            shape.lens,
            num_q_heads=shape.num_q_heads,
            pages_per_seq=MAX_LEN // PAGE_SIZE,
            seed=1,
            poison=False,
        )
        scale = shape.head_dim**-0.5

        def kernel(step=step, scale=scale):
            out, cache = rpa.ragged_paged_attention(step.q, step.k, step.v, step.kv_cache, step.metadata, mesh=mesh,
                                                    sm_scale=scale)  # fmt: skip
            jax.block_until_ready((out, cache))
            return out

        t = time.perf_counter()
        out = kernel()
        first = time.perf_counter() - t
        per_call = _median_time(kernel, repeat)
        ref_time = _median_time(
            lambda step=step, scale=scale: reference(
                step.q, step.k, step.v, step.kv_cache, step.metadata, step.layout, sm_scale=scale
            ),
            repeat,
        )
        ref = reference(step.q, step.k, step.v, step.kv_cache, step.metadata, step.layout, sm_scale=scale)
        n = step.metadata.num_tokens
        err = float(np.abs(np.asarray(out[:n]).astype(np.float64) - ref.out).max())
        used_pages = sum(len(step.metadata.pages_of(i)) for i in range(step.metadata.num_seqs))
        paged_bytes = used_pages * layout.bytes_per_page
        contiguous = len(shape.lens) * MAX_LEN * layout.bytes_per_token
        rows.append(
            {
                "batch": shape.name,
                "tokens / seqs": f"{n} / {len(shape.lens)}",
                "heads q/kv x dim": f"{shape.num_q_heads}/{shape.num_kv_heads} x {shape.head_dim}",
                "dtype": shape.dtype,
                "first call (compile) s": f"{first:.2f}",
                "kernel ms/call (interpret)": f"{per_call * 1e3:.1f}",
                "dense f64 reference ms": f"{ref_time * 1e3:.1f}",
                "max abs err": f"{err:.1e}",
                "paged KV bytes (pages used)": f"{paged_bytes:,} ({used_pages})",
                f"contiguous KV bytes (max_len {MAX_LEN})": f"{contiguous:,}",
                "paged / contiguous": f"{paged_bytes / contiguous:.0%}",
            }
        )
        print(f"  {shape.name}: {rows[-1]['kernel ms/call (interpret)']} ms/call", file=sys.stderr, flush=True)
    return rows


def markdown(rows: list[dict[str, str]], header: str) -> str:
    cols = list(rows[0])
    lines = [header, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(r[c] for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    parser.add_argument("--repeat", type=int, default=3, help="timed calls per shape (median)")
    args = parser.parse_args(argv)

    import jax

    from maxtext_compat.cpu import rpa as cpu_rpa
    from maxtext_compat.resolution.installed_kernel import installed_rpa

    status = cpu_rpa.install()
    found = installed_rpa()
    header = (
        f"# Paged RPA benchmark\n\njax {jax.__version__}, {found.label}, backend {jax.default_backend()}"
        f" ({'CPU shim, Pallas TPU interpret mode' if status.active else 'native'}); page_size {PAGE_SIZE}; "
        f"median of {args.repeat} calls after one warm-up call."
    )
    text = markdown(run(args.repeat), header)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
