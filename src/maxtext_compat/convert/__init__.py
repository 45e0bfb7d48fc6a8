"""Checkpoint conversion: a GGUF file (Llama family or Gemma 3) or Hugging Face directory -> MaxText and vLLM.

    from maxtext_compat import convert
    result = convert.convert("model.gguf", "out/")   # vLLM model dir + MaxText checkpoint (all or nothing)
    ckpt = convert.read_gguf("model.gguf")           # a Llama-family file: Hugging Face-named float32 tensors + shape
    flat = convert.to_maxtext(ckpt)                   # {path: array} for serving.param_trees.load_params
    cfg_overrides = convert.maxtext_overrides(ckpt.shape)

Importing this package imports neither jax nor MaxText (gguf and tokenizers load on use).
"""

from __future__ import annotations

from maxtext_compat.convert.gguf_llama import LlamaCheckpoint, LlamaShape, read_gguf
from maxtext_compat.convert.gguf_tokenizer import tokenizer_from_gguf
from maxtext_compat.convert.hf_dir import read_hf_dir
from maxtext_compat.convert.job import ConversionResult, convert, read_source
from maxtext_compat.convert.maxtext_tree import maxtext_overrides, to_maxtext

__all__ = [
    "ConversionResult",
    "LlamaCheckpoint",
    "LlamaShape",
    "convert",
    "maxtext_overrides",
    "read_gguf",
    "read_hf_dir",
    "read_source",
    "to_maxtext",
    "tokenizer_from_gguf",
]
