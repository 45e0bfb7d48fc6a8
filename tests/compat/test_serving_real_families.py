"""Llama 3.1 and Qwen 3 (written by transformers: testing/real_families.py) converted and served for real.

`maxtext-compat serve` of each conversion (MaxText 0.2.5's own vLLM path: llama3.1's scaled interleaved RoPE, Qwen 3's
query/key norms) answers the completions endpoint for the seed's four prompts with transformers' 16 greedy ids (and
the prompt ids transformers' tokenizer gives), and the chat endpoint, through the family's turn format the directory
carries, with transformers' greedy ids for the ids transformers' own `apply_chat_template` gives. One server per
family (~2 min each to start on a shared 2-core CPU), so `make test-extended` runs it, as Gemma 3's serving test.
"""

from __future__ import annotations

import sys

import pytest

from helpers.smollm2_server import serve
from helpers.vllm_server import token_ids

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.slow, pytest.mark.envs("maxtext-0.2.5"),
              pytest.mark.extended_in("maxtext-0.2.5")]  # fmt: skip
REQUEST_TIMEOUT = 600.0
MAX_LEN = 96  # the chat prompt (~53 ids with Llama 3.1's header tokens) and its answer
NEW_TOKENS = 16
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module", params=("llama31", "qwen3"))
def family(request, tmp_path_factory):
    """(name, conversion, transformers' tokenizer, transformers' model) of one family."""
    from maxtext_compat import convert
    from maxtext_compat.testing import real_families as rf

    path = rf.family_dir(request.param)
    result = convert.convert(path, tmp_path_factory.mktemp(request.param) / "model")
    tokenizer, model = rf.hf_model(path)
    return request.param, result, tokenizer, model


@pytest.fixture(scope="module")
def server(family, tmp_path_factory):
    name, result, _, _ = family
    with serve(result, tmp_path_factory.mktemp(f"serve-{name}"), max_len=MAX_LEN, label=name) as srv:
        yield srv


def test_llama31_and_qwen3_completions_are_transformers_ids(family, server):
    from maxtext_compat.testing import real_families as rf

    name, _, tokenizer, model = family
    for prompt in rf.PROMPTS:
        status, body = server.completion([prompt], max_tokens=NEW_TOKENS, timeout=REQUEST_TIMEOUT)
        assert status == 200, f"HTTP {status}: {body}\n--- server log ---\n{server.log_tail()}"
        ids = tokenizer(prompt).input_ids
        want, _ = rf.hf_greedy_margins(model, ids, NEW_TOKENS)
        assert body["choices"][0]["prompt_token_ids"] == ids
        got = token_ids(body)
        print(f"[{name}] {prompt!r} -> {got}", file=sys.stderr)
        assert got == want, f"{name} {prompt!r}: served {got} vs transformers {want}"


def test_llama31_and_qwen3_chat_is_transformers_ids(family, server):
    """The server renders the family's template the directory carries into the ids transformers' apply_chat_template
    gives, and answers with transformers' greedy ids for them, up to where the first of the two stopped."""
    from helpers import conformance as cf
    from maxtext_compat.testing import real_families as rf

    name, _, tokenizer, model = family
    status, body = cf.post_json(server.url, "/v1/chat/completions", {
        "model": server.model, "messages": QUESTION, "max_tokens": 8, "temperature": 0, "return_token_ids": True,
    }, timeout=REQUEST_TIMEOUT)  # fmt: skip
    assert status == 200, f"HTTP {status}: {body}\n--- server log ---\n{server.log_tail()}"
    rendered = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)
    rendered = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
    assert body["prompt_token_ids"] == rendered
    want, _ = rf.hf_greedy_margins(model, rendered, 8)
    choice = body["choices"][0]
    got = choice["token_ids"]
    print(f"[{name}] chat -> {got} ({choice['finish_reason']})", file=sys.stderr)
    n = min(len(got), len(want))  # each stops at the family's end-of-turn id
    assert n and got[:n] == want[:n], f"{name}: served {got} vs transformers {want}"
    assert len(got) == 8 or choice["finish_reason"] == "stop", choice
