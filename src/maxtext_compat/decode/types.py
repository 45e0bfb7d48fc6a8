"""What a generation run returns, shared by the paged and the dense path (pure python + numpy).

Why one record type for both paths: the demo and the tests compare them step by step (same
prompts, same number of steps, logits per prompt in the caller's order), so both produce the
same structure and `compare` needs no knowledge of how either was computed.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from maxtext_compat.contract import PositiveInt, checked
from maxtext_compat.errors import InvalidArgumentError, InvalidArgumentTypeError

StepKind = Literal["prefill", "decode"]


@checked
@dataclass(frozen=True)
class Buckets:
    """Padded sizes of the paged step: one compiled shape per bucket.

    max_num_tokens: token rows of the prefill step (>= the prompts' total length);
    decode_tokens: token rows of a decode step, None = max_num_tokens (one shape for both
    phases: on CPU the kernel compiles in 2.5-10 s per shape and runs a padded decode in
    ~0.15 s, so sharing the prefill bucket is cheaper than a second compile);
    max_num_seqs: sequence slots; pages_per_seq: block-table row length.
    """

    max_num_tokens: PositiveInt
    max_num_seqs: PositiveInt
    pages_per_seq: PositiveInt
    decode_tokens: PositiveInt | None = None  # None: max_num_tokens

    @property
    def decode_rows(self) -> int:
        return self.decode_tokens if self.decode_tokens is not None else self.max_num_tokens


@checked
@dataclass(frozen=True)
class StepRecord:
    """One model call: logits per prompt (caller order, [new tokens, vocab]) and the next tokens."""

    kind: StepKind
    logits: tuple[Any, ...]
    tokens: tuple[int, ...]
    seconds: float


@checked
@dataclass
class Generation:
    """Greedy generation of a batch of prompts: 1 prefill step, then decode steps.

    tokens()[i] are the ids generated for prompts[i]: one per step (the prefill's argmax first).
    compile_seconds / compiles: time and number of the calls that compiled (each was run once
    more, so `seconds` of every step is a warm call). caches/pages/layout: the paged path's final KV
    caches and each prompt's pages, for read-back (None/empty for the dense path).
    """

    path: str
    prompts: tuple[tuple[int, ...], ...]
    steps: list[StepRecord] = field(default_factory=list)
    compile_seconds: float = 0.0
    compiles: int = 0  # calls that compiled (traced, lowered or built an executable)
    caches: list[Any] | None = None
    pages: tuple[tuple[int, ...], ...] = ()
    layout: Any = None

    def tokens(self) -> list[list[int]]:
        return [[step.tokens[i] for step in self.steps] for i in range(len(self.prompts))]

    def kv_len(self, i: int) -> int:
        """Tokens of prompt i in the cache after the run (the last generated token is not fed)."""
        return len(self.prompts[i]) + len(self.steps) - 1

    def ms_per_step(self, kind: StepKind = "decode") -> float:
        """Median warm time of the steps of `kind`, in milliseconds (nan when there are none)."""
        times = [s.seconds for s in self.steps if s.kind == kind]
        return 1000.0 * statistics.median(times) if times else float("nan")


def check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int | None = None) -> tuple[tuple[int, ...], ...]:
    """Prompts as tuples of ints; typed errors for empty batches, empty prompts or ids out of range."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise InvalidArgumentTypeError(
            "prompts is a list of token-id lists",
            argument="prompts",
            found=type(prompts).__name__,
            fix="tokenize first and pass a list of token-id lists, e.g. [[1, 2, 3]] for one prompt",
        )
    if not prompts:
        raise InvalidArgumentError(
            "no prompts to generate from",
            argument="prompts",
            found="[]",
            fix="pass at least one prompt (a non-empty list of token ids)",
        )
    out = []
    for i, p in enumerate(prompts):
        ids = tuple(int(t) for t in p)
        if not ids:
            raise InvalidArgumentError(
                "a prompt needs at least one token", argument=f"prompts[{i}]", found="[]",
                fix="drop empty prompts or start them with a BOS id",
            )  # fmt: skip
        bad = [t for t in ids if t < 0 or (vocab_size is not None and t >= vocab_size)]
        if bad:
            raise InvalidArgumentError(
                "token ids out of the vocabulary",
                argument=f"prompts[{i}]",
                expected=f"ids in [0, {vocab_size})",
                found=bad[:5],
                fix="token ids are >= 0"
                if vocab_size is None
                else f"tokenize with the model's tokenizer (vocab_size={vocab_size}) or raise vocab_size in the config",
            )
        out.append(ids)
    return tuple(out)


def check_force(
    force: Sequence[Sequence[int]] | None, prompts: tuple[tuple[int, ...], ...], num_steps: int
) -> tuple[tuple[int, ...], ...] | None:
    """Teacher-forced inputs: force[i][k] is fed at decode step k+1 instead of the greedy token."""
    if force is None:
        return None
    rows = tuple(tuple(int(t) for t in f) for f in force)
    if len(rows) != len(prompts) or any(len(r) < num_steps for r in rows):
        raise InvalidArgumentError(
            "force needs one row of at least num_steps tokens per prompt",
            argument="force",
            expected=f"{len(prompts)} rows of >= {num_steps} ids",
            found=[len(r) for r in rows],
            fix="pass another run's tokens(), or None for greedy feeding",
        )
    return rows


def next_inputs(step: StepRecord, force: tuple[tuple[int, ...], ...] | None, k: int) -> list[int]:
    """The token each prompt feeds at decode step k+1: the greedy one, or the forced one."""
    if force is None:
        return list(step.tokens)
    return [row[k] for row in force]
