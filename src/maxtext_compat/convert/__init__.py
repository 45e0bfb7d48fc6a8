"""Checkpoint conversion: a Llama-family GGUF file -> MaxText's parameter tree and tokenizer.

    from maxtext_compat import convert
    ckpt = convert.read_gguf("model.gguf")           # Hugging Face-named float32 tensors + shape
    flat = convert.to_maxtext(ckpt)                   # {path: array} for weights.load_params
    cfg_overrides = convert.maxtext_overrides(ckpt.shape)

Importing this package imports neither jax nor MaxText (gguf and tokenizers load on use).
"""

from __future__ import annotations

from maxtext_compat.convert.gguf_llama import LlamaCheckpoint, LlamaShape, read_gguf
from maxtext_compat.convert.gguf_tokenizer import tokenizer_from_gguf
from maxtext_compat.convert.maxtext_tree import maxtext_overrides, to_maxtext

__all__ = ["LlamaCheckpoint", "LlamaShape", "maxtext_overrides", "read_gguf", "to_maxtext", "tokenizer_from_gguf"]
