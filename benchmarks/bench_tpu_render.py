"""Render bench_tpu.py's JSON into docs/tpu.md's measured section (between the bench-tpu markers).

Why separate: the figures are measured on the TPU machine, whose working tree is a copy, and come back as JSON
files; this renders them there (make bench-tpu) or here from the files brought back, with the same text. A CPU dry
run's figures are labelled as such in the heading and every table, the chip's bandwidth fraction is left out, and
dry and TPU runs are never mixed in one section. Standard library only (unit-tested in the unit environment).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

BEGIN = "<!-- bench-tpu:begin (make bench-tpu writes this section: benchmarks/bench_tpu_render.py) -->"
END = "<!-- bench-tpu:end -->"
DRY_LABEL = "CPU dry run (MAXTEXT_COMPAT_TPU=dry): not TPU figures"


def _num(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    return f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:,.0f}"


def _run_line(run: dict[str, Any]) -> str:
    v = run["versions"]
    versions = ", ".join(f"{k} {v[k]}" for k in ("jax", "libtpu", "maxtext", "tpu-inference", "vllm-tpu") if v.get(k))
    return (f"{run['date']} · {run['device']} × {run['devices']} · Python {run['python']} · {versions} · "
            f"{run['seconds']} s")  # fmt: skip


def _first(r: dict[str, Any], key: str = "first_call_s") -> str:
    """A first call's seconds, or what they were when the program came from the compilation cache (no compile)."""
    return f"{_num(r[key])} (cached)" if r.get("cached") else _num(r[key])


def _kernel(k: dict[str, Any], dry: bool) -> list[str]:
    peak = k.get("peak_gbs")
    lines = [
        f"### RPA kernel: our dispatcher and `rpa_xla` vs the raw kernel{' (' + DRY_LABEL + ')' if dry else ''}",
        "",
        f"Median time per call ({k['rounds']}, one process); KV GB/s = the context's K and V bytes per call / time"
        + ("" if dry or not peak else f"; of peak = / {peak:g} GB/s") + ".",
        "",
        "| shape | call | µs/call | vs raw kernel | KV GB/s | " + ("" if dry else "of peak | ")
        + "first call s (compile) | max \\|Δ\\| vs raw | caches equal |",
        "|---|---|---|---|---|" + ("" if dry else "---|") + "---|---|---|",
    ]  # fmt: skip
    for s in k["shapes"]:
        if "error" in s:
            lines.append(f"| {s['shape']} | failed: {s['error']} |" + " |" * (6 if dry else 7))
            continue
        for r in s["rows"]:
            frac = "" if dry else f" {_num(r['kv_gbs'] / peak * 100, 2)} % |" if peak else " n/a |"
            lines.append(
                f"| {s['shape']} | {r['call']} | {_num(r['us'])} | {r['ratio']:.3f} | {_num(r['kv_gbs'])} |{frac} "
                f"{_first(r)} | {r['max_abs_diff']:.2g} | {'yes' if r['caches_equal'] else 'NO'} |"
            )
    hbm = [s["hbm_gib"]["peak_bytes_in_use"] for s in k["shapes"] if s.get("hbm_gib")]
    lines += ["", f"HBM peak: {max(hbm):.3g} GiB." if hbm else "HBM: not reported by this backend."]
    return lines


def _model(m: dict[str, Any], dry: bool) -> list[str]:
    n, t = len(m["prompts"]), m["new_tokens"]
    lines = [
        f"### SmolLM2-135M: {n} prompts × {t} greedy tokens{' (' + DRY_LABEL + ')' if dry else ''}",
        "",
        f"float32 weights, MaxText's matmul_precision 'highest' (the tests' config, testing.tiny), jax's default "
        f"elsewhere; medians of {m['runs']} generations in one process. TTFT: the "
        "prefill step; decode tokens/s: the batch over one decode step; end to end: every token over the whole "
        "generation (host work included); compile: the first generation's compile time ((cached): its programs "
        "came from JAX's compilation cache, compiled before by an identical program).",
        "",
        "| path | TTFT ms | decode step ms | decode tokens/s | end-to-end tokens/s | compile s |",
        "|---|---|---|---|---|---|",
    ]
    names = {
        "native": "MaxText native: paged KV + kernel, the engine loop on the unwrapped model",
        "layer": "through our layer: `PagedEngine` (the model through `wrap()`)",
        "dense": "MaxText's own dense decode (no KV cache)",
    }
    for key, name in names.items():
        r = m[key]
        lines.append(
            f"| {name} | {_num(r['ttft_ms'])} | {_num(r['decode_step_ms'])} | {_num(r['decode_tokens_per_s'])} | "
            f"{_num(r['end_to_end_tokens_per_s'])} | {_first(r, 'compile_s')} |"
        )
    ratio = m["layer_over_native_tokens_per_s"]
    hbm = [h["peak_bytes_in_use"] for h in (m.get("paged_hbm_gib"), m.get("dense_hbm_gib")) if h]
    lines += [
        "",
        f"Layer / native decode tokens/s: **{ratio:.3f}** (goal ≥ 0.98); the two paths' tokens are equal (else no "
        f"figure is written); paged tokens equal to the dense decode's: {'yes' if m['paged_equals_dense'] else 'no'}."
        + (f" HBM peak: {max(hbm):.3g} GiB." if hbm else ""),
    ]
    return lines


def render(runs: Sequence[dict[str, Any]]) -> str:
    """The section's Markdown for bench_tpu.py results (a kernel run, a model run, or one run of both)."""
    if not runs:
        raise ValueError("no bench_tpu.py results to render")
    modes = {r["run"]["mode"] for r in runs}
    if len(modes) > 1:
        raise ValueError(f"dry and TPU results in one section ({sorted(modes)}): render them apart")
    dry = modes == {"dry"}
    lines = [
        f"## {DRY_LABEL}" if dry else "## Measured on the TPU",
        "",
        *(f"- {_run_line(r['run'])}" for r in runs),
        "",
    ]
    for r in runs:
        if "kernel" in r:
            lines += [*_kernel(r["kernel"], dry), ""]
        if "model" in r:
            lines += [*_model(r["model"], dry), ""]
    return "\n".join(lines).rstrip() + "\n"


def render_into(doc: Path, runs: Sequence[dict[str, Any]]) -> str:
    """Replace the section between the markers of `doc` with `render(runs)`; returns the path written."""
    text = doc.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise ValueError(f"{doc} has no bench-tpu section: add the lines\n{BEGIN}\n{END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{BEGIN}\n{render(runs)}{END}{tail}", encoding="utf-8")
    return str(doc)
