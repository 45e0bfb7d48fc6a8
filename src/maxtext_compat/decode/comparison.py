"""Paged vs dense, prompt by prompt: the rows of the demo's table.

Why stop at the first differing token: after the two paths pick different tokens they feed
different inputs, and later logits are no longer comparable; the row says so (tokens_match
False) instead of reporting a meaningless difference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from maxtext_compat.contract import PositiveInt, checked
from maxtext_compat.decode.types import Generation
from maxtext_compat.errors import InvalidArgumentError


@checked
@dataclass(frozen=True)
class ComparisonRow:
    prompt: tuple[int, ...]
    paged_tokens: tuple[int, ...]
    dense_tokens: tuple[int, ...]
    max_abs_logits_diff: float  # over the steps whose inputs agree
    tokens_match: bool
    paged_ms_per_step: float
    dense_ms_per_step: float


@checked
def max_logits_diff(a: Generation, b: Generation, i: int) -> float:
    """max |logits_a - logits_b| of prompt i over the steps up to the first differing token."""
    worst = 0.0
    for sa, sb in zip(a.steps, b.steps, strict=False):
        worst = max(worst, float(np.max(np.abs(np.asarray(sa.logits[i]) - np.asarray(sb.logits[i])))))
        if sa.tokens[i] != sb.tokens[i]:
            break
    return worst


@checked
def compare(paged: Generation, dense: Generation) -> list[ComparisonRow]:
    if paged.prompts != dense.prompts or len(paged.steps) != len(dense.steps):
        raise InvalidArgumentError(
            "the two runs differ in prompts or number of steps",
            argument="dense",
            expected=f"{len(paged.prompts)} prompts, {len(paged.steps)} steps",
            found=f"{len(dense.prompts)} prompts, {len(dense.steps)} steps",
            fix="run both paths on the same prompts with the same num_steps (and the same force, if any)",
        )
    pt, dt = paged.tokens(), dense.tokens()
    return [
        ComparisonRow(
            prompt=p,
            paged_tokens=tuple(pt[i]),
            dense_tokens=tuple(dt[i]),
            max_abs_logits_diff=max_logits_diff(paged, dense, i),
            tokens_match=pt[i] == dt[i],
            paged_ms_per_step=paged.ms_per_step("decode"),
            dense_ms_per_step=dense.ms_per_step("decode"),
        )
        for i, p in enumerate(paged.prompts)
    ]


@checked
def format_table(rows: Sequence[ComparisonRow], *, max_prompt: PositiveInt = 8) -> str:
    """A markdown table: prompt, generated ids, max |Δ logits| vs dense, ms/step of both paths."""
    lines = [
        "| prompt | generated ids (paged) | same as dense | max \\|Δ logits\\| | paged ms/step | dense ms/step |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        prompt = " ".join(map(str, r.prompt[:max_prompt])) + (" …" if len(r.prompt) > max_prompt else "")
        lines.append(
            f"| {prompt} ({len(r.prompt)}) | {' '.join(map(str, r.paged_tokens))} | {'yes' if r.tokens_match else 'NO'}"
            f" | {r.max_abs_logits_diff:.1e} | {r.paged_ms_per_step:.1f} | {r.dense_ms_per_step:.1f} |"
        )
    return "\n".join(lines)
