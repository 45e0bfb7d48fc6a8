"""Greedy decoding with MaxText's own dense path: the old call, train mode, the growing sequence.

Why this reference: it involves no KV cache at all, only the release's own attention over the
whole sequence, so equal greedy tokens (and logits within float32 noise) show the paged path
computes what the model computes. Fixed shapes: every step runs the same padded [prompts,
seq_len] batch (causal attention keeps the zero padding after a sequence out of its logits),
so the whole decode compiles once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from maxtext_compat import names
from maxtext_compat.contract import checked
from maxtext_compat.decode.timing import TraceCountingJit, timed_call
from maxtext_compat.decode.types import Generation, StepRecord, check_force, check_prompts, next_inputs
from maxtext_compat.errors import InvalidArgumentError
from maxtext_compat.paged.layout import align

TRAIN = names.TRAIN


def _forward(graphdef: Any, state: Any, tokens: Any, positions: Any, segments: Any) -> Any:
    from flax import nnx

    model = nnx.merge(graphdef, state)
    return model(tokens, positions, decoder_segment_ids=segments, enable_dropout=False)


@checked
def check_dense_model(model: Any) -> None:
    """Typed error unless `model` computes logits over a whole sequence (train mode, no vLLM attention)."""
    cfg = model.config
    mode = str(getattr(model, "model_mode", TRAIN))
    if cfg.attention == "vllm_rpa" or mode != TRAIN:
        raise InvalidArgumentError(
            "the dense reference needs a train-mode model whose attention is not vllm_rpa",
            argument="model",
            expected="model_mode 'train' and attention 'dot_product' (or another dense kernel)",
            found=f"model_mode {mode!r}, attention {cfg.attention!r}",
            fix="build a twin from a non-vLLM config with maxtext_compat.testing.tiny.dense_twin(model, config)",
        )


@checked
def dense_greedy(
    model: Any,
    prompts: Sequence[Sequence[int]],
    num_steps: int,
    *,
    seq_len: int | None = None,
    force: Sequence[Sequence[int]] | None = None,
    context: Callable[[], AbstractContextManager[Any]] | None = None,
) -> Generation:
    """Greedy generation recomputing the whole sequence each step (old call, train mode).

    Same steps and record as PagedEngine.generate: step 0 returns the logits of every prompt
    position, step k the logits at the position of the token fed at step k.
    seq_len: the padded sequence length (default: longest prompt + num_steps, rounded up to 8).
    """
    from flax import nnx

    check_dense_model(model)
    cfg = model.config
    prompts_t = check_prompts(prompts, int(cfg.vocab_size))
    forced = check_force(force, prompts_t, num_steps)
    need = max(len(p) for p in prompts_t) + num_steps
    length = seq_len if seq_len is not None else align(need, 8)
    if length < need:
        raise InvalidArgumentError(
            "seq_len is shorter than the longest prompt plus the generated tokens",
            argument="seq_len",
            expected=f">= {need}",
            found=length,
            fix=f"pass seq_len >= {need}, or leave it out (None) to size it from the prompts and num_steps",
        )
    if context is None:
        from maxtext_compat.resolution.installed import mesh_context

        context = lambda: mesh_context(cfg, model.mesh)  # noqa: E731
    n = len(prompts_t)
    tokens = np.zeros((n, length), np.int32)
    lengths = [len(p) for p in prompts_t]
    for i, p in enumerate(prompts_t):
        tokens[i, : len(p)] = p
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (n, length))
    segments = np.ones((n, length), np.int32)
    import functools

    graphdef, state = nnx.split(model)
    forward = TraceCountingJit(functools.partial(_forward, graphdef))  # closed over: some GraphDefs are unhashable
    gen = Generation("dense", prompts_t)
    for k in range(num_steps + 1):
        if k:
            feed = next_inputs(gen.steps[-1], forced, k - 1)
            for i in range(n):
                tokens[i, lengths[i]] = feed[i]
                lengths[i] += 1
        with context():
            logits, seconds, compile_s = timed_call(forward, state, tokens, positions, segments)
        host = np.asarray(logits)
        rows = tuple(host[i, : lengths[i]] if k == 0 else host[i, lengths[i] - 1 : lengths[i]] for i in range(n))
        chosen = tuple(int(np.argmax(r[-1])) for r in rows)
        gen.steps.append(StepRecord("prefill" if k == 0 else "decode", rows, chosen, seconds))
        gen.compile_seconds += compile_s
        gen.compiles += compile_s > 0
    return gen
