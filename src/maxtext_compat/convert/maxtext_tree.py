"""Hugging Face Llama tensors -> the flat MaxText parameter tree (`weights.load_params` places it).

Why these transposes and the query scale: MaxText stores dense kernels (in, out) split per head
((emb, heads, head_dim) for q/k/v, (heads, head_dim, emb) for the output), and folds the softmax's
1/sqrt(head_dim) into the query projection (its dot-product and RPA paths both use sm_scale=1), as
MaxText's own Llama checkpoint converters do. Both 0.1.0 and 0.2.x name an unscanned Llama decoder
the same way (see weights.py). Llama 3.1 (MaxText's interleaved llama3.1 RoPE) gets its q/k head dimensions
interleaved; Qwen 3 keeps its query unscaled (its decoder applies 1/sqrt(head_dim) after the query norm) and its
q/k norm scales as they are (convert.hf_families; MaxText's param_mapping does the same for both).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from maxtext_compat.contract import checked
from maxtext_compat.convert.gguf_gemma3 import Gemma3Checkpoint, Gemma3Shape
from maxtext_compat.convert.gguf_llama import LlamaCheckpoint, LlamaShape
from maxtext_compat.convert.hf_families import family_overrides, interleaved
from maxtext_compat.convert.maxtext_gemma3 import gemma3_overrides, gemma3_to_maxtext

Checkpoint = LlamaCheckpoint | Gemma3Checkpoint  # one per family convert reads (chosen by general.architecture)
Shape = LlamaShape | Gemma3Shape


@checked
def maxtext_overrides(shape: Shape) -> dict[str, Any]:
    """The MaxText config keys that describe a model of `shape` (llama2, qwen3 or gemma3 decoder, unscanned)."""
    if isinstance(shape, Gemma3Shape):
        return gemma3_overrides(shape)
    return {
        "decoder_block": "llama2",
        "base_emb_dim": shape.hidden,
        "base_mlp_dim": shape.mlp,
        "base_num_query_heads": shape.heads,
        "base_num_kv_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "base_num_decoder_layers": shape.layers,
        "vocab_size": shape.vocab,
        "rope_max_timescale": int(shape.rope_theta),
        "normalization_layer_epsilon": shape.rms_eps,
        "logits_via_embedding": shape.tied_embeddings,
        "normalize_embedding_logits": False,
        "mlp_activations": ["silu", "linear"],
        "enable_dropout": False,
        "scan_layers": False,
        **family_overrides(shape.qk_norm, shape.rope_scaling, shape.tied_embeddings),
    }


@checked
def to_maxtext(ckpt: Checkpoint) -> dict[str, np.ndarray]:
    """The flat {path: array} tree of an unscanned MaxText decoder (llama2 or gemma3) holding `ckpt`'s weights."""
    if isinstance(ckpt, Gemma3Checkpoint):
        return gemma3_to_maxtext(ckpt)
    s, t = ckpt.shape, ckpt.tensors
    h, hd = s.hidden, s.head_dim
    out = {
        "token_embedder/embedding": t["model.embed_tokens.weight"],
        "decoder/decoder_norm/scale": t["model.norm.weight"],
    }
    if not s.tied_embeddings:
        out["decoder/logits_dense/kernel"] = t["lm_head.weight"].T
    for i in range(s.layers):
        src, dst = f"model.layers.{i}.", f"decoder/layers_{i}/"
        q = t[src + "self_attn.q_proj.weight"].T.reshape(h, s.heads, hd)
        k = t[src + "self_attn.k_proj.weight"].T.reshape(h, s.kv_heads, hd)
        if s.rope_scaling == "llama3":
            q, k = interleaved(q), interleaved(k)
        if s.qk_norm:
            out |= {dst + "self_attention/query_norm/scale": t[src + "self_attn.q_norm.weight"],
                    dst + "self_attention/key_norm/scale": t[src + "self_attn.k_norm.weight"]}  # fmt: skip
        else:
            q = q / np.sqrt(hd)
        out |= {
            dst + "pre_self_attention_layer_norm/scale": t[src + "input_layernorm.weight"],
            dst + "post_self_attention_layer_norm/scale": t[src + "post_attention_layernorm.weight"],
            dst + "self_attention/query/kernel": q.astype(np.float32),
            dst + "self_attention/key/kernel": k,
            dst + "self_attention/value/kernel": t[src + "self_attn.v_proj.weight"].T.reshape(h, s.kv_heads, hd),
            dst + "self_attention/out/kernel": t[src + "self_attn.o_proj.weight"].T.reshape(s.heads, hd, h),
            dst + "mlp/wi_0/kernel": t[src + "mlp.gate_proj.weight"].T,
            dst + "mlp/wi_1/kernel": t[src + "mlp.up_proj.weight"].T,
            dst + "mlp/wo/kernel": t[src + "mlp.down_proj.weight"].T,
        }
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}
