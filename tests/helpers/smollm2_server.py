"""The converted SmolLM2 served by the user's command (`maxtext-compat serve`), or by tpu-inference's own Llama.

Why one place: the real-model serving tests, the conformance suite and the serving benchmark start the same
server with different sizes; its command and CPU environment must not drift between them.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from helpers import vllm_server
from helpers.vllm_server import Server

READY_TIMEOUT = 600.0
# 1 GiB per CPU device for weights + KV cache (the default 2 GiB let two TP=3 engine cores, ~10 GiB each, exhaust
# the machine's 24 GiB when two environments ran at once).
CPU_ENV = {"JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MAXTEXT_COMPAT_CPU_HBM_GB": "1"}


@contextlib.contextmanager
def serve(
    model_dir: object,
    log_dir: Path,
    *,
    tp: int = 1,
    seqs: int = 1,
    max_len: int = 32,
    env: Mapping[str, str] | None = None,
    flags: tuple[str, ...] = (),
    settings: Mapping[str, object] | None = None,
    label: str = "smollm2",
    python: str = sys.executable,
) -> Iterator[Server]:
    """`maxtext-compat serve MODEL_DIR --max-model-len ...` of a `convert` result (its .out, .checkpoint); `settings`
    go in `--additional-config` beside maxtext_config, as `{"maxtext_compat": settings}`; `python`: the interpreter
    of the environment that serves (another matrix environment's for a partner)."""
    out, checkpoint = str(model_dir.out), str(model_dir.checkpoint)  # type: ignore[attr-defined]
    port = vllm_server.free_port()
    maxtext_config = {"max_prefill_predict_length": max_len - 4, "max_target_length": max_len,
                      "ici_tensor_parallelism": tp, "load_parameters_path": checkpoint}  # fmt: skip
    additional = {"maxtext_config": maxtext_config, **({"maxtext_compat": dict(settings)} if settings else {})}
    argv = [python, "-m", "maxtext_compat.cli", "serve", out, f"--max-num-batched-tokens={max_len}",
            f"--max-model-len={max_len}", f"--max-num-seqs={seqs}", f"--tensor-parallel-size={tp}", "--port",
            str(port), f"--additional-config={json.dumps(additional)}", *flags]  # fmt: skip
    with _started(argv, port, out, log_dir / f"{label}_tp{tp}_seqs{seqs}_len{max_len}.log", env) as srv:
        yield srv


@contextlib.contextmanager
def serve_hf(hf_dir: Path, log_dir: Path, *, seqs: int = 1, max_len: int = 32,
             env: Mapping[str, str] | None = None, label: str = "hf_llama") -> Iterator[Server]:  # fmt: skip
    """Plain `vllm serve HF_DIR` on the Hugging Face form of the weights: tpu-inference's own Llama (flax_nnx), or
    for an architecture it has no model of (Gemma 3), its vLLM model path (vLLM's PyTorch model through torchax)."""
    port = vllm_server.free_port()
    vllm = str(Path(sys.executable).with_name("vllm"))
    argv = [vllm, "serve", str(hf_dir), "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            f"--max-num-batched-tokens={max_len}", f"--max-model-len={max_len}", f"--max-num-seqs={seqs}"]  # fmt: skip
    cpu = {"TPU_NAME": "cpu-test", "TPU_WORKER_ID": "0", "TPU_ACCELERATOR_TYPE": "cpu", "SKIP_JAX_PRECOMPILE": "1"}
    log = log_dir / f"{label}_seqs{seqs}_len{max_len}.log"
    with _started(argv, port, str(hf_dir), log, {**cpu, **(env or {})}) as srv:
        yield srv


@contextlib.contextmanager
def _started(argv: list[str], port: int, model: str, log: Path, env: Mapping[str, str] | None) -> Iterator[Server]:
    srv = vllm_server.start(argv, port=port, model=model, log_path=log, env={**os.environ, **CPU_ENV, **(env or {})})
    try:
        seconds = srv.wait_ready(READY_TIMEOUT)
        print(f"\n[real model] {Path(argv[0]).name} ... ready after {seconds:.0f} s ({log})", file=sys.stderr)
        yield srv
    finally:
        srv.stop()
