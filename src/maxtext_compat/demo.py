"""`maxtext-compat demo`: what the library does, in one screen, on the installed MaxText.

1. doctor summary: installed releases, resolved matrix row, convention;
2. a tiny random-weight model called the old way and the new way through the adapters;
3. vLLM-style serving in-process: three prompts of different lengths prefilled together through
   the paged KV cache and the real RPA kernel, then greedy decode steps as a ragged batch, next
   to a dense decode of the same model (tokens, max |Δ logits|, ms per step).
Nothing is downloaded: the model is built in the process with random weights.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any, TextIO

from maxtext_compat.errors import CompatError
from maxtext_compat.progress import Progress

PROMPT_LENGTHS = (5, 9, 13)
TOKENS, PAGE, PAGES = 48, 16, 32


def _setup_env() -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    for key, value in (("TPU_NAME", "cpu-test"), ("TPU_WORKER_ID", "0"), ("TPU_ACCELERATOR_TYPE", "cpu")):
        os.environ.setdefault(key, value)  # tpu-inference polls GCE metadata otherwise
    if not os.environ.get("XLA_FLAGS"):
        # Non-empty XLA_FLAGS also keeps MaxText 0.2.5's pyconfig from setting an HLO dump.
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"


def summary() -> dict[str, Any]:
    from maxtext_compat import doctor

    report = doctor.collect()
    res = report.get("resolution") or {}
    return {
        "environment": os.environ.get("MAXTEXT_COMPAT_ENV") or os.path.basename(sys.prefix),
        "versions": res.get("versions", {}),
        "maxtext_row": res.get("maxtext"),
        "match": res.get("maxtext_match"),
        "convention": res.get("convention"),
        "path": "native vLLM path" if res.get("convention") not in (None, "legacy") else "backport",
        "rpa": (res.get("rpa_call_form") or {}).get("form"),
        "error": report.get("error"),
    }


def _shapes(x: Any) -> Any:
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        return [_shapes(v) for v in x]
    return list(getattr(x, "shape", ()))


def calls(progress: Progress) -> dict[str, Any]:
    """The tiny model called both ways through `wrap()`; on 0.1.0 the new call is the backport."""
    from flax import nnx

    from maxtext_compat import paged
    from maxtext_compat.adapters import wrap
    from maxtext_compat.testing import tiny

    row = tiny.installed_row()
    # MaxText 0.2.x builds a vllm_rpa model only with tpu-inference importable; without it the
    # old call still runs on a plain model and the new call reports what to install.
    vllm = row.has_kv_params and _has_kernel()
    with progress.stage("building a tiny random-weight model"):
        cfg = tiny.tiny_config("default", vllm=vllm)
        mesh = _mesh(cfg, vllm)
        model = wrap(tiny.tiny_transformer(cfg, mesh, model_mode="autoregressive" if vllm else None))
    out: dict[str, Any] = {"model": f"{type(model).__mro__[1].__module__}.{type(model).__mro__[1].__qualname__}"}
    inp = tiny.tiny_inputs(cfg, batch=1, seq=8)
    with progress.stage("old call: model(tokens, positions)"), tiny.mesh_context(cfg, mesh):
        logits = nnx.jit(lambda m, t, p: m(t, p, enable_dropout=False, model_mode="train"))(
            model, inp["tokens"], inp["positions"]
        )
    out["old_call"] = {"returns": "logits", "shape": _shapes(logits)}
    try:
        import jax.numpy as jnp

        layout = paged.KVCacheLayout(8, PAGE, cfg.num_kv_heads, cfg.head_dim, "float32")
        seq = paged.SequenceSlice(8, 8, (0,), "r")
        md = paged.build_metadata([seq], layout, max_num_tokens=8, max_num_seqs=1, pages_per_seq=1)
        tokens = jnp.asarray(inp["tokens"]).reshape(8, 1)
        positions = jnp.asarray(inp["positions"]).reshape(8, 1)
        with progress.stage("new call: model(..., kv_caches=, attention_metadata=)"), tiny.mesh_context(cfg, mesh):
            _ensure_kernel()
            hidden, caches = nnx.jit(
                lambda m, t, p, kv, md: m(t, p, kv_caches=kv, attention_metadata=md, model_mode="autoregressive")
            )(model, tokens, positions, layout.allocate(cfg.num_decoder_layers), md.to_attention_metadata())
        out["new_call"] = {"returns": "(hidden, kv_caches)", "hidden": _shapes(hidden), "kv_caches": _shapes(caches)}
    except CompatError as exc:
        out["new_call"] = {"unavailable": f"{type(exc).__name__}: {exc}"}
    return out


def _mesh(cfg: Any, vllm: bool) -> Any:
    from maxtext_compat.testing import tiny

    if vllm:  # vllm.yml meshes: one device, every axis 1
        import jax
        import numpy as np
        from jax.sharding import Mesh

        return Mesh(np.array(jax.devices()[:1]).reshape([1] * len(cfg.mesh_axes)), cfg.mesh_axes)
    return tiny.tiny_mesh(cfg)


def _ensure_kernel() -> None:
    from maxtext_compat.rpa import installed_rpa
    from maxtext_compat.shims import cpu_rpa

    installed_rpa()  # typed error when tpu-inference is missing
    cpu_rpa.install()


def serving(progress: Progress, steps: int) -> dict[str, Any]:
    """Ragged prefill + `steps` greedy decode steps through the paged cache vs a dense decode."""
    import numpy as np

    from maxtext_compat.engine import PagedEngine, compare, dense_greedy, dense_twin, format_table
    from maxtext_compat.testing import tiny

    _ensure_kernel()
    row = tiny.installed_row()
    cfg = tiny.tiny_config("default", vllm=row.has_kv_params)
    mesh = _mesh(cfg, row.has_kv_params)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, cfg.vocab_size, n).tolist() for n in PROMPT_LENGTHS]
    model = tiny.tiny_transformer(cfg, mesh, model_mode="autoregressive" if row.has_kv_params else None)
    dense_model = dense_twin(model, tiny.tiny_config("default")) if row.has_kv_params else model
    with progress.stage(f"paged path: compile + ragged prefill + {steps} decode steps (RPA kernel)"):
        paged_run = PagedEngine(model, num_pages=PAGES, page_size=PAGE).generate(prompts, steps)
    with progress.stage(f"dense path: {steps + 1} full recomputes"):
        dense_run = dense_greedy(dense_model, prompts, steps)
    rows = compare(paged_run, dense_run)
    return {
        "prompts": prompts,
        "rows": [
            {
                "prompt_len": len(r.prompt),
                "paged_tokens": list(r.paged_tokens),
                "dense_tokens": list(r.dense_tokens),
                "tokens_match": r.tokens_match,
                "max_abs_logits_diff": r.max_abs_logits_diff,
                "paged_ms_per_step": r.paged_ms_per_step,
                "dense_ms_per_step": r.dense_ms_per_step,
            }
            for r in rows
        ],
        "table": format_table(rows),
        "all_tokens_match": all(r.tokens_match for r in rows),
    }


def run(*, as_json: bool = False, steps: int = 16, out: TextIO | None = None) -> int:
    """The demo; returns the exit code (0: both paths agree; 1: they differ; 2: cannot run here)."""
    stream = out if out is not None else sys.stdout
    _setup_env()
    warnings.simplefilter("ignore", DeprecationWarning)
    head = summary()
    data: dict[str, Any] = {"summary": head}
    if head["maxtext_row"] is None:
        message = (
            "MaxText is not installed in this interpreter. Run `make demo` (it builds the environments from "
            "compat_matrix.yaml and runs the demo in each), or `.envs/maxtext-0.2.5/bin/maxtext-compat demo`."
        )
        data["error"] = message
        stream.write(json.dumps(data, indent=2) + "\n" if as_json else f"demo: {message}\n")
        return 2
    progress = Progress(5 if _has_kernel() else 3)
    data["calls"] = calls(progress)
    if _has_kernel():
        data["serving"] = serving(progress, steps)
    else:
        data["serving"] = {"unavailable": "tpu-inference is not installed here (no RPA kernel); see maxtext-0.2.5 or "
                           "maxtext-0.1.0-jax011"}  # fmt: skip
    stream.write(json.dumps(data, indent=2, default=str) + "\n" if as_json else render(data) + "\n")
    serving_data = data["serving"]
    return 0 if serving_data.get("all_tokens_match", True) else 1


def _has_kernel() -> bool:
    import importlib.util

    return importlib.util.find_spec("tpu_inference") is not None


def render(data: dict[str, Any]) -> str:
    s = data["summary"]
    versions = ", ".join(f"{k} {v}" for k, v in s["versions"].items())
    lines = [
        f"== maxtext-compat demo in {s['environment']}: MaxText {s['maxtext_row']} ({s['path']})",
        f"1. installed: {versions}",
        f"   matrix row {s['maxtext_row']} ({s['match']}), convention {s['convention']}"
        + (f", RPA call form {s['rpa']}" if s["rpa"] else ""),
    ]
    c = data["calls"]
    lines.append(f"2. {c['model']} through maxtext_compat.adapters.wrap:")
    lines.append(f"   old call  -> logits {c['old_call']['shape']}")
    new = c["new_call"]
    if "unavailable" in new:
        lines.append(f"   new call  -> not available here: {new['unavailable']}")
    else:
        lines.append(
            f"   new call  -> (hidden {new['hidden']}, kv_caches {len(new['kv_caches'])} x {new['kv_caches'][0]})"
        )
    srv = data["serving"]
    if "unavailable" in srv:
        lines.append(f"3. serving: {srv['unavailable']}")
    else:
        verdict = "identical" if srv["all_tokens_match"] else "DIFFERENT"
        lines.append(f"3. vLLM-style serving in-process (paged KV cache + RPA kernel vs dense): tokens {verdict}")
        lines.append(srv["table"])
    return "\n".join(lines)
