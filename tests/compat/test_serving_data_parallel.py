"""Data parallelism on one host (issue 40, item 1): `maxtext-compat serve MODEL --data-parallel-size 2` on a CPU.

The server is the user's command (tests/helpers/smollm2_server.py, `--data-parallel-size 2`, nothing else): vLLM's
`serve` starts one API server and one engine core per rank (tpu-inference resolves TPU_MULTIPROCESS_DP=1, each
engine core a runner of its own with DP size 1), and the plugin runs in each of the four processes. One server per
module, shared by the tests. Checked: every process registered the same row with the same shims (the fingerprint
each logs); 16 concurrent clients get transformers' greedy tokens, none lost, and vLLM's per-engine metrics show
both ranks served; a per-request seed gives the same text on rank 0 and rank 1 (the request pinned with vLLM's
`X-data-parallel-rank` header, the rank confirmed by the metrics), since each rank draws a seeded row with the key
made of the seed and the position alone; a client leaving mid-stream frees its engine and the server keeps serving.
`make test-extended` adds the load run (16 clients for 60 s), whose figures `make bench` records.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from helpers import conformance as cf
from helpers.load_run import load_run
from helpers.smollm2_server import serve
from helpers.vllm_server import Server, token_ids

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.slow, pytest.mark.envs("maxtext-0.2.2")]
INSTALLED = importlib.metadata.version("maxtext")  # the release this environment serves

RANKS, CLIENTS, TOKENS, SEQS, MAX_LEN = 2, 16, 16, 8, 64
SETTINGS = {"strict": False}  # the default behaviour, given in the config: every process's fingerprint must hold it
SUCCESS = "vllm:request_success_total"
REGISTERED = re.compile(r"\((\w+) pid=(\d+)\).*maxtext_compat plugin \(pid \d+[^)]*\): registered (.*?); CPU serving "
                        r"shim: .*; fingerprint (\w+) \((settings: [^)]*)\)$", re.M)  # fmt: skip


@pytest.fixture(scope="module")
def dp2(smollm2_dir, tmp_path_factory) -> Iterator[Server]:
    flags = ("--data-parallel-size", str(RANKS))
    log_dir = tmp_path_factory.mktemp("dp2")
    with serve(smollm2_dir, log_dir, seqs=SEQS, max_len=MAX_LEN, flags=flags, settings=SETTINGS) as srv:
        yield srv


def per_engine(srv: Server, name: str) -> dict[str, float]:
    """One counter of /metrics per engine (vLLM labels each series with engine="<rank>"), summed over its labels."""
    text = cf.request(srv.url, "/metrics")[1].decode()
    out: dict[str, float] = {}
    for m in re.finditer(rf"^{re.escape(name)}{{([^}}]*)}} (\S+)$", text, re.M):
        engine = re.search(r'engine="(\d+)"', m.group(1))
        assert engine, f"{name} without an engine label: {m.group(0)}"
        out[engine.group(1)] = out.get(engine.group(1), 0.0) + float(m.group(2))
    return out


def served_since(srv: Server, before: dict[str, float], total: int) -> dict[str, float]:
    """Requests each engine finished since `before`, once they add up to `total` (the API servers record a finished
    request just after answering it: polled for a few seconds)."""
    deadline = time.monotonic() + 30
    while True:
        after = per_engine(srv, SUCCESS)
        served = {e: after[e] - before.get(e, 0.0) for e in after}
        if sum(served.values()) >= total or time.monotonic() > deadline:
            return served
        time.sleep(0.5)


def _on_rank(srv: Server, rank: int, body: dict[str, Any]) -> list[int]:
    """A completion pinned to one rank (vLLM's X-data-parallel-rank header); its token ids."""
    headers = {"Content-Type": "application/json", "X-data-parallel-rank": str(rank)}
    data = json.dumps({"model": srv.model, "return_token_ids": True, **body}).encode()
    req = urllib.request.Request(f"{srv.url}/v1/completions", data=data, headers=headers)
    with urllib.request.urlopen(req, timeout=600) as r:
        return token_ids(json.loads(r.read()))


def test_every_process_registered_the_same_row_and_shims(dp2):
    found = list(REGISTERED.finditer(dp2.log_text()))
    seen = {m.group(1): (m.group(3), m.group(4)) for m in found}
    settings_given = {m.group(1): m.group(5) for m in found}
    want = {f"EngineCore_DP{r}" for r in range(RANKS)} | {f"ApiServer_{r}" for r in range(RANKS)}
    assert want <= set(seen), (sorted(seen), dp2.log_tail())
    assert len({seen[p] for p in want}) == 1, seen  # one registration text (row, backend) and one fingerprint
    assert f"MaxText {INSTALLED} via backend 'native'" in seen["EngineCore_DP0"][0]
    written = re.findall(r"\((EngineCore_DP\d) pid=\d+\).*engine fingerprint (\w+) written", dp2.log_text())
    assert {e for e, _ in written} == {f"EngineCore_DP{r}" for r in range(RANKS)}, written
    assert {d for _, d in written} == {seen["EngineCore_DP0"][1]}
    assert all("strict=False" in settings_given[p] for p in want), settings_given  # from the config, in all four


def test_16_concurrent_clients_get_the_references_tokens_on_both_ranks(dp2, reference):
    from maxtext_compat.testing import real_model as rm

    before = per_engine(dp2, SUCCESS)
    # One request per client: each takes longer than the 1 s window, so the 16 are sent at once and none again.
    got = load_run(dp2.url, dp2.model, list(rm.PROMPTS), reference.greedy, clients=CLIENTS, seconds=1.0,
                   tokens=TOKENS)  # fmt: skip
    served = served_since(dp2, before, CLIENTS)
    print(f"\n[dp2] {got.summary()}; served per engine {served}", file=sys.stderr)
    assert not got.errors and not got.wrong and len(got.latencies) == CLIENTS, (got.summary(), got.wrong[:2])
    assert sorted(served) == [str(r) for r in range(RANKS)] and all(n > 0 for n in served.values()), served
    assert sum(served.values()) == CLIENTS, served


def test_a_seed_gives_the_same_text_on_either_rank(dp2):
    texts: dict[tuple[int, int], list[int]] = {}
    for seed in (1, 2):
        for rank in range(RANKS):
            before = per_engine(dp2, SUCCESS)
            body = {"prompt": "Seattle is a", "max_tokens": 8, "temperature": 0.8, "seed": seed}
            texts[seed, rank] = _on_rank(dp2, rank, body)
            served = served_since(dp2, before, 1)
            assert served == {str(r): float(r == rank) for r in range(RANKS)}, f"pinned to rank {rank}: {served}"
    assert texts[1, 0] == texts[1, 1] and texts[2, 0] == texts[2, 1], texts
    assert texts[1, 0] != texts[2, 0], texts  # the seed decides the text: two seeds, two texts


def test_a_client_that_leaves_mid_stream_leaves_the_server_serving(dp2, reference):
    body = {"model": dp2.model, "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "stream": True}
    assert len(list(cf.sse_events(dp2.url, "/v1/completions", body, stop_after=2))) == 2  # then hang up
    deadline, running = time.monotonic() + 120, {}
    while time.monotonic() < deadline:
        running = per_engine(dp2, "vllm:num_requests_running")
        if sum(running.values()) == 0 and sum(per_engine(dp2, "vllm:kv_cache_usage_perc").values()) == 0:
            break
        time.sleep(1)
    else:
        pytest.fail(f"the left request still holds an engine: {running}")
    for rank in range(RANKS):  # both ranks still serve, right
        greedy = {"prompt": "Seattle is a", "max_tokens": 4, "temperature": 0}
        assert _on_rank(dp2, rank, greedy) == reference.greedy[0][:4]
    assert dp2.alive()


@pytest.mark.extended
def test_load_run_16_clients_for_60_s_on_two_ranks(dp2, reference):
    from maxtext_compat.testing import real_model as rm

    before = per_engine(dp2, SUCCESS)
    got = load_run(dp2.url, dp2.model, list(rm.PROMPTS), reference.greedy, clients=CLIENTS, seconds=60.0,
                   tokens=TOKENS)  # fmt: skip
    served = served_since(dp2, before, len(got.latencies))
    print(f"\n[dp2 load run] {got.summary()}; served per engine {served}", file=sys.stderr)
    assert got.latencies and not got.errors and not got.wrong, (got.summary(), got.wrong[:2], got.errors[:2])
    assert len(served) == RANKS and all(n > 0 for n in served.values()) and dp2.alive(), served
