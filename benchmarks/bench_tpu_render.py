"""Render bench_tpu.py's JSON into docs/accelerators.md's measured section (between the bench-tpu markers).

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
DRY_LABEL = "CPU dry run (MAXTEXT_COMPAT_ACCEL=dry): not accelerator figures"


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
    if "skipped" in k:
        return ["### RPA kernel", "", f"Not measured here: {k['skipped']}."]
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


def _step(s: dict[str, Any], dry: bool, kernel: dict[str, Any] | None) -> list[str]:
    """The decoder-layer step per shape (bench_accel_step.py) and the copy ceiling, rpa_xla's bandwidth beside it."""
    layer, copy = s["layer"], s["copy"]
    lines = [
        f"### A MaxText decoder layer's decode step: through the layer, rpa_xla and the dense decode vs native"
        f"{' (' + DRY_LABEL + ')' if dry else ''}",
        "",
        f"MaxText's llama2 decoder layer, {layer['base_emb_dim']} wide, {layer['base_num_query_heads']} query / "
        f"{layer['base_num_kv_heads']} KV heads of {layer['head_dim']}, {layer['dtype']}, {layer['page']}-token pages; "
        f"each sequence decodes one token over its context; jitted with the cache (or the layer's state) donated and "
        f"fed back; {s['rounds']}, one process. The ratio is to the native new call on the installed kernel.",
        "",
        "| batch × context | route | µs/step | / native | first call s (compile) | max \\|Δ\\| vs native "
        "| caches equal |",
        "|---|---|---|---|---|---|---|",
    ]
    for sh in s["shapes"]:
        label = f"{sh['batch']} × {sh['context']:,}"
        if "error" in sh:
            lines.append(f"| {label} | failed: {sh['error']} | | | | | |")
            continue
        for r in sh["rows"]:
            same = r.get("caches_equal")
            lines.append(
                f"| {label} | {r['route']} | {_num(r['us'])} | {r['ratio_to_native']:.3f} | {_first(r)} | "
                + (f"{r['max_abs_diff']:.2g} | {'yes' if same else 'NO'} |" if same is not None else "— | — |")
            )
    done = [sh for sh in s["shapes"] if "error" not in sh]
    if done:
        wrap = [sh["wrap_over_native"] for sh in done]
        lines += ["", f"Through the layer / native (KV-write check on): {min(wrap):.3f}–{max(wrap):.3f} over "
                  f"{len(done)} shapes (goal 1.00 within noise); check off: "
                  + ", ".join(f"{sh['wrap_check_off_over_native']:.3f}" for sh in done)
                  + ". Paged step on rpa_xla / MaxText's dense decode step: "
                  + ", ".join(f"{sh['batch']}×{sh['context']} {sh['rpa_xla_over_dense']:.2f}" for sh in done)
                  + "; on the installed kernel / dense: "
                  + ", ".join(f"{sh['kernel_over_dense']:.2f}" for sh in done) + "."]  # fmt: skip
    lines += ["", f"Copy ceiling in the same process ({copy['bytes'] / (1 << 30):.3g} GiB, bfloat16): x + 1 "
              f"{_num(copy['copy_gbs'])} GB/s (read + write), a sum {_num(copy['read_gbs'])} GB/s (read)."]  # fmt: skip
    if kernel:
        for shape in kernel["shapes"]:
            rows = {r["call"]: r for r in shape.get("rows", ())}
            if "32 x 2,000" in shape["shape"] and rows:
                xla, raw = rows.get("rpa_xla (XLA, no Pallas)"), rows.get("raw kernel")
                lines.append(
                    f"KV bandwidth at 32 × 2,000 (kernel section, same process): rpa_xla {_num(xla['kv_gbs'])} GB/s = "
                    f"**{xla['kv_gbs'] / copy['ceiling_gbs'] * 100:.0f} %** of the ceiling (goal ≥ 40 %), "
                    f"the Pallas kernel {_num(raw['kv_gbs'])} GB/s = {raw['kv_gbs'] / copy['ceiling_gbs'] * 100:.0f} %"
                    + (f"; of the chip's {kernel['peak_gbs']:g} GB/s: {xla['kv_gbs'] / kernel['peak_gbs'] * 100:.0f} % "
                       f"and {raw['kv_gbs'] / kernel['peak_gbs'] * 100:.0f} %" if kernel.get("peak_gbs") else "")
                    + "."
                )  # fmt: skip
    hbm = [sh["hbm_gib"]["peak_bytes_in_use"] for sh in done if sh.get("hbm_gib")]
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
    ttft = m["native"]["ttft_ms"] / m["layer"]["ttft_ms"]
    hbm = [h["peak_bytes_in_use"] for h in (m.get("paged_hbm_gib"), m.get("dense_hbm_gib")) if h]
    lines += [
        "",
        f"Layer / native decode tokens/s: **{ratio:.3f}**, native / layer TTFT: **{ttft:.3f}** (goal ≥ 0.98 each); "
        f"the two paths' tokens are equal (else no "
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
        raise ValueError(f"dry and accelerator results in one section ({sorted(modes)}): render them apart")
    dry = modes == {"dry"}
    lines = [
        f"## {DRY_LABEL}" if dry else f"## Measured on {runs[0]['run']['device']}",
        "",
        *(f"- {_run_line(r['run'])}" for r in runs),
        "",
    ]
    for r in runs:
        if "kernel" in r:
            lines += [*_kernel(r["kernel"], dry), ""]
        if "step" in r:
            lines += [*_step(r["step"], dry, r.get("kernel")), ""]
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
