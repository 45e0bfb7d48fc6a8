"""The issue's load run in `make test-extended`: 32 concurrent `openai` clients for 60 s against a served SmolLM2.

The server is the user's command (`maxtext-compat serve` of the converted model, --max-num-seqs 8, as
benchmarks/bench_serving.py serves it: the clients beyond 8 queue, as on any vLLM server); the clients send the
four PROMPTS round robin, 16 greedy tokens each (tests/helpers/load_run.py, the same run the bench times). Every
answer must equal transformers' greedy tokens of the same GGUF file, and none may be lost. Its throughput and
latency percentiles are printed here and recorded by `make bench` (build/bench.md, beside the peer's).
"""

from __future__ import annotations

import sys

import pytest

from helpers.load_run import load_run
from helpers.smollm2_server import serve

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.slow, pytest.mark.extended,
              pytest.mark.envs("maxtext-0.2.5", "maxtext-0.1.0-jax011")]  # fmt: skip

CLIENTS, SECONDS, TOKENS, SEQS, MAX_LEN = 32, 60.0, 16, 8, 64


def test_32_clients_for_60_s_every_answer_right_none_lost(smollm2_dir, reference, tmp_path):
    from openai import OpenAI

    from maxtext_compat.testing import real_model as rm

    prompts = list(rm.PROMPTS)
    with serve(smollm2_dir, tmp_path, seqs=SEQS, max_len=MAX_LEN) as srv:
        client = OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=600)
        for p in prompts:  # every prompt length compiled before the clock starts
            client.completions.create(model=srv.model, prompt=p, max_tokens=TOKENS, temperature=0)
        got = load_run(srv.url, srv.model, prompts, reference.greedy, clients=CLIENTS, seconds=SECONDS, tokens=TOKENS)
        alive = srv.alive()
    print(f"\n[load run] {got.summary()}", file=sys.stderr)
    assert got.latencies and not got.errors and not got.wrong, (got.summary(), got.wrong[:2], got.errors[:2])
    assert len(got.latencies) >= CLIENTS and alive  # a full round at least, and the server lives
