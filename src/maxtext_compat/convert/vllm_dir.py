"""The files vLLM reads from a model directory: config.json, tokenizer files, generation config.

Why these and no weights: vLLM picks the architecture (`MaxTextForCausalLM`), sizes the KV cache
and loads the tokenizer from the directory; the weights come from MaxText's checkpoint, named in
`maxtext_config.json` beside them (what `maxtext-compat serve` passes as `--additional-config`).
Pure Python apart from `tokenizers` (the Tokenizer object writes its own tokenizer.json).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from maxtext_compat.convert.maxtext_tree import Shape
from maxtext_compat.serving.model_dir import MAXTEXT_CONFIG, hf_config

# The lengths a server runs with come from its command (--max-model-len, maxtext_config), not the model.
LENGTH_KEYS = ("max_target_length", "max_prefill_predict_length")


def dump(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def model_config(shape: Shape, maxtext: dict[str, Any]) -> dict[str, Any]:
    """config.json: the MaxText model's sizes in transformers' Llama names, plus RoPE and special tokens."""
    out = hf_config(maxtext)
    out.update(
        rope_theta=shape.rope_theta,
        max_position_embeddings=shape.context_length,
        bos_token_id=shape.bos_token_id,
        eos_token_id=shape.eos_token_id,
    )
    return out


def token_text(tokenizer: Any, token_id: int | None) -> str | None:
    return None if token_id is None else tokenizer.id_to_token(token_id)


def write_tokenizer(out: Path, tokenizer: Any, shape: Shape, *, chat_template: str | None) -> None:
    """tokenizer.json (the `tokenizers` object's own file) and tokenizer_config.json for transformers."""
    tokenizer.save(str(out / "tokenizer.json"))
    cfg: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token_text(tokenizer, shape.bos_token_id),
        "eos_token": token_text(tokenizer, shape.eos_token_id),
        "model_max_length": shape.context_length,
        "clean_up_tokenization_spaces": False,
    }
    if chat_template:
        cfg["chat_template"] = chat_template
    dump(out / "tokenizer_config.json", cfg)


def set_chat_template(out: Path, chat_template: str | None) -> None:
    """Put `chat_template` into the tokenizer_config.json a model directory's conversion copied (made if absent),
    and drop a copied chat_template.jinja, which transformers would read in its place."""
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    cfg["chat_template"] = chat_template
    dump(path, cfg)
    (out / "chat_template.jinja").unlink(missing_ok=True)


def write_model_files(out: Path, shape: Shape, maxtext: dict[str, Any], load_parameters_path: str | None) -> None:
    """config.json, generation_config.json and maxtext_config.json (the keys `serve` passes to MaxText)."""
    dump(out / "config.json", model_config(shape, maxtext))
    special = {"bos_token_id": shape.bos_token_id, "eos_token_id": shape.eos_token_id}
    gen = {k: v for k, v in special.items() if v is not None}
    dump(out / "generation_config.json", gen)
    served = {k: v for k, v in maxtext.items() if k not in LENGTH_KEYS}  # scan_layers as the checkpoint was written
    if load_parameters_path:
        served["load_parameters_path"] = load_parameters_path
    dump(out / MAXTEXT_CONFIG, served)
