"""Is a greedy token that differs from the reference's explained by the arithmetic? (the TPU tier's SmolLM2 check)

Why: float32 on a TPU (and MaxText's bfloat16 embedding table) moves logits by a measurable amount; where the
reference's two best tokens are closer than that, the chip may pick the other one, and every later step then sees
another context. So two decodes are compared up to each prompt's first differing token, and a difference counts as
explained only when the reference's logit gap between its token and ours at that step is below the logit error
measured where the two agreed (all prompts' agreeing steps: the chip's error level in this very run). The gap is at
least the reference's top-2 margin, so an explained difference also has its top-2 margin below the error; a token
the reference ranks far down is never explained. Plain Python over anything with `.tolist()` or lists (the unit
environment has no numpy): tests/unit/test_token_margin.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Divergence:
    prompt: int
    step: int
    ours: int  # our token at `step`
    reference: int  # the reference's token there
    top2_margin: float  # the reference's best logit minus its second best
    gap: float  # the reference's logit of its token minus its logit of ours (>= top2_margin)


@dataclass(frozen=True)
class Verdict:
    logit_error: float  # max |ours - reference| over every step whose inputs and token agreed (nan: none did)
    compared_steps: int  # how many (prompt, step) pairs that error was measured on
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.divergences

    @property
    def explained(self) -> bool:
        """Equal token for token, or every first difference has its reference gap below the measured error."""
        return all(d.gap < self.logit_error for d in self.divergences)  # nan error: never explained

    def report(self) -> str:
        head = f"logit error {self.logit_error:.3g} over {self.compared_steps} agreeing steps"
        if self.identical:
            return f"{head}; every token equal"
        rows = [
            f"prompt {d.prompt} step {d.step}: ours {d.ours} vs reference {d.reference}, reference top-2 margin "
            f"{d.top2_margin:.3g}, gap to ours {d.gap:.3g} ({'below' if d.gap < self.logit_error else 'NOT below'}"
            f" the error)"
            for d in self.divergences
        ]
        return "; ".join([head, *rows])

    def as_dict(self) -> dict[str, object]:
        return {
            "logit_error": self.logit_error,
            "compared_steps": self.compared_steps,
            "identical": self.identical,
            "explained": self.explained,
            "divergences": [d.__dict__ for d in self.divergences],
        }


def chosen_rows(logits: Any, prompt_len: int, new: int) -> list[Any]:
    """The rows of one causal forward over prompt + tokens that chose tokens 0..new-1 (judge takes them per prompt)."""
    import numpy as np

    return [np.asarray(logits[prompt_len - 1 + k]) for k in range(new)]


def judge(
    ours: Sequence[Sequence[int]],
    reference: Sequence[Sequence[int]],
    our_logits: Sequence[Sequence[Any]],
    reference_logits: Sequence[Sequence[Any]],
) -> Verdict:
    """ours[i][k] / reference[i][k]: token k of prompt i; *_logits[i][k]: the vocabulary's logits that chose it.

    The reference's logits must be those of the reference's own context (prompt + reference[i][:k]), which equals
    ours up to the first difference; nothing after it is compared."""
    if len(ours) != len(reference) or len(our_logits) != len(ours) or len(reference_logits) != len(ours):
        raise ValueError(f"{len(ours)} prompts of ours, {len(reference)} of the reference: logits for each needed")
    worst, compared = float("nan"), 0
    divergences = []
    for i, (mine, theirs) in enumerate(zip(ours, reference, strict=True)):
        if len(mine) != len(theirs):
            raise ValueError(f"prompt {i}: {len(mine)} tokens of ours vs {len(theirs)} of the reference")
        for k, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            ref = _floats(reference_logits[i][k])
            if a != b:
                second, first = sorted(ref)[-2:]
                divergences.append(Divergence(i, k, int(a), int(b), first - second, ref[b] - ref[a]))
                break
            mine_k = _floats(our_logits[i][k])
            if len(mine_k) != len(ref):
                raise ValueError(f"prompt {i} step {k}: {len(mine_k)} logits of ours vs {len(ref)} of the reference")
            err = max(abs(x - y) for x, y in zip(mine_k, ref, strict=True))
            worst = err if compared == 0 else max(worst, err)
            compared += 1
    return Verdict(worst, compared, divergences)


def _floats(row: Any) -> list[float]:
    return [float(x) for x in (row.tolist() if hasattr(row, "tolist") else row)]
