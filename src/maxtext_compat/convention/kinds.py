"""The four kinds of MaxText layer the call rule serves, each carrying its own behaviour.

Why a table of objects and not `if kind == ...` chains: what differs between an Attention, a
decoder layer, the Decoder and the Transformer (the name of its KV argument, whether it takes one
cache or one per layer, its parameters across releases) is one fact per kind; keeping each kind's
facts on one object means a new kind is one edit (the model is transformers' cache layers, which
carry their own update rules). What each release returns is not here: the kinds reshape results by
name from the row's `returns:` (matrix.returns), so a changed return is an edit of compat_matrix.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from maxtext_compat.convention.returns import logits_from_hidden, scanned
from maxtext_compat.errors import InvalidArgumentError
from maxtext_compat.matrix import MaxTextRow
from maxtext_compat.matrix.returns import caller_shape, shape_of

KindName = Literal["attention", "decoder_layer", "decoder", "transformer"]
METADATA = "attention_metadata"


@dataclass(frozen=True)
class Kind:
    """One layer kind: its KV argument, its parameters in any release, and its returns."""

    name: KindName
    kv_name: str  # the KV argument a new call names ("kv_cache", or "kv_caches" for one per layer)
    markers: tuple[str, ...]  # leading positional parameters that identify the kind from a signature
    union_params: tuple[str, ...]  # every keyword parameter the kind has had in any release (0.1.0 .. 0.2.5)
    positional_slots: tuple[str, ...] = ()  # positional slots a later release added (passed positionally)

    @property
    def per_layer(self) -> bool:
        """Whether the KV argument is a list with one cache per decoder layer."""
        return self.kv_name == "kv_caches"

    @property
    def new_params(self) -> tuple[str, str]:
        """The parameters whose presence makes a call a new (vLLM) call."""
        return self.kv_name, METADATA

    @property
    def is_model(self) -> bool:
        """The whole model: its new return is (hidden, kv_caches), and only under a vLLM attention mode."""
        return False

    @property
    def runs_kernel(self) -> bool:
        """Its op calls the attention kernel: on a written call the layer itself runs in train mode (MaxText's
        own KV-cache variables untouched) and MLA, which has no paged path, is refused."""
        return False

    @property
    def takes_scan_carry(self) -> bool:
        """Under scan (MaxText 0.2.2+) its first input may be the carry `(y, stacked_kv, idx)`, which is neither
        convention and passes through."""
        return False

    def caches(self, kv: Any) -> list[Any]:
        """The caches a call hands over, as a list (one entry for a single-cache kind)."""
        return list(kv) if self.per_layer and kv is not None else [kv]

    def old_return(self, row: MaxTextRow, module: Any, result: Any, where: str) -> Any:
        """The pre-#2616 return, from what a release that takes KV arguments returned (`row.returns`)."""
        return row.return_shape(self.name).reshape(result, caller_shape(self.name, new=False), where)

    def new_return(self, row: MaxTextRow, result: Any, where: str) -> Any:
        """The post-#2616 return of a natively new-convention release, as a fresh tuple of its `returns:` values."""
        shape = row.return_shape(self.name)
        return shape.reshape(result, shape, where)

    def new_shape(self, row: MaxTextRow, result: Any, kv: Any, where: str) -> Any:
        """An old-convention release's return (`row.returns`) in the new convention, with `kv` as its KV result."""
        new = caller_shape(self.name, new=True)
        return row.return_shape(self.name).reshape(result, new, where, **{new.kv_name: kv})


class _Attention(Kind):
    @property
    def runs_kernel(self) -> bool:
        return True


class _DecoderLayer(Kind):
    @property
    def takes_scan_carry(self) -> bool:
        return True

    def old_return(self, row: MaxTextRow, module: Any, result: Any, where: str) -> Any:
        if scanned(module):  # the scan's (carry, None): no convention of its own, passed as MaxText returns it
            return result
        return super().old_return(row, module, result, where)

    def new_shape(self, row: MaxTextRow, result: Any, kv: Any, where: str) -> Any:
        # MaxText 0.1.0's generic DecoderLayer returns (y, y) unscanned and a scanned layer (y, None), where its
        # row (and Llama's layer) say y: the first value is y in every case.
        y = result[0] if isinstance(result, tuple) and row.return_shape(self.name).bare else result
        return super().new_shape(row, y, kv, where)


