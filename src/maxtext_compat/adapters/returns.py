"""Turn what the installed release returned into the caller's convention.

Why here and not by looking at the result: MaxText 0.1.0's generic DecoderLayer returns the
2-tuple (y, y) unscanned while Llama returns a bare y, and after #2616 every layer returns a
2-tuple, so a result's length says nothing about its convention. The matrix row (does the
release take kv_cache?) and the module's own config (scanned?) decide.
"""

from __future__ import annotations

from typing import Any

from maxtext_compat.matrix import MaxTextRow


def is_scan_carry(inputs: Any) -> bool:
    """The 0.2.2+ scan protocol: layers called with (y, stacked_kv_caches, layer_index)."""
    return isinstance(inputs, tuple) and len(inputs) == 3


def scanned(module: Any) -> bool:
    return bool(getattr(getattr(module, "config", None), "scan_layers", False))


def old_return(kind: str, row: MaxTextRow, module: Any, result: Any) -> Any:
    """The pre-#2616 return: Attention out, layer y (scanned: (y, None)), Decoder (logits, hidden), logits."""
    if not row.has_kv_params:
        return result  # the release's own convention: bit for bit
    if kind == "attention":
        return result[0]
    if kind == "decoder_layer":
        return result if scanned(module) else result[0]
    if kind == "decoder":
        return result[0], result[1]
    if kind == "transformer":
        if isinstance(result, tuple):  # attention="vllm_rpa": MaxText returns (hidden, kv_caches)
            return logits_from_hidden(module, result[0])
        return result
    raise AssertionError(kind)


def new_return(kind: str, row: MaxTextRow, module: Any, result: Any) -> Any:
    """The post-#2616 return of a natively new-convention release."""
    if kind == "attention":
        return result[0], result[1]
    if kind == "decoder_layer":
        return result
    if kind == "decoder":
        return result[0], result[1], result[2]
    if kind == "transformer":
        if not isinstance(result, tuple):
            return result
        return result[0], result[1]
    raise AssertionError(kind)


def logits_from_hidden(transformer: Any, hidden: Any, model_mode: str | None = None) -> Any:
    """Final norm + output head on the pre-norm hidden state (what MaxText's vLLM adapter does)."""
    mode = model_mode or getattr(transformer, "model_mode", "train")
    decoder = transformer.decoder
    try:
        head = decoder.apply_output_head  # 0.2.x
    except AttributeError:  # 0.1.0: a private method, reached through the ToNNX bridge
        return decoder._apply_output_head(transformer.token_embedder, hidden, True)
    return head(transformer.token_embedder, hidden, True, mode)
