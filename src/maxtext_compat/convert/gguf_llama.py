"""A Llama-family GGUF file as Hugging Face-layout float32 tensors plus the facts a config needs.

Why through the Hugging Face layout: it is the one both a MaxText checkpoint and the independent
reference (transformers' LlamaForCausalLM) are built from, so a conversion error cannot hide in
a step the two share. llama.cpp stores q/k projections permuted for its interleaved RoPE
(convert_hf_to_gguf's `LlamaModel.permute`); `unpermute` undoes it. Hyper-parameters are read
from the file's metadata, never assumed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from maxtext_compat.contract import FiniteFloat, PositiveInt, checked
from maxtext_compat.errors import InvalidArgumentError, WeightsMismatchError

ARCHITECTURES = ("llama",)


@checked
@dataclass(frozen=True)
class LlamaShape:
    """The hyper-parameters of a Llama-family model, as its GGUF metadata states them."""

    layers: PositiveInt
    hidden: PositiveInt
    mlp: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    vocab: PositiveInt
    rope_theta: FiniteFloat
    rms_eps: FiniteFloat
    tied_embeddings: bool
    context_length: PositiveInt
    bos_token_id: int | None
    eos_token_id: int | None
    qk_norm: bool = False  # Qwen 3: an RMSNorm over head_dim on every query and key head
    rope_scaling: str = "none"  # "llama3": Llama 3.1's RoPE scaling (convert.hf_families)


def metadata_value(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def read_shape(reader: Any, path: str = "the GGUF file") -> LlamaShape:
    arch = metadata_value(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise InvalidArgumentError(
            f"{path} holds a {arch!r} model",
            argument="general.architecture",
            expected=f"one of {[*ARCHITECTURES, 'gemma3']} (a Llama-family or Gemma 3 model)",
            found=repr(arch),
            fix="convert a Llama-family GGUF (Llama, SmolLM2, TinyLlama, ...) or a Gemma 3 one",
        )
    names = {t.name for t in reader.tensors}
    heads = int(metadata_value(reader, f"{arch}.attention.head_count"))
    hidden = int(metadata_value(reader, f"{arch}.embedding_length"))
    head_dim = int(metadata_value(reader, f"{arch}.rope.dimension_count", hidden // heads))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(metadata_value(reader, f"{arch}.vocab_size", len(tokens.data) if tokens is not None else 0))
    bos = metadata_value(reader, "tokenizer.ggml.bos_token_id")
    eos = metadata_value(reader, "tokenizer.ggml.eos_token_id")
    return LlamaShape(
        layers=int(metadata_value(reader, f"{arch}.block_count")),
        hidden=hidden,
        mlp=int(metadata_value(reader, f"{arch}.feed_forward_length")),
        heads=heads,
        kv_heads=int(metadata_value(reader, f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        vocab=vocab,
        rope_theta=float(metadata_value(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_eps=float(metadata_value(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        tied_embeddings="output.weight" not in names,
        context_length=int(metadata_value(reader, f"{arch}.context_length", 2048)),
        bos_token_id=None if bos is None else int(bos),
        eos_token_id=None if eos is None else int(eos),
    )


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k permutation: rows (heads, 2, half) -> Hugging Face's (heads, half, 2)... order.

    convert_hf_to_gguf permutes `w.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2)`; the
    inverse reshapes the stored rows as (heads, half, 2) and swaps back.
    """
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# GGUF tensor name (per layer: blk.{i}.X) -> Hugging Face LlamaForCausalLM state-dict name
_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def hf_tensor_name(gguf_name: str, global_names: dict[str, str], layer_names: dict[str, str]) -> str | None:
    """A GGUF tensor's Hugging Face name by a family's tables (`blk.N.x` -> `model.layers.N.<layer_names[x]>`);
    None for a tensor the family does not have."""
    if gguf_name in global_names:
        return global_names[gguf_name]
    if gguf_name.startswith("blk."):
        _, index, rest = gguf_name.split(".", 2)
        if rest in layer_names:
            return f"model.layers.{int(index)}.{layer_names[rest]}"
    return None