class _Decoder(Kind):
    pass


class _Transformer(Kind):
    """Returns logits, or (hidden, kv_caches) when its config selects a vLLM attention mode (`transformer_vllm`)."""

    VLLM = "transformer_vllm"

    @property
    def is_model(self) -> bool:
        return True

    def old_return(self, row: MaxTextRow, module: Any, result: Any, where: str) -> Any:
        if isinstance(result, tuple):  # a vLLM attention mode: the old caller wants logits
            hidden = row.return_shape(self.VLLM).reshape(result, shape_of("hidden"), where)
            return logits_from_hidden(module, hidden)
        return result

    def new_return(self, row: MaxTextRow, result: Any, where: str) -> Any:
        if isinstance(result, tuple):
            shape = row.return_shape(self.VLLM)
            return shape.reshape(result, shape, where)
        return result

    def new_shape(self, row: MaxTextRow, result: Any, kv: Any, where: str) -> Any:
        raise ValueError("no new shape for a transformer call")  # built from the KV session's hidden state


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        _Attention(
            "attention", "kv_cache", markers=("inputs_q", "inputs_kv"),
            union_params=(
                "inputs_positions", "decoder_segment_ids", "out_sharding", "model_mode", "deterministic",
                "previous_chunk", "slot", "page_state", "bidirectional_mask", "rope_kwargs", "kv_cache",
                "attention_metadata", "shared_key", "shared_value",
            ),
            positional_slots=("inputs_q", "inputs_kv", "inputs_positions", "decoder_segment_ids", "out_sharding"),
        ),
        _DecoderLayer(
            "decoder_layer", "kv_cache", markers=("inputs", "decoder_segment_ids", "decoder_positions"),
            union_params=(
                "previous_chunk", "slot", "page_state", "bidirectional_mask", "kv_cache", "attention_metadata",
            ),
        ),
        _Decoder(
            "decoder", "kv_caches", markers=("shared_embedding", "decoder_input_tokens"),
            union_params=(
                "decoder_segment_ids", "deterministic", "model_mode", "previous_chunk", "slot", "page_state",
                "bidirectional_mask", "image_embeddings", "image_masks", "audio_embeddings", "audio_masks",
                "multimodal_input", "kv_caches", "attention_metadata", "deepstack_visual_embeds",
            ),
        ),
        _Transformer(
            "transformer", "kv_caches", markers=("decoder_input_tokens", "decoder_positions"),
            union_params=(
                "decoder_segment_ids", "cache", "encoder_images", "encoder_image_masks", "encoder_videos",
                "encoder_video_masks", "encoder_video_grid_thw", "encoder_audios", "enable_dropout", "model_mode",
                "previous_chunk", "true_length", "slot", "page_state", "decoder_target_tokens",
                "decoder_target_mask", "kv_caches", "attention_metadata",
            ),
        ),
    )
}  # fmt: skip

# The matrix row's class keys and the kind each is (decoder layers are listed per family, not here).
CLASS_KINDS: tuple[tuple[str, KindName], ...] = (
    ("attention", "attention"),
    ("mla", "attention"),
    ("decoder", "decoder"),
    ("nnx_decoder", "decoder"),
    ("transformer", "transformer"),
    ("transformer_linen", "transformer"),
)


def kind_named(name: object) -> Kind:
    """The Kind named `name` (typed error naming the known kinds otherwise)."""
    found = KINDS.get(name) if isinstance(name, str) else None
    if found is None:
        raise InvalidArgumentError(
            "unknown kind",
            argument="kind",
            expected=f"one of {list(KINDS)}",
            found=repr(name),
            fix=f"pass kind= as one of {', '.join(map(repr, KINDS))} (e.g. kind='attention'), "
            "or leave it out to detect the kind from the class",
        )
    return found
