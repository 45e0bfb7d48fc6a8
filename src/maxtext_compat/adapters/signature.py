"""The signatures adapters advertise: the installed release's own, plus every release's extras.

Why a union: old callers pass parameters later releases dropped (`page_state`), new callers
pass parameters old releases never had (`kv_cache`, `out_sharding`). The adapter accepts
both, translates what it can and rejects the rest with a typed error. Introspecting
consumers (tpu-inference's `supports_kw`) must see `kv_cache` / `attention_metadata`, so
the union is also what `inspect.signature` reports.
"""

from __future__ import annotations

import inspect
from typing import Any

KINDS: tuple[str, ...] = ("attention", "decoder_layer", "decoder", "transformer")
# The matrix row's class keys and the kind each is (decoder layers are listed per family, not here).
CLASS_KINDS: tuple[tuple[str, str], ...] = (
    ("attention", "attention"),
    ("mla", "attention"),
    ("decoder", "decoder"),
    ("nnx_decoder", "decoder"),
    ("transformer", "transformer"),
    ("transformer_linen", "transformer"),
)

# Every keyword parameter the kind has had in any release (from the wheels of 0.1.0 .. 0.2.5).
UNION_PARAMS: dict[str, tuple[str, ...]] = {
    "attention": (
        "inputs_positions", "decoder_segment_ids", "out_sharding", "model_mode", "deterministic", "previous_chunk",
        "slot", "page_state", "bidirectional_mask", "rope_kwargs", "kv_cache", "attention_metadata", "shared_key",
        "shared_value",
    ),
    "decoder_layer": (
        "previous_chunk", "slot", "page_state", "bidirectional_mask", "kv_cache", "attention_metadata",
    ),
    "decoder": (
        "decoder_segment_ids", "deterministic", "model_mode", "previous_chunk", "slot", "page_state",
        "bidirectional_mask", "image_embeddings", "image_masks", "audio_embeddings", "audio_masks",
        "multimodal_input", "kv_caches", "attention_metadata", "deepstack_visual_embeds",
    ),
    "transformer": (
        "decoder_segment_ids", "cache", "encoder_images", "encoder_image_masks", "encoder_videos",
        "encoder_video_masks", "encoder_video_grid_thw", "encoder_audios", "enable_dropout", "model_mode",
        "previous_chunk", "true_length", "slot", "page_state", "decoder_target_tokens", "decoder_target_mask",
        "kv_caches", "attention_metadata",
    ),
}  # fmt: skip

# Positional slots a later release added: a caller of that release passes them positionally.
POSITIONAL_SLOTS: dict[str, tuple[str, ...]] = {
    "attention": ("inputs_q", "inputs_kv", "inputs_positions", "decoder_segment_ids", "out_sharding"),
}

# The parameters whose presence makes a call a "new" (vLLM) call.
NEW_PARAMS: dict[str, tuple[str, str]] = {
    "attention": ("kv_cache", "attention_metadata"),
    "decoder_layer": ("kv_cache", "attention_metadata"),
    "decoder": ("kv_caches", "attention_metadata"),
    "transformer": ("kv_caches", "attention_metadata"),
}

# Positional parameters that identify a kind when the class is not in the matrix row.
KIND_MARKERS: dict[str, tuple[str, ...]] = {
    "attention": ("inputs_q", "inputs_kv"),
    "decoder_layer": ("inputs", "decoder_segment_ids", "decoder_positions"),
    "decoder": ("shared_embedding", "decoder_input_tokens"),
    "transformer": ("decoder_input_tokens", "decoder_positions"),
}


def native_signature(fn: Any) -> inspect.Signature:
    """Signature of an unbound `__call__` without `self`."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return sig.replace(parameters=params, return_annotation=inspect.Signature.empty)


def kind_from_signature(sig: inspect.Signature) -> str | None:
    names = list(sig.parameters)
    if names[:2] == ["inputs_q", "inputs_kv"]:
        return "attention"
    if names[:3] == ["inputs", "decoder_segment_ids", "decoder_positions"]:
        return "decoder_layer"
    if names[:2] == ["shared_embedding", "decoder_input_tokens"]:
        return "decoder"
    if names[:2] == ["decoder_input_tokens", "decoder_positions"]:
        return "transformer"
    return None


def advertised_signature(native: inspect.Signature, kind: str) -> inspect.Signature:
    """The native parameters as they are, then the union's missing ones as keyword-only `= None`."""
    params = list(native.parameters.values())
    var_kw = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
    params = [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]
    positional = [p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    slots = POSITIONAL_SLOTS.get(kind, ())
    for i, name in enumerate(slots):
        if name not in positional and positional[:i] == list(slots[:i]):
            # e.g. out_sharding, Attention's 5th positional parameter from 0.2.0 on: keep the slot on 0.1.0
            params.insert(i, inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None))
            positional.insert(i, name)
    have = {p.name for p in params}
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None)
        for name in UNION_PARAMS[kind]
        if name not in have
    ]
    return native.replace(parameters=[*params, *extra, *var_kw])
