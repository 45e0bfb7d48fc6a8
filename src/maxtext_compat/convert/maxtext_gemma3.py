"""Hugging Face Gemma 3 tensors -> MaxText's gemma3 parameter tree and config keys.

Why these keys: MaxText ships no Gemma 3 270M config, so the conversion starts from its gemma3-4b
model file (`model_name`, whose query scale is 1/sqrt(head_dim), the 270M's too) and sets every
size and fact from the GGUF metadata with `override_model_config`. Why these tensors: as MaxText's
own Gemma 3 converter (checkpoint_conversion/utils/param_mapping.py) lays them out — norm scales
are `1 + w` (MaxText's RMSNorm multiplies by its scale), the embedding table is stored times
sqrt(hidden) (MaxText looks it up unscaled and divides the tied logits by sqrt(hidden):
normalize_embedding_logits), kernels are (in, out) split per head. The query is not pre-scaled:
MaxText's gemma3 Attention multiplies by query_pre_attn_scalar itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from maxtext_compat.contract import checked
from maxtext_compat.convert.gguf_gemma3 import Gemma3Checkpoint, Gemma3Shape

MODEL_NAME = "gemma3-4b"  # the MaxText model file whose gemma3 facts (query scale, norms) the 270M shares


@checked
def gemma3_overrides(shape: Gemma3Shape) -> dict[str, Any]:
    """The MaxText config keys that describe a Gemma 3 model of `shape` (unscanned)."""
    return {
        "model_name": MODEL_NAME,
        "override_model_config": True,
        "decoder_block": "gemma3",
        "base_emb_dim": shape.hidden,
        "base_mlp_dim": shape.mlp,
        "base_num_query_heads": shape.heads,
        "base_num_kv_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "base_num_decoder_layers": shape.layers,
        "vocab_size": shape.vocab,
        "rope_max_timescale": int(shape.rope_theta),
        "local_rope_max_timescale": int(shape.local_rope_theta),
        "rope_linear_scaling_factor": 1.0,
        "sliding_window_size": shape.sliding_window,
        "attn_logits_soft_cap": shape.attn_logit_softcap,
        "final_logits_soft_cap": shape.final_logit_softcap,
        "normalization_layer_epsilon": shape.rms_eps,
        "logits_via_embedding": True,
        "normalize_embedding_logits": True,
        "use_post_attn_norm": True,
        "use_post_ffw_norm": True,
        "mlp_activations": ["gelu", "linear"],
        "enable_dropout": False,
        "scan_layers": False,
    }


@checked
def gemma3_to_maxtext(ckpt: Gemma3Checkpoint) -> dict[str, np.ndarray]:
    """The flat {path: array} tree of an unscanned MaxText gemma3 decoder holding `ckpt`'s weights."""
    s, t = ckpt.shape, ckpt.tensors
    h, hd = s.hidden, s.head_dim
    one = np.float32(1.0)
    out = {
        "token_embedder/embedding": t["model.embed_tokens.weight"] * np.float32(np.sqrt(h)),
        "decoder/decoder_norm/scale": t["model.norm.weight"] + one,
    }
    norms = {
        "input_layernorm": "pre_self_attention_norm",
        "post_attention_layernorm": "post_self_attention_norm",
        "pre_feedforward_layernorm": "pre_ffw_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
        "self_attn.q_norm": "self_attention/query_norm",
        "self_attn.k_norm": "self_attention/key_norm",
    }
    for i in range(s.layers):
        src, dst = f"model.layers.{i}.", f"decoder/layers_{i}/"
        out |= {f"{dst}{m}/scale": t[f"{src}{n}.weight"] + one for n, m in norms.items()}
        out |= {
            dst + "self_attention/query/kernel": t[src + "self_attn.q_proj.weight"].T.reshape(h, s.heads, hd),
            dst + "self_attention/key/kernel": t[src + "self_attn.k_proj.weight"].T.reshape(h, s.kv_heads, hd),
            dst + "self_attention/value/kernel": t[src + "self_attn.v_proj.weight"].T.reshape(h, s.kv_heads, hd),
            dst + "self_attention/out/kernel": t[src + "self_attn.o_proj.weight"].T.reshape(s.heads, hd, h),
            dst + "mlp/wi_0/kernel": t[src + "mlp.gate_proj.weight"].T,
            dst + "mlp/wi_1/kernel": t[src + "mlp.up_proj.weight"].T,
            dst + "mlp/wo/kernel": t[src + "mlp.down_proj.weight"].T,
        }
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}
