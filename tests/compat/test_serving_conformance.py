"""A served MaxText model behaves like any vLLM model to the official `openai` client (and to raw HTTP).

One `maxtext-compat serve` of the converted SmolLM2 per environment (MaxText 0.2.5 native, 0.1.0 backport;
--max-model-len 128, 4 sequences), driven with the `openai` client and, where a client would send something odd,
raw HTTP. Every answer is checked against an independent reference: transformers reading the same GGUF file
(tests/helpers/conformance.py: its greedy continuation, its log-softmax with the embedding table rounded to
bfloat16 as MaxText's output head does, held to LOGPROB_TOLERANCE; its own GGUF tokenizer and chat template).
Request features the serving stack drops or fails on (compat_matrix.yaml, tpu-inference's known_defects) must be
refused with vLLM's 400 naming the parameter and the defect, the server alive after each; which of them the
stack also gets wrong serving its own Llama is in docs/serving.md (and bench_serving.py serves that peer).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

from helpers import conformance as cf  # noqa: E402
from helpers.smollm2_server import serve  # noqa: E402
from helpers.vllm_server import token_ids  # noqa: E402
from maxtext_compat.testing import real_model as rm  # noqa: E402

# make test-extended's: a server and transformers' reference of its own (~9 min of a loaded 2-core machine, cold), the
# longest of make test's heavy phases. make test serves 0.2.5 (test_serving_vllm: MaxText's dense decode's tokens)
# and 0.1.0 through the backport (test_backport_backend_serving, test_serve_trained_checkpoint); the request shim's
# rules are tests/unit/test_serving_requests.py's.
pytestmark = [
    pytest.mark.needs_maxtext,
    pytest.mark.slow,
    pytest.mark.envs("maxtext-0.2.5", "maxtext-0.1.0-jax011"),
    pytest.mark.extended,
]

MAX_LEN = 128  # the chat template's system prompt alone is 30 tokens
TOL = cf.LOGPROB_TOLERANCE
IDS = {"return_token_ids": True, "return_tokens_as_token_ids": True}
QUESTION = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]  # greedy: "No." then <|im_end|>


class _Restartable:
    """The module's server, which the last test restarts (a seed's text must survive it); reads as the Server."""

    def __init__(self, start) -> None:
        self._start, self._running = start, None
        self.restart()

    def restart(self, *flags: str) -> None:
        self.stop()
        self._running = self._start(*flags)
        self.srv = self._running.__enter__()

    def stop(self) -> None:
        if self._running is not None:
            self._running, running = None, self._running
            running.__exit__(None, None, None)
            self.stopped = self.srv

    def __getattr__(self, name):
        return getattr(self.srv, name)


@pytest.fixture(scope="module")
def server(smollm2_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("conformance")
    srv = _Restartable(lambda *flags: serve(smollm2_dir, log_dir, seqs=4, max_len=MAX_LEN, flags=flags))
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def ref(reference):
    return cf.Reference(reference.model)


@pytest.fixture(scope="module")
def hf_tok():
    return cf.hf_tokenizer(rm.smollm2_gguf())


def _alive(server) -> None:
    status, _, _ = cf.request(server.url, "/health", timeout=30)
    assert status == 200 and server.alive(), server.log_tail()


def _complete(client, server, **kw):
    return client.completions.create(model=server.model, temperature=0, **kw)


# ------------------------------------------------------------------ the seed's request, greedy


def test_the_seed_request_equals_the_reference(server, reference, smollm2):
    status, body = server.completion(["Seattle is a"], max_tokens=16, timeout=300)
    assert status == 200, f"HTTP {status}: {body}\n{server.log_tail()}"
    assert token_ids(body) == reference.greedy[0]
    assert body["choices"][0]["text"] == smollm2[1].decode(reference.greedy[0])


def test_the_log_names_the_kernel_the_weights_and_the_handled_defects(server):
    log = server.log_text()
    assert "RPA kernel on CPU: xla" in log
    assert "random weights" not in log.lower()
    assert "request defects of tpu-inference 0.32.0 handled: logprobs-zero-returns-none" in log


# ------------------------------------------------------------------ completions: logprobs


@pytest.mark.parametrize("k", [0, 1, 5])
def test_completion_logprobs_equal_the_reference(client, server, reference, ref, k):
    """The issue's request (`logprobs: 0` with return_token_ids answered 500 IndexError before the fix)."""
    prompt = reference.prompt_ids[1]
    got = _complete(client, server, prompt=prompt, max_tokens=4, logprobs=k, extra_body=IDS).choices[0]
    want = reference.greedy[1][:4]
    assert got.token_ids == want
    lp = ref.logprobs([*prompt, *want])
    for step, (key, value, top) in enumerate(zip(got.logprobs.tokens, got.logprobs.token_logprobs,
                                                 got.logprobs.top_logprobs, strict=True)):  # fmt: skip
        row = lp[len(prompt) - 1 + step]
        assert cf.token_id(key) == want[step] and value == pytest.approx(row[want[step]], abs=TOL)
        ranked = [cf.token_id(t) for t in sorted(top, key=top.get, reverse=True)]
        assert ranked == ([want[step]] if k == 0 else list(np.argsort(-row)[:k])), (step, ranked)
        for t, v in top.items():
            assert v == pytest.approx(row[cf.token_id(t)], abs=TOL)
        assert max(abs(v - ref.logprobs([*prompt, *want], rounded=False)[len(prompt) - 1 + step][cf.token_id(t)])
                   for t, v in top.items()) < cf.BF16_TABLE_TOLERANCE  # fmt: skip


