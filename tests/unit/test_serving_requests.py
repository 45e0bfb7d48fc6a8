"""The serving stack's request defects (compat_matrix.yaml, tpu-inference's known_defects): each one the matrix
lists has a handler, each refusal names the parameter, the defect, the upstream place and the fix, and what a
refusal must leave alone is left alone. The served behaviour (400s, logprobs=0 answered) is checked for real in
tests/compat/test_serving_conformance.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from maxtext_compat.errors import RequestRefusedError, ShimRefusedError
from maxtext_compat.matrix import load_matrix
from maxtext_compat.serving_fixes import request_defects as sr

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
        assert d.id in table, f"{d.id} ({d.remedy}) has no handler in serving_fixes/request_defects.py"
        assert d.upstream and ".py:" in d.upstream, d.id


@pytest.mark.parametrize(
    ("defect", "kw", "param"),
    [
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
        {"temperature": 0.7, "seed": 1},  # a seeded sampled request: fixed (serving_fixes.seeded_sampling), not refused
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


# ------------------------------------------------------------------ per-request seeds (serving_fixes.seeded_sampling)


@pytest.fixture
def server_facts():
    from maxtext_compat.serving_fixes import seeded_sampling as ss

    saved = dict(ss._SERVER)
    ss._SERVER.clear()
    yield ss._SERVER
    ss._SERVER.clear()
    ss._SERVER.update(saved)


def _validate(seed_defect):
    seen = []
    wrapper = sr._validate_factory([d for d in DEFECTS if d.remedy == "refuse"], seed_defect, "0.32.0")(None)
    return seen, lambda p: wrapper(lambda inputs, got: seen.append(got), "TpuPlatform", ("inputs", p), {})


def test_a_seeded_request_reaches_tpu_inferences_check_without_its_seed(server_facts):
    seed = next(d for d in DEFECTS if d.id == sr.SEED)
    assert seed.remedy == "fix"
    seen, validate = _validate(seed)
    asked = params(temperature=0.7, seed=5)
    validate(asked)
    validate(params(temperature=0.0, seed=5))  # greedy: untouched
    assert seen[0].seed is None and seen[0].temperature == 0.7 and asked.seed == 5  # a copy, the request keeps it
    assert seen[1].seed == 5


@pytest.mark.parametrize(
    ("facts", "why"),
    [
        ({"speculative": True}, "speculative decoding"),
        ({"dp": 2}, "data parallelism"),
        ({"continue_decode": True}, "enable_continue_decode"),
    ],
)
def test_a_server_that_cannot_honour_a_seed_refuses_it_naming_why(server_facts, facts, why):
    server_facts.update(facts)
    _, validate = _validate(next(d for d in DEFECTS if d.id == sr.SEED))
    with pytest.raises(RequestRefusedError) as e:
        validate(params(temperature=0.7, seed=5))
    assert e.value.argument == "seed" and why in str(e.value) and "known defect per-request-seed" in str(e.value)
    validate(params(temperature=0.7))  # without a seed: served


def test_the_config_vllm_builds_says_what_refuses_seeds(server_facts):
    from maxtext_compat.serving_fixes import seeded_sampling as ss

    wrapper = ss._note_config(None)
    config = SimpleNamespace(speculative_config=None, sharding_config=SimpleNamespace(total_dp_size=1),
                             additional_config={"enable_continue_decode": True})  # fmt: skip
    wrapper(lambda cfg: None, None, (config,), {})
    assert ss.unsupported() == "with enable_continue_decode (the fused decode loop samples on the device)"
    wrapper(
        lambda **kw: None, None, (), {"vllm_config": SimpleNamespace(speculative_config=None, additional_config={})}
    )
    assert ss.unsupported() is None


def _runner(*reqs, dp=1):
    """A tpu-inference runner's state: rows of (req_id, seed, temperature, computed tokens)."""
    requests = {r: SimpleNamespace(sampling_params=SimpleNamespace(seed=s, temperature=t), num_computed_tokens=n)
                for r, s, t, n in reqs}  # fmt: skip
    batch = SimpleNamespace(req_ids=[r[0] for r in reqs] + [None], num_reqs=len(reqs))
    return SimpleNamespace(input_batch=batch, requests=requests, dp_size=dp)


def test_the_seeded_rows_of_a_step_are_their_seed_and_the_position_drawn(server_facts):
    from maxtext_compat.serving_fixes import seeded_sampling as ss

    runner = _runner(("a", None, 0.7, 3), ("b", 2**40 + 9, 1.0, 5), ("c", 4, 0.0, 1), ("d", 4, 0.5, 0))
    scheduled = SimpleNamespace(num_scheduled_tokens={"a": 1, "b": 1, "c": 1, "d": 6})
    assert ss._seeded_rows(runner, scheduled).rows == ((1, 2**40 + 9, 6), (3, 4, 6))  # greedy c, unseeded a: out


def test_a_seeded_row_the_step_cannot_honour_stops_it_loudly(server_facts):
    from maxtext_compat.errors import ServingError
    from maxtext_compat.serving_fixes import seeded_sampling as ss

    def sample_from_logits(self, scheduler_output, attn_metadata, tpu_sampling_metadata, input_ids, hidden_states,
                           logits, aux_hidden_states, spec_decode_metadata, kv_connector_output,
                           logits_indices_selector=None):  # fmt: skip
        return "sampled"

    wrapper = ss._sample_from_logits_factory(SimpleNamespace(function=sample_from_logits))
    scheduled = SimpleNamespace(num_scheduled_tokens={"a": 1})
    seeded = _runner(("a", 3, 0.7, 4))
    call = (scheduled, None, None, None, None, None, None)
    assert wrapper(lambda *a, **k: "sampled", seeded, (*call, None, None), {}) == "sampled"
    with pytest.raises(ServingError, match="speculative decoding"):
        wrapper(lambda *a, **k: "sampled", seeded, (*call, object(), None), {})
    with pytest.raises(ServingError, match="data parallelism"):
        wrapper(lambda *a, **k: "sampled", _runner(("a", 3, 0.7, 4), dp=2), (*call, None, None), {})
    unseeded = _runner(("a", None, 0.7, 4))
    assert wrapper(lambda *a, **k: "sampled", unseeded, (*call, object(), None), {}) == "sampled"


def test_the_request_shim_switched_off_after_it_went_in_lets_requests_through(server_facts, monkeypatch):
    """An API server set up before it read `--additional-config` (its plugin loads with vLLM's argument parser)
    gets disable_request_shim as an environment variable later: the installed check reads it per request."""
    _, validate = _validate(next(d for d in DEFECTS if d.id == sr.SEED))
    monkeypatch.delenv(sr.DISABLE_ENV, raising=False)
    with pytest.raises(RequestRefusedError):
        validate(params(frequency_penalty=0.5))
    monkeypatch.setenv(sr.DISABLE_ENV, "1")
    validate(params(frequency_penalty=0.5))  # the stack's own behaviour: passed on unchecked
