"""Oracles and raw-HTTP aids for the served model's OpenAI API conformance suite.

Why apart from the tests: the reference computations (transformers' own reading of the GGUF file: log-softmax,
greedy continuation, its GGUF tokenizer and chat template) and the wire-level readers (server-sent events,
Prometheus text) are shared by the conformance tests, lm-eval's comparison and the load benchmark.

The served logits multiply the final hidden state by the embedding table rounded to bfloat16 (MaxText's tied
output head, every release); the reference does the same rounding on transformers' hidden state, so served
logprobs are held to LOGPROB_TOLERANCE of it (two float32 implementations of 30 layers), and to
BF16_TABLE_TOLERANCE of transformers' own float32 log-softmax.
"""

from __future__ import annotations

import functools
import http.client
import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

LOGPROB_TOLERANCE = 5e-3
BF16_TABLE_TOLERANCE = 0.3  # logits within 0.15 (test_real_model.py), log-softmax at most twice that


class Reference:
    """transformers' LlamaForCausalLM on the GGUF file (the `reference` fixture's model), as served logprobs see it."""

    def __init__(self, model: Any) -> None:
        import torch

        from maxtext_compat.testing import real_model as rm

        self.model = model
        table = model.get_input_embeddings().weight.detach().numpy()
        self._table = torch.from_numpy(rm.bf16_rounded(table))

    @functools.lru_cache(maxsize=64)  # noqa: B019 - one Reference per session, a few dozen sequences
    def _logprobs(self, ids: tuple[int, ...], rounded: bool) -> np.ndarray:
        import torch

        with torch.no_grad():
            if rounded:
                hidden = self.model.model(torch.tensor([list(ids)])).last_hidden_state[0]
                logits = hidden @ self._table.T
            else:
                logits = self.model(torch.tensor([list(ids)])).logits[0]
        return torch.log_softmax(logits.double(), dim=-1).numpy()

    def logprobs(self, ids: Sequence[int], *, rounded: bool = True) -> np.ndarray:
        """(len(ids), vocab) float64: row i is the distribution of the token after ids[: i + 1]."""
        return self._logprobs(tuple(int(i) for i in ids), rounded)

    def greedy(self, ids: Sequence[int], new_tokens: int, *, stop: Sequence[int] = ()) -> list[int]:
        """Greedy continuation by argmax of the rounded logits, as the server decodes (stops after a stop id)."""
        return list(self._greedy(tuple(int(i) for i in ids), new_tokens, tuple(stop)))

    @functools.lru_cache(maxsize=64)  # noqa: B019 - see _logprobs
    def _greedy(self, ids: tuple[int, ...], new_tokens: int, stop: tuple[int, ...]) -> tuple[int, ...]:
        """With transformers' KV cache: one forward over the prompt, then one token per step (a full forward per
        step cost ~3 s for a 124-token prompt on this machine)."""
        import torch

        out: list[int] = []
        with torch.no_grad():
            step = self.model.model(torch.tensor([list(ids)]), use_cache=True)
            while True:
                tok = int(torch.argmax(step.last_hidden_state[0, -1] @ self._table.T))
                out.append(tok)
                if tok in stop or len(out) == new_tokens:
                    return tuple(out)
                step = self.model.model(torch.tensor([[tok]]), past_key_values=step.past_key_values, use_cache=True)


def hf_tokenizer(gguf: Any) -> Any:
    """transformers' tokenizer read from the GGUF file itself (its chat template included)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def token_id(key: str) -> int:
    """A logprobs key of a request with return_tokens_as_token_ids ('token_id:123') as the id."""
    match = re.fullmatch(r"token_id:(\d+)", key)
    assert match, f"not a token-id key: {key!r}"
    return int(match.group(1))


# ------------------------------------------------------------------ raw HTTP


def request(url: str, path: str, body: bytes | None = None, *, method: str | None = None,
            timeout: float = 300.0) -> tuple[int, bytes, dict[str, str]]:  # fmt: skip
    """(status, body, headers) of one request; an HTTP error is an answer too."""
    req = urllib.request.Request(url + path, data=body, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def post_json(url: str, path: str, payload: Any, timeout: float = 300.0) -> tuple[int, Any]:
    status, body, _ = request(url, path, json.dumps(payload).encode(), timeout=timeout)
    return status, json.loads(body) if body else None


def sse_events(url: str, path: str, payload: dict[str, Any], *, stop_after: int | None = None,
               timeout: float = 300.0) -> Iterator[str]:  # fmt: skip
    """The `data:` payloads of a streamed answer, as sent; with `stop_after`, the connection is closed after that
    many events (a client that goes away mid-stream)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(payload), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, f"HTTP {resp.status}: {resp.read()[:500]!r}"
        seen = 0
        for raw in resp:
            line = raw.decode().rstrip("\r\n")
            if not line:
                continue
            assert line.startswith("data: "), f"not a server-sent event line: {line!r}"
            yield line.removeprefix("data: ")
            seen += 1
            if stop_after is not None and seen >= stop_after:
                return
    finally:
        conn.close()


def metric(text: str, name: str) -> float:
    """The value of one unlabelled-or-single-series Prometheus metric in /metrics text (sum over its series)."""
    values = [float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)]
    assert values, f"/metrics has no {name}"
    return sum(values)


def error_body(body: Any) -> dict[str, Any]:
    """vLLM's error body: {"error": {"message", "type", "param", "code"}}; the inner dict."""
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), f"not vLLM's error body: {body!r}"
    err = body["error"]
    assert {"message", "type", "code"} <= set(err), err
    return err