def test_echo_with_prompt_logprobs_and_ranks(client, server, reference, ref):
    """lm-eval's loglikelihood request (echo, logprobs 1, max_tokens 1) plus vLLM's prompt_logprobs with ranks."""
    prompt = reference.prompt_ids[0]
    got = _complete(client, server, prompt=prompt, max_tokens=1, echo=True, logprobs=1,
                    extra_body={**IDS, "prompt_logprobs": 2}).choices[0]  # fmt: skip
    lp = ref.logprobs([*prompt, reference.greedy[0][0]])
    values = got.logprobs.token_logprobs
    assert values[0] is None and len(values) == len(prompt) + 1
    for i in range(1, len(values)):
        tok = [*prompt, reference.greedy[0][0]][i]
        assert values[i] == pytest.approx(lp[i - 1, tok], abs=TOL)
    plp = got.prompt_logprobs
    assert plp[0] is None and len(plp) == len(prompt)
    for i in range(1, len(prompt)):
        row = lp[i - 1]
        entry = plp[i][str(prompt[i])]
        v = entry["logprob"]
        assert v == pytest.approx(row[prompt[i]], abs=TOL)
        lo, hi = int((row > v + TOL).sum()) + 1, int((row > v - TOL).sum()) + 1
        assert lo <= entry["rank"] <= hi, (i, entry, lo, hi)
        assert {int(t) for t, e in plp[i].items() if e["rank"] <= 2} == set(np.argsort(-row)[:2].tolist())


# ------------------------------------------------------------------ completions: sampling and stopping


def test_n_above_one_is_vllms_400_when_greedy(client, server):
    """vLLM's own rule (any model): n > 1 needs sampling; sampled n=3 answers are checked below."""
    import openai

    with pytest.raises(openai.BadRequestError, match="n must be 1 when using greedy sampling"):
        _complete(client, server, prompt="Seattle is a", max_tokens=2, n=2)
    _alive(server)


@pytest.mark.parametrize("sampling", [{"top_k": 3}, {"top_p": 0.5}])
def test_sampled_tokens_come_from_the_top_k_or_the_nucleus(client, server, reference, ref, sampling):
    """n=3 sampled answers (temperature 1): every token is one top_k / top_p allows at its position."""
    prompt = reference.prompt_ids[3]
    got = client.completions.create(model=server.model, prompt=prompt, max_tokens=4, n=3, temperature=1.0,
                                    extra_body={**IDS, **sampling})  # fmt: skip
    assert len(got.choices) == 3
    for choice in got.choices:
        lp = ref.logprobs([*prompt, *choice.token_ids])
        for step, tok in enumerate(choice.token_ids):
            row = lp[len(prompt) - 1 + step]
            better = row > row[tok] + TOL
            if "top_k" in sampling:
                assert better.sum() < sampling["top_k"], (step, tok)
            else:
                assert np.exp(row[better]).sum() < sampling["top_p"] + TOL, (step, tok)


def test_a_stop_string_ends_the_text_before_it(client, server, reference, smollm2):
    full = smollm2[1].decode(reference.greedy[0])
    got = _complete(client, server, prompt="Seattle is a", max_tokens=8, stop=[" and"]).choices[0]
    assert (got.text, got.finish_reason, got.stop_reason) == (full.split(" and")[0], "stop", " and")


