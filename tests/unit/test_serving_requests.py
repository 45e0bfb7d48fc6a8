"""The serving stack's request defects (compat_matrix.yaml, tpu-inference's known_defects): each one the matrix
lists has a handler, each refusal names the parameter, the defect, the upstream place and the fix, and what a
refusal must leave alone is left alone. The served behaviour (400s, logprobs=0 answered) is checked for real in
tests/compat/test_serving_conformance.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from maxtext_compat.errors import RequestRefusedError, ShimRefusedError
from maxtext_compat.matrix import load_matrix
from maxtext_compat.shims import serving_requests as sr

ROW = next(r for r in load_matrix().tpu_inference if r.contains("0.32.0"))
DEFECTS = list(ROW.known_defects)


def params(**kw):
    base = {"temperature": 0.0, "seed": None, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "repetition_penalty": 1.0, "min_p": 0.0, "logit_bias": None, "allowed_token_ids": None,
            "bad_words": None, "min_tokens": 0, "ignore_eos": False, "stop_token_ids": []}  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


def test_every_stack_defect_of_the_matrix_has_a_handler():
    assert DEFECTS, "tpu-inference 0.32.0's range lists its request defects"
    for d in DEFECTS:
        table = sr.FIXES if d.remedy == "fix" else sr.REFUSALS
        assert d.id in table, f"{d.id} ({d.remedy}) has no handler in shims/serving_requests.py"
        assert d.upstream and ".py:" in d.upstream, d.id


@pytest.mark.parametrize(
    ("defect", "kw", "param"),
    [
        ("per-request-seed", {"temperature": 0.7, "seed": 1}, "seed"),
        ("sampler-ignores-penalties", {"frequency_penalty": 0.5}, "frequency_penalty"),
        ("sampler-ignores-penalties", {"presence_penalty": -0.5}, "presence_penalty"),
        ("sampler-ignores-penalties", {"repetition_penalty": 1.2}, "repetition_penalty"),
        ("sampler-ignores-penalties", {"temperature": 1.0, "min_p": 0.1}, "min_p"),
        ("sampler-ignores-token-constraints", {"logit_bias": {5: 1.0}}, "logit_bias"),
        ("sampler-ignores-token-constraints", {"allowed_token_ids": [1]}, "allowed_token_ids"),
        ("sampler-ignores-token-constraints", {"bad_words": ["x"]}, "bad_words"),
        ("min-tokens-not-enforced", {"min_tokens": 2}, "min_tokens"),
        ("min-tokens-not-enforced", {"min_tokens": 2, "ignore_eos": True, "stop_token_ids": [7]}, "min_tokens"),
    ],
)
def test_a_request_that_meets_a_refused_defect_is_refused_naming_it(defect, kw, param):
    with pytest.raises(RequestRefusedError) as e:
        sr.check_request(DEFECTS, "0.32.0", params(**kw))
    err = e.value
    assert isinstance(err, ShimRefusedError) and err.argument == param
    upstream = next(d.upstream for d in DEFECTS if d.id == defect)
    text = str(err)
    assert f"known defect {defect} of tpu-inference 0.32.0" in text and "Fix:" in text
    assert upstream.replace("/", ".").replace(".py:", " line ") in text and "/" not in upstream.split(":")[0][-3:]


@pytest.mark.parametrize(
    "kw",
    [
        {},  # plain greedy
        {"seed": 1234},  # lm-eval's greedy request carries a seed
        {"temperature": 0.8, "top_p": 0.9},  # sampling without a seed
        {"min_tokens": 3, "ignore_eos": True},  # no stop token can end the answer early
        {"min_p": 0.0, "repetition_penalty": 1.0, "logit_bias": {}},  # neutral values
    ],
)
def test_what_no_defect_touches_is_left_alone(kw):
    sr.check_request(DEFECTS, "0.32.0", params(**kw))


def test_logprobs_zero_counts_as_asked_for():
    batch = SimpleNamespace(max_num_logprobs=0, all_greedy=True)
    seen = sr._AskedLogprobs(batch)
    assert seen.max_num_logprobs == 1 and seen.all_greedy is True
    assert sr._AskedLogprobs(SimpleNamespace(max_num_logprobs=None)).max_num_logprobs is None
    assert sr._AskedLogprobs(SimpleNamespace(max_num_logprobs=5)).max_num_logprobs == 5


def test_the_from_input_batch_wrapper_hands_over_the_view():
    wrapper = sr._logprobs_zero_factory(None)
    seen = []
    wrapped = lambda cls, batch, *rest: seen.append(batch.max_num_logprobs)  # noqa: E731
    wrapper(wrapped, None, ("cls", SimpleNamespace(max_num_logprobs=0), 8), {})
    wrapper(lambda **kw: seen.append(kw["input_batch"].max_num_logprobs), None, (),
            {"input_batch": SimpleNamespace(max_num_logprobs=0)})  # fmt: skip
    assert seen == [1, 1]
