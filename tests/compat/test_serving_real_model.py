"""SmolLM2 served for real: `maxtext-compat serve` on the converted model, the seed's request over HTTP.

The server is the user's command (`python -m maxtext_compat.cli serve MODEL_DIR --max-num-batched-tokens=32
--max-model-len=32 --max-num-seqs=N --tensor-parallel-size=N --additional-config='{"maxtext_config": {...}}'`) in
its own process group, started and stopped here; the request is the seed's JSON ("prompt": ["Seattle is a"],
"max_tokens": 16, "temperature": 0). The completion's token ids must equal transformers' greedy decode of the same
GGUF file, and its text the reference tokenizer's decoding of them. On CPU the RPA kernel is the XLA one (the
default; test_rpa_xla.py holds it to the real kernel); the log must say so.

In `make test`: TP=1 on MaxText 0.2.5 (native vLLM path) and 0.1.0 (backport). `make test-extended` adds 0.2.4,
TP=3 (9 query and 3 KV heads split three ways) and four concurrent requests of different lengths.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
from collections.abc import Iterator

import pytest

from helpers.vllm_server import Server

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.slow]
IN_MAKE_TEST = ("maxtext-0.2.5", "maxtext-0.1.0-jax011")
EXTENDED = ("maxtext-0.2.5", "maxtext-0.2.4", "maxtext-0.1.0-jax011")

READY_TIMEOUT = 600.0
REQUEST_TIMEOUT = 300.0
# 1 GiB per CPU device for weights + KV cache (the default 2 GiB let two TP=3 engine cores, ~10 GiB each, exhaust
# the machine's 24 GiB when two environments ran at once): 32-token sequences need a few pages.
CPU_ENV = {"JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MAXTEXT_COMPAT_CPU_HBM_GB": "1"}


def _serve(model_dir, tmp_path_factory, *, tp: int, seqs: int) -> Iterator[Server]:
    from helpers import vllm_server as server

    port = server.free_port()
    maxtext_config = {"max_prefill_predict_length": 28, "max_target_length": 32, "ici_tensor_parallelism": tp,
                      "load_parameters_path": model_dir.checkpoint}  # fmt: skip
    argv = [sys.executable, "-m", "maxtext_compat.cli", "serve", model_dir.out, "--max-num-batched-tokens=32",
            "--max-model-len=32", f"--max-num-seqs={seqs}", f"--tensor-parallel-size={tp}", "--port", str(port),
            f"--additional-config={json.dumps({'maxtext_config': maxtext_config})}"]  # fmt: skip
    log = tmp_path_factory.mktemp("serve") / f"smollm2_tp{tp}_seqs{seqs}.log"
    srv = server.start(argv, port=port, model=model_dir.out, log_path=log, env={**os.environ, **CPU_ENV})
    try:
        seconds = srv.wait_ready(READY_TIMEOUT)
        print(f"\n[real model] TP={tp} max-num-seqs={seqs}: ready after {seconds:.0f} s ({log})", file=sys.stderr)
        yield srv
    finally:
        srv.stop()


def _complete(srv: Server, prompt: str) -> tuple[list[int], str, float]:
    import time

    from helpers.vllm_server import token_ids

    t0 = time.monotonic()
    status, body = srv.completion([prompt], max_tokens=16, timeout=REQUEST_TIMEOUT)
    took = time.monotonic() - t0
    assert status == 200, f"HTTP {status}: {body}\n--- server log ---\n{srv.log_tail()}"
    ids = token_ids(body)
    print(f"[real model] {prompt!r} -> {body['choices'][0]['text']!r} in {took:.1f} s", file=sys.stderr)
    return ids, body["choices"][0]["text"], took


def _check(reference, smollm2, prompt_index: int, ids: list[int], text: str) -> None:
    want = reference[1][prompt_index]
    assert ids == want, f"served {ids} vs reference {want}"
    assert text == smollm2[1].decode(want), text  # the text is the reference's tokens, read by the tokenizer
    assert text.isascii() and len(text.split()) >= 4, text


@pytest.fixture(scope="class")
def tp1(smollm2_dir, tmp_path_factory):
    yield from _serve(smollm2_dir, tmp_path_factory, tp=1, seqs=1)


@pytest.mark.envs(*IN_MAKE_TEST)
class TestSeedCommandTP1:
    def test_seattle_is_a_equals_the_reference(self, tp1, reference, smollm2):
        ids, text, _ = _complete(tp1, "Seattle is a")
        _check(reference, smollm2, 0, ids, text)

    def test_the_log_names_the_kernel_and_no_random_weights(self, tp1):
        log = tp1.log_text()
        assert "RPA kernel on CPU: xla" in log
        assert "random weights" not in log.lower()


# One server per test from here on (function scope): three engine cores alive at once need ~12 GiB.
@pytest.fixture
def tp1_alone(smollm2_dir, tmp_path_factory):
    yield from _serve(smollm2_dir, tmp_path_factory, tp=1, seqs=1)


@pytest.fixture
def tp3(smollm2_dir, tmp_path_factory):
    yield from _serve(smollm2_dir, tmp_path_factory, tp=3, seqs=1)


@pytest.fixture
def seqs4(smollm2_dir, tmp_path_factory):
    yield from _serve(smollm2_dir, tmp_path_factory, tp=1, seqs=4)


@pytest.mark.extended
@pytest.mark.envs(*EXTENDED)
class TestExtended:
    def test_tp1_on_every_serving_release(self, tp1_alone, reference, smollm2):
        ids, text, _ = _complete(tp1_alone, "Seattle is a")
        _check(reference, smollm2, 0, ids, text)

    def test_tp3_equals_the_reference(self, tp3, reference, smollm2):
        ids, text, _ = _complete(tp3, "Seattle is a")
        _check(reference, smollm2, 0, ids, text)

    def test_four_concurrent_requests_each_equal_their_reference(self, seqs4, reference, smollm2):
        from maxtext_compat.testing import real_model as rm

        assert len({len(p) for p in reference[2]}) > 1  # prompts of different lengths
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(rm.PROMPTS)) as pool:
            results = list(pool.map(lambda p: _complete(seqs4, p), rm.PROMPTS))
        for i, (ids, text, _) in enumerate(results):
            _check(reference, smollm2, i, ids, text)
