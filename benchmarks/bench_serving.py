"""Served SmolLM2 and Gemma 3 over HTTP: a warm 16-token request, and a load run beside the peer a user would pick.

    MAXTEXT_COMPAT_ENV=maxtext-0.2.5 PYTHONPATH=tests .envs/maxtext-0.2.5/bin/python benchmarks/bench_serving.py

Why: in-process SmolLM2 decodes 16 tokens in about a second; a served request pays the API server, the
scheduler, the runner's host work and the sampler on top. Two servers, one after the other (one `vllm serve` at
a time on this machine): ours (`maxtext-compat serve` of the converted model: MaxText's own model) and the peer
(plain `vllm serve` of the Hugging Face form of the same weights: tpu-inference's own Llama), same flags, same CPU
shim. For each: the median of warm 16-token greedy requests, then CLIENTS concurrent clients (the `openai`
AsyncOpenAI client) sending the PROMPTS round robin for LOAD_SECONDS; every answer must equal transformers'
greedy tokens (else the figure is not written), none may be lost; throughput and latency percentiles recorded.
The issue's goals: a warm 16-token request <= 3 s, our throughput >= 0.9 of the peer's. Then ours again with
`--data-parallel-size 2` (two engine cores, two API servers: issue 40), DP_CLIENTS clients, the load run
tests/compat/test_serving_data_parallel.py checks in `make test-extended`; its ratio is to ours on one engine.

Gemma 3 270M (issue 43), the same two measurements: ours on the conversion of its GGUF file, the peer `vllm serve` of
transformers' Hugging Face form of the same file. tpu-inference has no Gemma 3 of its own, so it serves it on its vLLM
model path (vLLM's PyTorch Gemma3ForCausalLM through torchax), which as released refuses float32 weights
(`RuntimeError: Trying to resize storage that is not resizable`, on a TPU as here); the peer's processes load
benchmarks/peer_fixes/sitecustomize.py, tpu-inference's open PR #3595 and nothing else, so both serve float32 and
both answers are held to transformers'. BENCH_SERVING_MODELS picks the models (default: smollm2,gemma3).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import run_all

CLIENTS = int(os.environ.get("BENCH_SERVING_CLIENTS", "32"))
LOAD_SECONDS = float(os.environ.get("BENCH_SERVING_SECONDS", "60"))
WARM_ROUNDS = 5
TOKENS = 16
SEQS = 8  # --max-num-seqs: the clients beyond it queue, as on any vLLM server
MAX_LEN = 64
DP_CLIENTS = int(os.environ.get("BENCH_SERVING_DP_CLIENTS", "16"))
MODELS = tuple(os.environ.get("BENCH_SERVING_MODELS", "smollm2,gemma3").split(","))
PEER_FIXES = Path(__file__).resolve().parent / "peer_fixes"
GEMMA3_HBM_GB = {"ours": "4", "peer": "5"}  # the CPU shim's per-device HBM: float32 weights, 262k vocabulary


def _measure(srv: Any, prompts: list[str], want: list[list[int]], clients: int = CLIENTS) -> dict[str, Any]:
    from openai import OpenAI

    from helpers.load_run import load_run

    client = OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=600)

    def one() -> list[int]:
        got = client.completions.create(model=srv.model, prompt=prompts[0], max_tokens=TOKENS, temperature=0,
                                        extra_body={"return_token_ids": True})  # fmt: skip
        return list(got.choices[0].token_ids)

    for p in prompts:  # warm: every prompt length compiled once
        client.completions.create(model=srv.model, prompt=p, max_tokens=TOKENS, temperature=0)
    times = []
    for _ in range(WARM_ROUNDS):
        t0 = time.monotonic()
        ids = one()
        times.append(time.monotonic() - t0)
        if ids != want[0]:
            raise AssertionError(f"served {ids} != reference {want[0]}: no figure written")
    load = load_run(srv.url, srv.model, prompts, want, clients=clients, seconds=LOAD_SECONDS, tokens=TOKENS)
    if load.wrong or load.errors:
        raise AssertionError(f"load run: {load.summary()}: {load.wrong[:2]} {load.errors[:2]}")
    return {"warm": times, "load": load, "clients": clients}


def _rows(
    label: str, m: dict[str, Any], peer: dict[str, Any] | None, model: str = "SmolLM2-135M"
) -> list[dict[str, Any]]:
    load = m["load"]
    rps, tps = load.requests_per_s, load.tokens_per_s
    warm = statistics.median(m["warm"])
    how = (f"{model} float32, {TOKENS} greedy tokens, answers equal to transformers'; "
           f"--max-num-seqs {SEQS}, --max-model-len {MAX_LEN}")  # fmt: skip
    load_how = (f"{m['clients']} concurrent openai clients for {LOAD_SECONDS:g} s, 4 prompts round robin, "
                f"{len(load.latencies)} answers, 0 lost")  # fmt: skip
    pct = f"p50 {load.percentile(0.5):.2f} s, p90 {load.percentile(0.9):.2f} s, p99 {load.percentile(0.99):.2f} s"
    ratio = None if peer is None else tps / peer["load"].tokens_per_s
    return [
        run_all.row(f"served · warm {TOKENS}-token request, {label}", warm, "s", how,
                    spread=f"min {min(m['warm']):.2f} s, max {max(m['warm']):.2f} s over {WARM_ROUNDS}"),
        run_all.row(f"served · load throughput, {label}", tps, "tokens/s", f"{load_how}; {rps:.2f} requests/s",
                    ratio=ratio, spread=pct),
    ]  # fmt: skip


def run() -> list[dict[str, Any]]:
    run_all.cpu_env()
    unknown = sorted(set(MODELS) - {"smollm2", "gemma3"})
    if unknown:
        raise ValueError(f"BENCH_SERVING_MODELS: {unknown} unknown; expected a comma-separated subset of "
                         "smollm2,gemma3")  # fmt: skip
    work = Path(os.environ.get("BENCH_WORK", "build/bench-work")).resolve() / "serving"
    work.mkdir(parents=True, exist_ok=True)
    return [*(_smollm2(work) if "smollm2" in MODELS else []), *(_gemma3(work) if "gemma3" in MODELS else [])]


def _smollm2(work: Path) -> list[dict[str, Any]]:
    from helpers.smollm2_server import serve, serve_hf
    from maxtext_compat import convert
    from maxtext_compat.runner.caches import hf_reference_dir
    from maxtext_compat.testing import real_model as rm

    reference = rm.hf_reference(rm.smollm2_gguf(), hf_reference_dir())
    prompts, want = list(rm.PROMPTS), reference.greedy
    ours_dir = convert.convert(rm.smollm2_gguf(), work / "maxtext", force=True)
    hf_dir = rm.save_hf_dir(work / "hf", hf_reference_dir())
    with serve(ours_dir, work, seqs=SEQS, max_len=MAX_LEN) as srv:
        ours = _measure(srv, prompts, want)
    with serve_hf(hf_dir, work, seqs=SEQS, max_len=MAX_LEN) as srv:
        peer = _measure(srv, prompts, want)
    with serve(ours_dir, work, seqs=SEQS, max_len=MAX_LEN, flags=("--data-parallel-size", "2")) as srv:
        dp2 = _measure(srv, prompts, want, clients=DP_CLIENTS)
    print(f"[bench] served: ours {ours['warm']}, peer {peer['warm']}, dp2 {dp2['warm']}", file=sys.stderr)
    return [*_rows("maxtext-compat serve (MaxText's model)", ours, peer),
            *_rows("peer: vllm serve of the HF form (tpu-inference's Llama)", peer, None),
            *_rows("maxtext-compat serve --data-parallel-size 2 (ratio: to one engine)", dp2, ours)]  # fmt: skip


def _gemma3(work: Path) -> list[dict[str, Any]]:
    from helpers.smollm2_server import serve, serve_hf
    from maxtext_compat import convert
    from maxtext_compat.runner.caches import hf_reference_dir
    from maxtext_compat.testing import real_gemma3 as g3

    path = g3.gemma3_gguf()
    reference = g3.reference(path, hf_reference_dir())
    prompts, want = list(g3.PROMPTS), reference.greedy[: len(g3.PROMPTS)]
    ours_dir = convert.convert(path, work / "gemma3-maxtext", force=True)
    hf_dir = g3.save_hf_dir(work / "gemma3-hf", hf_reference_dir())
    ours_env = {"MAXTEXT_COMPAT_CPU_HBM_GB": GEMMA3_HBM_GB["ours"]}
    with serve(ours_dir, work, seqs=SEQS, max_len=MAX_LEN, env=ours_env, label="gemma3") as srv:
        ours = _measure(srv, prompts, want)
    python_path = os.pathsep.join(filter(None, [str(PEER_FIXES), os.environ.get("PYTHONPATH")]))
    peer_env = {"PYTHONPATH": python_path, "MAXTEXT_COMPAT_CPU_HBM_GB": GEMMA3_HBM_GB["peer"]}
    with serve_hf(hf_dir, work, seqs=SEQS, max_len=MAX_LEN, env=peer_env, label="hf_gemma3") as srv:
        peer = _measure(srv, prompts, want)
    print(f"[bench] served Gemma 3: ours {ours['warm']}, peer {peer['warm']}", file=sys.stderr)
    model = "Gemma 3 270M (Q4_K_M dequantized)"
    return [*_rows("Gemma 3 270M, maxtext-compat serve (MaxText's model)", ours, peer, model),
            *_rows("Gemma 3 270M, peer: vllm serve of the HF form (tpu-inference's vLLM model path, PR #3595)", peer,
                   None, model)]  # fmt: skip


if __name__ == "__main__":
    run_all.emit(run())