def hf_name(gguf_name: str) -> str | None:
    return hf_tensor_name(gguf_name, _GLOBAL, _LAYER)


def expected_shapes(shape: LlamaShape) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor of a model of `shape`, with its shape (out, in)."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    out = {"model.embed_tokens.weight": (shape.vocab, h), "model.norm.weight": (h,)}
    if not shape.tied_embeddings:
        out["lm_head.weight"] = (shape.vocab, h)
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (shape.mlp, h),
            p + "mlp.up_proj.weight": (shape.mlp, h),
            p + "mlp.down_proj.weight": (h, shape.mlp),
        }
        if shape.qk_norm:
            out |= {p + "self_attn.q_norm.weight": (shape.head_dim,), p + "self_attn.k_norm.weight": (shape.head_dim,)}
    return out


@checked
@dataclass(frozen=True)
class LlamaCheckpoint:
    """Hugging Face-named float32 tensors and the shape they belong to."""

    shape: LlamaShape
    tensors: dict[str, np.ndarray]
    source: str


def _dequantized(reader: Any) -> Iterator[tuple[str, np.ndarray]]:
    from gguf.quants import dequantize

    for t in reader.tensors:
        yield t.name, np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)


@checked
def read_gguf(path: str | Path) -> LlamaCheckpoint:
    """Read and dequantize a Llama-family GGUF file; every tensor checked against the metadata's shape."""
    import gguf

    p = Path(path)
    if not p.is_file():
        raise InvalidArgumentError(
            "no GGUF file there", argument="path", expected="a .gguf file", found=str(p), fix="pass the .gguf path"
        )
    return checkpoint_from_reader(gguf.GGUFReader(str(p)), p)


def checkpoint_from_reader(reader: Any, p: Path) -> LlamaCheckpoint:
    """read_gguf's work on a `gguf.GGUFReader` of `p` the caller already opened (parsing the file's metadata, the
    tokenizer's 49k-entry vocabulary included, takes seconds: convert.job also reads the tokenizer from it)."""
    shape = read_shape(reader, str(p))
    tensors: dict[str, np.ndarray] = {}
    unknown = []
    for name, array in _dequantized(reader):
        hf = hf_name(name)
        if hf is None:
            unknown.append(name)
            continue
        if hf.endswith("q_proj.weight"):
            array = unpermute(array, shape.heads)
        elif hf.endswith("k_proj.weight"):
            array = unpermute(array, shape.kv_heads)
        tensors[hf] = array
    check_tensors(tensors, expected_shapes(shape), where=str(p), extra=unknown)
    return LlamaCheckpoint(shape, tensors, str(p))


def check_tensors(
    tensors: dict[str, np.ndarray], expected: dict[str, tuple[int, ...]], *, where: str, extra: Sequence[str] = ()
) -> None:
    """Every expected tensor present with its shape and nothing left over, or one error naming them all."""
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected)) + sorted(extra)
    wrong = [(k, expected[k], tuple(tensors[k].shape)) for k in sorted(set(expected) & set(tensors))
             if tuple(tensors[k].shape) != expected[k]]  # fmt: skip
    if missing or unexpected or wrong:
        first = wrong[0] if wrong else None
        raise WeightsMismatchError(
            f"{where} does not fit the model its metadata describes",
            missing=missing,
            extra=unexpected,
            mismatched=[(k, found, want) for k, want, found in wrong],
            argument=first[0] if first else (missing or unexpected)[0],
            expected=f"shape {first[1]}" if first else f"{len(expected)} tensors",
            found=f"shape {first[2]}" if first else f"missing {missing[:4]}, unexpected {unexpected[:4]}",
            fix="convert a complete checkpoint of one Llama-family model; a truncated or mixed file cannot load",
        )
