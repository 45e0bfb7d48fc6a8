"""A vLLM model directory (config.json only) describing a MaxText model.

Why: vLLM reads `config.json` (through transformers) to pick the architecture, size the KV cache
(layers, KV heads, head_dim) and the vocabulary; the weights come from MaxText. With no model hub,
tests and `maxtext-compat serve --tiny` write one whose numbers are the MaxText config's, with
`"architectures": ["MaxTextForCausalLM"]` and a `model_type` transformers knows (llama), so no
remote code is needed. Pure Python.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from maxtext_compat.errors import InvalidArgumentError

ARCH = "MaxTextForCausalLM"
# Written by `maxtext-compat convert` beside config.json: the MaxText keys `serve` passes as maxtext_config.
MAXTEXT_CONFIG = "maxtext_config.json"
# MaxText config key -> config.json key
KEY_MAP: dict[str, str] = {
    "base_emb_dim": "hidden_size",
    "base_num_query_heads": "num_attention_heads",
    "base_num_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "base_mlp_dim": "intermediate_size",
    "base_num_decoder_layers": "num_hidden_layers",
    "vocab_size": "vocab_size",
    "max_target_length": "max_position_embeddings",
}


def hf_config(maxtext: Mapping[str, Any], *, model_type: str = "llama") -> dict[str, Any]:
    """config.json content for a MaxText model given by its (base_*) config values."""
    missing = [k for k in KEY_MAP if k not in maxtext]
    if missing:
        raise InvalidArgumentError(
            "cannot describe the model for vLLM: MaxText sizes are missing",
            argument="maxtext",
            expected=f"values for {list(KEY_MAP)}",
            found=f"missing {missing}",
            fix="pass the tiny model's sizes, or provide your own model directory with config.json",
        )
    out: dict[str, Any] = {"architectures": [ARCH], "model_type": model_type}
    for mt_key, hf_key in KEY_MAP.items():
        out[hf_key] = int(maxtext[mt_key])
    out["torch_dtype"] = str(maxtext.get("dtype", "float32"))
    out["rms_norm_eps"] = float(maxtext.get("normalization_layer_epsilon", 1e-5))
    out["tie_word_embeddings"] = bool(maxtext.get("logits_via_embedding", False))
    return out


def write_model_dir(path: str, maxtext: Mapping[str, Any], **kw: Any) -> str:
    """Create `path` (if needed) with config.json for `maxtext`; returns the directory."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(hf_config(maxtext, **kw), f, indent=2, sort_keys=True)
        f.write("\n")
    return path
