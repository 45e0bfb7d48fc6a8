"""Greedy decoding without vLLM: the reference a served model's tokens are compared with.

Why this shape: MaxText's own dense forward (train mode, dot-product attention, no KV cache) is
run on the growing sequence (prompt + tokens so far) and the last position's argmax is taken,
`steps` times. Sequences are right-padded to one fixed length so the forward compiles once; with
causal attention the padding cannot influence the positions that are read.

The loop is pure Python over whatever `logits_fn` returns (anything with `.tolist()` or nested
lists), so it is unit-tested without jax.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from maxtext_compat.contract import checked
from maxtext_compat.errors import InvalidArgumentError

LogitsFn = Callable[[list[list[int]]], Any]


def _argmax(row: Sequence[float]) -> int:
    best, best_i = None, 0
    for i, v in enumerate(row):
        if best is None or v > best:
            best, best_i = v, i
    return best_i


@checked
def greedy_decode(
    logits_fn: LogitsFn, prompts: Sequence[Sequence[int]], steps: int, *, length: int, pad_id: int = 0
) -> list[list[int]]:
    """`steps` greedy tokens for each prompt, with every forward over (batch, `length`) tokens."""
    if steps < 1 or not prompts:
        raise InvalidArgumentError(
            "greedy_decode needs prompts and at least one step",
            argument="steps/prompts",
            expected="steps >= 1 and a non-empty prompt list",
            found=f"steps={steps}, {len(prompts)} prompts",
            fix="pass at least one prompt (a list of token ids) and steps >= 1",
        )
    longest = max(len(p) for p in prompts)
    if longest + steps - 1 > length:
        raise InvalidArgumentError(
            "the padded length is too short for prompt + generated tokens",
            argument="length",
            expected=f">= {longest + steps - 1}",
            found=length,
            fix="pass a larger length (the model's max_target_length)",
        )
    seqs = [list(p) for p in prompts]
    out: list[list[int]] = [[] for _ in prompts]
    for _ in range(steps):
        batch = [s + [pad_id] * (length - len(s)) for s in seqs]
        logits = logits_fn(batch)
        for i, s in enumerate(seqs):
            row = logits[i][len(s) - 1]  # only the read position leaves the array (a real vocabulary is 49k wide)
            tok = _argmax(row.tolist() if hasattr(row, "tolist") else row)
            s.append(tok)
            out[i].append(tok)
    return out
