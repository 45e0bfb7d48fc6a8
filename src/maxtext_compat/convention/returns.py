"""Helpers the kinds' returns use: the scan-carry protocol, scanned stacks, logits from a hidden state.

Why here and not by looking at the result: MaxText 0.1.0's generic DecoderLayer returns the
2-tuple (y, y) unscanned while Llama returns a bare y, and after #2616 every layer returns a
2-tuple, so a result's length says nothing about its convention. The matrix row (does the
release take kv_cache?) and the module's own config (scanned?) decide.
"""

from __future__ import annotations

from typing import Any


def is_scan_carry(inputs: Any) -> bool:
    """The 0.2.2+ scan protocol: layers called with (y, stacked_kv_caches, layer_index)."""
    return isinstance(inputs, tuple) and len(inputs) == 3


def scanned(module: Any) -> bool:
    return bool(getattr(getattr(module, "config", None), "scan_layers", False))


def logits_from_hidden(transformer: Any, hidden: Any, model_mode: str | None = None, embedder: Any = None) -> Any:
    """Final norm + output head on the pre-norm hidden state (what MaxText's vLLM adapter does); a tied head
    reads its table from `embedder` when given (a served model's rounded copy), else the model's own."""
    mode = model_mode or getattr(transformer, "model_mode", "train")
    decoder = transformer.decoder
    shared = transformer.token_embedder if embedder is None else embedder
    try:
        head = decoder.apply_output_head  # 0.2.x
    except AttributeError:  # 0.1.0: a private method, reached through the ToNNX bridge
        return decoder._apply_output_head(shared, hidden, True)
    return head(shared, hidden, True, mode)