def test_a_stop_token_id_ends_the_answer_with_it(client, server, reference, smollm2):
    want = reference.greedy[0][:3]
    got = _complete(client, server, prompt="Seattle is a", max_tokens=8,
                    extra_body={**IDS, "stop_token_ids": [want[-1]]}).choices[0]  # fmt: skip
    assert (got.token_ids, got.finish_reason, got.stop_reason) == (want, "stop", want[-1])
    assert got.text == smollm2[1].decode(want[:-1])  # the stop token's text is left out (vLLM's default)


def test_ignore_eos_runs_past_the_end_of_the_answer(client, server, ref, hf_tok):
    prompt = _chat_ids(hf_tok, QUESTION)
    eos = hf_tok.eos_token_id
    natural = ref.greedy(prompt, 8, stop=[eos])
    assert natural[-1] == eos and len(natural) < 6, natural  # the answer ends by itself
    got = _complete(client, server, prompt=prompt, max_tokens=6, extra_body={**IDS, "ignore_eos": True}).choices[0]
    assert got.finish_reason == "length" and got.token_ids == ref.greedy(prompt, 6)
    stopped = _complete(client, server, prompt=prompt, max_tokens=6, extra_body=IDS).choices[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids == natural


def test_the_model_length_limits_max_tokens_with_vllms_400(client, server, ref):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        _complete(client, server, prompt="Seattle is a", max_tokens=MAX_LEN + 1)
    assert f"max_model_len={MAX_LEN}" in str(e.value) and e.value.body["param"] == "max_tokens"
    prompt = [5] * (MAX_LEN - 4)  # 4 tokens left: asking for 10 ends the answer at the model length
    got = _complete(client, server, prompt=prompt, max_tokens=10, extra_body=IDS)
    assert got.usage.total_tokens == MAX_LEN and got.choices[0].finish_reason == "length"
    assert got.choices[0].token_ids == ref.greedy(prompt, 4)
    _alive(server)


# ------------------------------------------------------------------ refused: the stack drops or fails on them

REFUSED = {
    "sampler-ignores-penalties": ({"frequency_penalty": 0.5}, "frequency_penalty"),
    "sampler-ignores-penalties/presence": ({"presence_penalty": 0.5}, "presence_penalty"),
    "sampler-ignores-penalties/repetition": ({"repetition_penalty": 1.3}, "repetition_penalty"),
    "sampler-ignores-penalties/min_p": ({"temperature": 1.0, "min_p": 0.2}, "min_p"),
    "sampler-ignores-token-constraints": ({"logit_bias": {"5": 10}}, "logit_bias"),
    "sampler-ignores-token-constraints/allowed": ({"allowed_token_ids": [5, 6]}, "allowed_token_ids"),
    "sampler-ignores-token-constraints/bad_words": ({"bad_words": ["popular"]}, "bad_words"),
    "min-tokens-not-enforced": ({"min_tokens": 3}, "min_tokens"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_feature_the_stack_drops_is_refused_with_vllms_400(server, case):
    extra, param = REFUSED[case]
    body = {"model": server.model, "prompt": "Seattle is a", "max_tokens": 4, "temperature": 0, **extra}
    status, answer = cf.post_json(server.url, "/v1/completions", body)
    err = cf.error_body(answer)
    assert (status, err["code"], err["type"], err["param"]) == (400, 400, "BadRequestError", param), answer
    assert f"known defect {case.split('/')[0]} of tpu-inference" in err["message"] and "Fix:" in err["message"]
    _alive(server)


# ------------------------------------------------------------------ sampling with a per-request seed (fixed)

SEEDED = 3  # rm.PROMPTS[3], "The best way to learn Python is": its next token 0.72 / 0.19 / 0.04 / ... at temperature 1
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12}  # chi-square, p = 0.001


def _seeded(client, server, seed: int, *, n: int = 1, max_tokens: int = 8, temperature: float = 1.0, **extra):
    got = client.completions.create(model=server.model, prompt=rm.PROMPTS[SEEDED], max_tokens=max_tokens, n=n,
                                    seed=seed, temperature=temperature, extra_body={**IDS, **extra})  # fmt: skip
    return [list(c.token_ids) for c in got.choices]


def test_a_seed_gives_the_same_text_in_any_batch(client, server):
    """The issue's request (temperature 0.7, seed 1: 500 with no message before the fix), alone, again, and in
    batches: vLLM gives the i-th of n answers the seed seed + i, so n=3 with seed 1 holds seed 1's answer
    beside two others, and seed 2's."""
    import concurrent.futures

    alone = _seeded(client, server, 1, temperature=0.7)
    assert len(alone[0]) == 8
    assert _seeded(client, server, 1, temperature=0.7) == alone
    batched = _seeded(client, server, 1, n=3, temperature=0.7)
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:  # beside unseeded requests
        jobs = [pool.submit(_seeded, client, server, s, temperature=0.7) for s in (2, 1)]
        jobs.append(pool.submit(client.completions.create, model=server.model, prompt="Once upon a time",
                                max_tokens=8, temperature=1.0))  # fmt: skip
        two, again = jobs[0].result(), jobs[1].result()
        jobs[2].result()
    assert batched[0] == alone[0] and again == alone and [batched[1]] == two
    assert len({tuple(t) for t in batched}) == 3, batched  # different seeds, different texts


@pytest.mark.extended  # 200 seeded samples (~1 min); make test holds seeds to their batch-independence above
def test_seeded_samples_follow_the_references_distribution(client, server, reference, ref):
    """One step, 200 seeds (n=200, seeds 1000..1199): the first tokens' counts against transformers' softmax at
    the temperature (chi-square, tokens expected at least 5 times, the rest pooled)."""
    n, temperature = 200, 1.5
    first = [t[0] for t in _seeded(client, server, 1000, n=n, max_tokens=1, temperature=temperature)]
    row = ref.logprobs(reference.prompt_ids[SEEDED])[-1] / temperature
    p = np.exp(row - np.logaddexp.reduce(row))
    kept = [int(t) for t in np.argsort(-p) if n * p[t] >= 5]
    counts = np.array([first.count(t) for t in kept] + [sum(t not in kept for t in first)])
    expected = n * np.array([*p[kept], 1 - p[kept].sum()])
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert len(kept) >= 3 and chi2 < CHI2_999[len(kept)], (dict(zip(kept, counts, strict=False)), expected, chi2)


def test_what_the_refusals_leave_alone_is_served(client, server, reference):
    """A seed with temperature 0 (lm-eval sends seed 1234) and min_tokens with ignore_eos are not refused."""
    got = _complete(client, server, prompt="Seattle is a", max_tokens=4, seed=1234, extra_body=IDS).choices[0]
    assert got.token_ids == reference.greedy[0][:4]
    got = _complete(
        client, server, prompt="Seattle is a", max_tokens=4, extra_body={**IDS, "min_tokens": 4, "ignore_eos": True}
    )
    assert got.choices[0].token_ids == reference.greedy[0][:4]


# ------------------------------------------------------------------ chat


def _chat_ids(hf_tok, messages) -> list[int]:
    out = hf_tok.apply_chat_template(messages, add_generation_prompt=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_chat_uses_the_models_template_and_gives_logprobs(client, server, ref, hf_tok):
    prompt = _chat_ids(hf_tok, QUESTION)
    want = ref.greedy(prompt, 8, stop=[hf_tok.eos_token_id])
    got = client.chat.completions.create(model=server.model, messages=QUESTION, max_tokens=8, temperature=0,
                                         logprobs=True, top_logprobs=2, extra_body=IDS)  # fmt: skip
    choice = got.choices[0]
    assert got.prompt_token_ids == prompt  # vLLM rendered the converted directory's template as transformers does
    assert choice.finish_reason == "stop" and choice.token_ids == want
    assert choice.message.content == hf_tok.decode(want, skip_special_tokens=True)
    lp = ref.logprobs([*prompt, *want])
    for step, entry in enumerate(choice.logprobs.content):
        row = lp[len(prompt) - 1 + step]
        assert entry.logprob == pytest.approx(row[want[step]], abs=TOL)
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(np.sort(row)[::-1][:2].tolist(), abs=TOL)


# ------------------------------------------------------------------ streaming


def test_a_streamed_completion_equals_the_plain_one(client, server):
    plain = _complete(client, server, prompt="Once upon a time", max_tokens=6).choices[0].text
    chunks = list(_complete(client, server, prompt="Once upon a time", max_tokens=6, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == plain and chunks[-1].choices[0].finish_reason == "length"
    body = {"model": server.model, "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "stream": True}
    events = list(cf.sse_events(server.url, "/v1/completions", body))
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == plain  # every chunk parses


def test_a_streamed_chat_equals_the_plain_one(client, server):
    kw = {"model": server.model, "messages": QUESTION, "max_tokens": 6, "temperature": 0}
    plain = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain
    events = list(cf.sse_events(server.url, "/v1/chat/completions", {**kw, "stream": True}))
    assert events[-1] == "[DONE]" and all(json.loads(e)["object"] == "chat.completion.chunk" for e in events[:-1])


def test_a_client_that_leaves_mid_stream_frees_its_kv_pages(client, server, reference):
    body = {"model": server.model, "prompt": "Once upon a time", "max_tokens": 100, "temperature": 0, "stream": True}
    assert len(list(cf.sse_events(server.url, "/v1/completions", body, stop_after=2))) == 2  # then hang up
    deadline, text = time.monotonic() + 120, ""
    while time.monotonic() < deadline:
        text = cf.request(server.url, "/metrics")[1].decode()
        if cf.metric(text, "vllm:num_requests_running") == 0 and cf.metric(text, "vllm:kv_cache_usage_perc") == 0:
            break
        time.sleep(1)
    else:
        pytest.fail(f"the left request still holds the engine: {text[-2000:]}")
    got = _complete(client, server, prompt="Seattle is a", max_tokens=4, extra_body=IDS).choices[0]
    assert got.token_ids == reference.greedy[0][:4]


# ------------------------------------------------------------------ the other endpoints


def test_models_health_metrics_tokenize_detokenize(client, server, reference, smollm2):
    models = client.models.list().data
    assert [m.id for m in models] == [server.model] and models[0].max_model_len == MAX_LEN
    status, body, _ = cf.request(server.url, "/health")
    assert (status, body) == (200, b"")
    status, text, headers = cf.request(server.url, "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert cf.metric(text.decode(), "vllm:prompt_tokens_total") > 0
    status, tok = cf.post_json(server.url, "/tokenize", {"model": server.model, "prompt": "Seattle is a"})
    assert status == 200 and (tok["tokens"], tok["count"], tok["max_model_len"]) == (
        reference.prompt_ids[0], len(reference.prompt_ids[0]), MAX_LEN)  # fmt: skip
    status, detok = cf.post_json(server.url, "/detokenize", {"model": server.model, "tokens": reference.greedy[0]})
    assert status == 200 and detok["prompt"] == smollm2[1].decode(reference.greedy[0])


# ------------------------------------------------------------------ malformed requests

MALFORMED = {
    "bad JSON": (b'{"model": ', 400, None),
    "unknown model": ({"model": "no-such-model", "prompt": "x", "max_tokens": 2}, 404, None),
    "negative max_tokens": ({"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    "prompt longer than the model": ({"prompt": [5] * (MAX_LEN + 2), "max_tokens": 2}, 400, "input_tokens"),
    "token id out of the vocabulary": ({"prompt": [49152, 5], "max_tokens": 2}, 400, None),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_request_gets_vllms_4xx_and_the_server_lives(server, case):
    payload, code, param = MALFORMED[case]
    if isinstance(payload, dict):
        payload = json.dumps({"model": server.model, "temperature": 0, **payload}).encode()
    status, body, _ = cf.request(server.url, "/v1/completions", payload)
    err = cf.error_body(json.loads(body))
    assert (status, err["code"]) == (code, code), body
    assert param is None or err["param"] == param, body
    assert "Traceback" not in err["message"]
    _alive(server)


# ------------------------------------------------------------------ a real client, unchanged: lm-evaluation-harness

LM_EVAL_TASKS = Path(__file__).parent / "lm_eval_tasks"  # smollm2_facts: 6 multiple-choice questions, local data
LOGLIK_TOLERANCE = 0.3  # the served head's bfloat16 table vs hf's float32 (BF16_TABLE_TOLERANCE); measured 0.015


def _lm_eval(out: Path, model: str, model_args: str, *extra: str) -> list[dict]:
    """`lm_eval` as a user runs it (its CLI, in a subprocess), offline; the per-example samples it logged."""
    import os
    import subprocess
    import sys

    cmd = [str(Path(sys.executable).with_name("lm_eval")), "--model", model, "--model_args", model_args,
           "--tasks", "smollm2_facts", "--include_path", str(LM_EVAL_TASKS), "--output_path", str(out),
           "--log_samples", "--batch_size", "1", *extra]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(out / "ds")}
    done = subprocess.run(cmd, cwd=LM_EVAL_TASKS, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, f"lm_eval --model {model} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    files = sorted(out.rglob("samples_smollm2_facts_*.jsonl"))
    assert len(files) == 1, files
    return sorted((json.loads(line) for line in files[0].read_text().splitlines()), key=lambda s: s["doc_id"])


def _hf_samples(out: Path) -> list[dict]:
    """lm-eval's hf backend on the GGUF file: release-independent, so kept beside transformers' cached reading of
    the model (keyed by the file, the task's files and the readers' versions) for the other environment."""
    import hashlib
    import importlib.metadata

    from maxtext_compat.atomic_file import replacing
    from maxtext_compat.runner.caches import hf_reference_dir

    gguf = rm.smollm2_gguf()
    key = hashlib.sha256(f"{gguf.stat().st_size}:{gguf.name}".encode())
    for f in sorted(LM_EVAL_TASKS.iterdir()):
        key.update(f.read_bytes())
    for name in ("lm-eval", "transformers", "torch", "gguf"):
        key.update(importlib.metadata.version(name).encode())
    cache = hf_reference_dir()
    entry = None if cache is None else cache / f"lm-eval-hf-{key.hexdigest()[:24]}.json"
    if entry is not None and entry.is_file():
        entry.touch()
        return json.loads(entry.read_text())
    found = _lm_eval(out, "hf", f"pretrained={gguf.parent},gguf_file={gguf.name},dtype=float32", "--device", "cpu")
    if entry is not None:
        entry.parent.mkdir(parents=True, exist_ok=True)
        with replacing(entry) as partial:
            partial.write_text(json.dumps(found))
    return found


# Served log-likelihoods are held to transformers' by the logprobs and echo tests above in make test; lm-eval's
# client path over them (a second model load for its hf backend, ~4 min on 2 cores) runs in make test-extended.
@pytest.mark.extended
def test_lm_eval_local_completions_equals_its_hf_backend(server, tmp_path):
    """lm_eval --model local-completions against the server: the per-example log-likelihoods equal lm-eval's own
    hf backend on the same GGUF file within LOGLIK_TOLERANCE, and so do its choices."""
    served = _lm_eval(tmp_path / "served", "local-completions",
                      f"model={server.model},base_url={server.url}/v1/completions,tokenizer_backend=huggingface,"
                      f"tokenizer={server.model},num_concurrent=1,max_retries=1,tokenized_requests=True")  # fmt: skip
    hf = _hf_samples(tmp_path / "hf")
    assert [s["doc_id"] for s in served] == [s["doc_id"] for s in hf] and len(served) == 6
    for ours, theirs in zip(served, hf, strict=True):
        got = [float(r[0][0]) for r in ours["resps"]]  # lm-eval logs them as strings
        want = [float(r[0][0]) for r in theirs["resps"]]
        assert got == pytest.approx(want, abs=LOGLIK_TOLERANCE), (ours["doc_id"], got, want)
        assert int(np.argmax(got)) == int(np.argmax(want)) and ours["acc"] == theirs["acc"], ours["doc_id"]


# ------------------------------------------------------------------ last: the server restarted


# The seed's key is made by the request shim from the seed and the position alone, whatever the model: make test
# proves it within one server (any batch, test_a_seed_gives_the_same_text_in_any_batch); the restart (a second
# server start, ~3 min on 2 cores) runs in make test-extended.
@pytest.mark.extended
def test_a_restarted_server_gives_a_seed_the_same_text(server, reference):
    """Restarted with another server seed (--seed 1234: the batch's own key starts elsewhere), the seeded requests
    of test_a_seed_gives_the_same_text_in_any_batch give the same text again; greedy answers are unchanged."""
    from openai import OpenAI

    before = [_seeded_client_texts(server, seed) for seed in (1, 2)]
    server.restart("--seed", "1234")
    # The stopped server left nothing in the $TMPDIR it was started with: `maxtext-compat serve` gives its processes
    # a folder of their own that goes with them (vLLM's IPC sockets, its Prometheus folder, torch's cache).
    assert server.stopped.left_in_tmpdir == [], server.stopped.tmpdir
    assert "seed=1234" in server.log_text() or "'seed': 1234" in server.log_text(), server.log_tail()
    assert [_seeded_client_texts(server, seed) for seed in (1, 2)] == before
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    assert _complete(client, server, prompt="Seattle is a", max_tokens=4, extra_body=IDS).choices[0].token_ids == (
        reference.greedy[0][:4])  # fmt: skip


def _seeded_client_texts(server, seed: int) -> list[list[int]]:
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    return _seeded(client, server, seed, temperature=0.7)
