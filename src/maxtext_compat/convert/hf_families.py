"""What a Hugging Face config adds to a plain Llama, read as MaxText's configs can hold it: Llama 3.1's RoPE scaling
and Qwen 3's query/key norms.

Why refuse rather than approximate: MaxText's `llama3.1` RoPE (layers/embeddings.py, LLaMARotaryEmbedding) fixes the
scaling's constants in code (factor 8, low/high frequency factors 1 and 4, an original context of 8192), and its
Llama and Qwen 3 decoders have no attention or MLP biases and only SwiGLU; a config asking for anything else would
convert to a model that silently computes something else, so each is a typed error naming the key.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from maxtext_compat.errors import InvalidArgumentError

# LLaMARotaryEmbedding._apply_scaling_factor's constants (MaxText 0.1.0 to 0.2.5)
MAXTEXT_LLAMA3_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192}  # fmt: skip
ROPE_TYPES = ("default", "llama3")
QWEN3_MODEL = {True: "qwen3-4b", False: "qwen3-8b"}  # MaxText's model file by tie_word_embeddings, as the seed's
LLAMA31_MODEL = "llama3.1-8b"


def rope(cfg: dict[str, Any], where: str) -> tuple[float, str]:
    """(rope_theta, scaling) of a config: scaling is "none" or "llama3". transformers 5 writes `rope_parameters`
    (rope_theta inside), earlier releases and Meta's files `rope_scaling` beside `rope_theta`."""
    key = "rope_parameters" if isinstance(cfg.get("rope_parameters"), dict) else "rope_scaling"
    params = cfg.get(key) or {}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise InvalidArgumentError(
            f"{where} asks for RoPE scaling MaxText's config cannot hold",
            argument=f"{key}.rope_type",
            expected=f"one of {list(ROPE_TYPES)} (MaxText's default and llama3.1 RoPE)",
            found=repr(kind),
            fix="convert a model with Llama 3.1's scaling or none; MaxText's yarn RoPE is not mapped from this key",
        )
    if kind == "default":
        return theta, "none"
    for name, want in MAXTEXT_LLAMA3_SCALING.items():
        if float(params.get(name, float("nan"))) != want:
            raise InvalidArgumentError(
                f"{where}'s llama3 RoPE scaling differs from the constants MaxText fixes",
                argument=f"{key}.{name}",
                expected=f"{want} (MaxText's LLaMARotaryEmbedding: {MAXTEXT_LLAMA3_SCALING})",
                found=repr(params.get(name, "absent")),
                fix="only Llama 3.1's own scaling converts; MaxText has no key for other factors",
            )
    return theta, "llama3"


def check_supported(cfg: dict[str, Any], where: str) -> None:
    """Refuse the config keys MaxText's Llama and Qwen 3 decoders cannot hold."""
    refused = {
        "attention_bias": (bool(cfg.get("attention_bias", False)), "false (MaxText's decoders have no q/k/v biases)"),
        "mlp_bias": (bool(cfg.get("mlp_bias", False)), "false (MaxText's MLP has no biases)"),
        "hidden_act": (cfg.get("hidden_act", "silu") != "silu", "'silu' (MaxText's SwiGLU: silu, linear)"),
        "use_sliding_window": (bool(cfg.get("use_sliding_window", False)), "false (no Qwen sliding window)"),
    }
    for key, (bad, expected) in refused.items():
        if bad:
            raise InvalidArgumentError(
                f"{where} has a feature MaxText's decoder cannot hold",
                argument=key,
                expected=expected,
                found=repr(cfg.get(key)),
                fix="convert a model without it (the Llama, Llama 3.1 and Qwen 3 dense families)",
            )


def family_overrides(qk_norm: bool, rope_scaling: str, tied: bool) -> dict[str, Any]:
    """The MaxText keys that pick the family's model file (its facts) beside the sizes: Qwen 3's decoder with its
    q/k norms, or Llama 3.1's RoPE; nothing for a plain Llama."""
    if qk_norm:
        return {"model_name": QWEN3_MODEL[tied], "override_model_config": True, "decoder_block": "qwen3",
                "use_qk_norm": True}  # fmt: skip
    if rope_scaling == "llama3":
        return {"model_name": LLAMA31_MODEL, "override_model_config": True, "rope_use_scale": True}
    return {}


def interleaved(w: np.ndarray) -> np.ndarray:
    """A (..., head_dim) kernel from Hugging Face's rotate-half order to MaxText's interleaved llama3.1 RoPE
    (pairs 2i, 2i+1 = i, i + head_dim/2), as MaxText's own converter does (param_mapping.adjust_rope)."""
    half = w.shape[-1] // 2
    return np.stack([w[..., :half], w[..., half:]], axis=-1).reshape(w.shape)
