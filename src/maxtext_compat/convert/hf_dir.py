"""A Hugging Face Llama-family or Qwen 3 model directory (config.json + *.safetensors) as float32 tensors.

Why the same `LlamaCheckpoint` as the GGUF reader: both sources then go through one MaxText tree
builder and one shape check, so a safetensors checkpoint is refused or converted exactly as a GGUF
one is. The shape comes from config.json (transformers' LlamaConfig keys and defaults); what Llama 3.1 (RoPE
scaling) and Qwen 3 (query/key norms) add is read, or refused, by convert.hf_families.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from maxtext_compat.contract import checked
from maxtext_compat.convert.gguf_llama import LlamaCheckpoint, LlamaShape, check_tensors, expected_shapes
from maxtext_compat.convert.hf_families import check_supported, rope
from maxtext_compat.errors import InvalidArgumentError

MODEL_TYPES = ("llama", "qwen3")


def _config(path: Path) -> dict[str, Any]:
    file = path / "config.json"
    if not file.is_file():
        raise InvalidArgumentError(
            "no config.json in the model directory",
            argument="path",
            expected="a Hugging Face model directory with config.json and *.safetensors",
            found=str(path),
            fix="pass the directory save_pretrained() wrote (or a .gguf file)",
        )
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(
            "config.json is not valid JSON", argument=str(file), expected="a JSON object", found=str(exc),
            fix="repair or re-save the model directory",
        ) from exc  # fmt: skip


def _token_id(value: Any) -> int | None:
    if isinstance(value, list):  # transformers allows a list of eos ids; the first is the primary one
        value = value[0] if value else None
    return None if value is None else int(value)


def shape_from_config(cfg: dict[str, Any], where: str = "config.json") -> LlamaShape:
    """The model's shape from transformers' LlamaConfig keys (its defaults where a key is absent)."""
    kind = cfg.get("model_type")
    if kind not in MODEL_TYPES:
        raise InvalidArgumentError(
            f"{where} describes a {kind!r} model",
            argument="model_type",
            expected=f"one of {list(MODEL_TYPES)} (a Llama-family or Qwen 3 model)",
            found=repr(kind),
            fix="convert a Llama-family model (Llama, Llama 3.1, SmolLM2, TinyLlama, ...) or a dense Qwen 3",
        )
    check_supported(cfg, where)
    theta, scaling = rope(cfg, where)
    try:
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        return LlamaShape(
            layers=int(cfg["num_hidden_layers"]),
            hidden=hidden,
            mlp=int(cfg["intermediate_size"]),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            vocab=int(cfg["vocab_size"]),
            rope_theta=theta,
            rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            context_length=int(cfg.get("max_position_embeddings", 2048)),
            bos_token_id=_token_id(cfg.get("bos_token_id")),
            eos_token_id=_token_id(cfg.get("eos_token_id")),
            qk_norm=kind == "qwen3",
            rope_scaling=scaling,
        )
    except KeyError as exc:
        raise InvalidArgumentError(
            f"{where} lacks a size the model needs",
            argument=str(exc.args[0]),
            expected="hidden_size, num_attention_heads, num_hidden_layers, intermediate_size, vocab_size",
            found=f"keys {sorted(cfg)[:12]}",
            fix="convert a complete Hugging Face model directory",
        ) from exc


@checked
def read_hf_dir(path: str | Path) -> LlamaCheckpoint:
    """Read every safetensors shard of a Llama-family model directory as float32; shapes checked."""
    from safetensors import safe_open

    p = Path(path)
    cfg = _config(p)
    shape = shape_from_config(cfg, str(p / "config.json"))
    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise InvalidArgumentError(
            "no *.safetensors files in the model directory",
            argument="path",
            expected="model.safetensors or model-0000k-of-0000n.safetensors",
            found=f"{p} with {sorted(x.name for x in p.iterdir())[:8]}",
            fix="save the model with safe_serialization=True (the default of save_pretrained)",
        )
    tensors: dict[str, np.ndarray] = {}
    for file in files:
        with safe_open(str(file), framework="np") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                tensors[name] = np.asarray(f.get_tensor(name), dtype=np.float32)
    head = tensors.get("lm_head.weight")
    if shape.tied_embeddings and head is not None:  # some writers keep the tied copy: only an equal one is dropped
        if not np.array_equal(head, tensors.get("model.embed_tokens.weight")):
            raise InvalidArgumentError(
                "config.json ties the embeddings but lm_head.weight differs from model.embed_tokens.weight",
                argument="lm_head.weight",
                expected="absent, or equal to model.embed_tokens.weight (tie_word_embeddings=true)",
                found="a different tensor",
                fix="set tie_word_embeddings=false in config.json if the model has its own output head",
            )
        del tensors["lm_head.weight"]
    extra = [k for k in tensors if k.endswith("rotary_emb.inv_freq")]  # older transformers saved the RoPE table
    for k in extra:
        del tensors[k]
    check_tensors(tensors, expected_shapes(shape), where=str(p))
    return LlamaCheckpoint(shape, tensors, str(p))
