"""SmolLM2 served for real beyond `make test`: 0.2.4, TP=3, four concurrent requests (`make test-extended`).

The server is the user's command (`python -m maxtext_compat.cli serve MODEL_DIR --max-num-batched-tokens=32
--max-model-len=32 --max-num-seqs=N --tensor-parallel-size=N --additional-config='{"maxtext_config": {...}}'`) in
its own process group, started and stopped here (tests/helpers/smollm2_server.py); the request is the seed's JSON
("prompt": ["Seattle is a"], "max_tokens": 16, "temperature": 0). The completion's token ids must equal
transformers' greedy decode of the same GGUF file, and its text the reference tokenizer's decoding of them.

In `make test` the seed's request on TP=1 runs in the conformance suite (test_serving_conformance.py: MaxText
0.2.5 native and 0.1.0 backport, one server per environment); here `make test-extended` adds 0.2.4, TP=3 (9 query
and 3 KV heads split three ways) and four concurrent requests of different lengths, one server per test (three
engine cores alive at once need ~12 GiB).
"""

from __future__ import annotations

import concurrent.futures
import sys
import time
from collections.abc import Iterator

import pytest

from helpers.smollm2_server import serve
from helpers.vllm_server import Server, token_ids

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.slow]
EXTENDED = ("maxtext-0.2.5", "maxtext-0.2.4", "maxtext-0.1.0-jax011")
REQUEST_TIMEOUT = 300.0


def _serve(model_dir, tmp_path_factory, *, tp: int, seqs: int) -> Iterator[Server]:
    with serve(model_dir, tmp_path_factory.mktemp("serve"), tp=tp, seqs=seqs) as srv:
        yield srv


def _complete(srv: Server, prompt: str) -> tuple[list[int], str, float]:
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
