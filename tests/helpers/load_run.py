"""A load run against an OpenAI-compatible server: N concurrent `openai` clients for a bounded time.

Why one place: `make bench` (benchmarks/bench_serving.py: throughput and latency beside the peer) and
`make test-extended` (tests/compat/test_serving_load.py: every answer right, none lost) run the same load, so the
figures the bench table shows are those of the run the test checks.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field


@dataclass
class LoadResult:
    """What a load run saw: each answer's latency, the wrong ones (prompt index, tokens), the lost ones."""

    latencies: list[float] = field(default_factory=list)
    wrong: list[tuple[int, list[int]]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0
    tokens: int = 0  # per answer

    @property
    def tokens_per_s(self) -> float:
        return len(self.latencies) * self.tokens / self.wall

    @property
    def requests_per_s(self) -> float:
        return len(self.latencies) / self.wall

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    def summary(self) -> str:
        pct = ", ".join(f"p{round(q * 100)} {self.percentile(q):.2f} s" for q in (0.5, 0.9, 0.99))
        return (f"{len(self.latencies)} answers ({len(self.wrong)} wrong, {len(self.errors)} lost) in "
                f"{self.wall:.0f} s: {self.tokens_per_s:.1f} tokens/s, {self.requests_per_s:.2f} requests/s, "
                f"latency {pct}")  # fmt: skip


async def _load(url: str, model: str, prompts: list[str], want: list[list[int]], clients: int, seconds: float,
                tokens: int) -> LoadResult:  # fmt: skip
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    out = LoadResult(tokens=tokens)
    stop_at = time.monotonic() + seconds

    async def one_client(c: int) -> None:
        i = c
        while time.monotonic() < stop_at:
            k = i % len(prompts)
            t0 = time.monotonic()
            try:
                got = await client.completions.create(model=model, prompt=prompts[k], max_tokens=tokens,
                                                      temperature=0, extra_body={"return_token_ids": True})  # fmt: skip
            except Exception as exc:  # a lost answer is a finding: counted, reported
                out.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            else:
                out.latencies.append(time.monotonic() - t0)
                if got.choices[0].token_ids != want[k]:
                    out.wrong.append((k, list(got.choices[0].token_ids or [])))
            i += clients

    t0 = time.monotonic()
    await asyncio.gather(*(one_client(c) for c in range(clients)))
    out.wall = time.monotonic() - t0
    await client.close()
    return out


def load_run(url: str, model: str, prompts: list[str], want: list[list[int]], *, clients: int, seconds: float,
             tokens: int) -> LoadResult:  # fmt: skip
    """`clients` clients send `prompts` round robin (greedy, `tokens` each) until `seconds` have passed; every
    answer is compared with `want` (the reference's tokens of the same prompt)."""
    return asyncio.run(_load(url, model, prompts, want, clients, seconds, tokens))
