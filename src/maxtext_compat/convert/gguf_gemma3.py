"""A Gemma 3 GGUF file as Hugging Face-layout float32 tensors plus every Gemma 3 fact a config needs.

Why a module of its own: Gemma 3 differs from Llama exactly where this project's attention path
does — five local sliding-window layers to one global layer, a RoPE base per kind, a query scale,
q/k norms, four norms per layer, a tied embedding scaled by sqrt(hidden). The sizes, the window and
the global RoPE base are read from the file's metadata and are required (a missing one is a typed
error). Two facts llama.cpp's own gemma3 loader fixes for the architecture rather than reading
(`llama-model.cpp`: `set_swa_pattern(6)`, `rope_freq_base_train_swa = 10000`) are taken from
`ARCHITECTURE_FACTS` unless the file states them; the query scale is llama.cpp's rule for
every Gemma 3 size but the 27B (1/sqrt(key_length)), and a file it does not cover is refused.
Norm weights: llama.cpp stores Gemma's `1 + w`; the Hugging Face layout holds `w` (as transformers
reads it), so both layouts are exact views of one file and MaxText's tree adds the 1 back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from maxtext_compat.contract import FiniteFloat, PositiveInt, checked
from maxtext_compat.convert.gguf_llama import check_tensors, hf_tensor_name, metadata_value
from maxtext_compat.errors import InvalidArgumentError

ARCHITECTURE = "gemma3"
# llama.cpp's gemma3 loader fixes these for the architecture; a file that states them wins.
ARCHITECTURE_FACTS = {"attention.sliding_window_pattern": 6, "rope.freq_base_swa": 10000.0}
MAXTEXT_PATTERN = 6  # MaxText's GEMMA3_ATTENTION_PATTERN: five LOCAL_SLIDING layers, then one GLOBAL


@checked
@dataclass(frozen=True)
class Gemma3Shape:
    """A Gemma 3 text model's hyper-parameters, as its GGUF metadata states them (see the module docstring)."""

    layers: PositiveInt
    hidden: PositiveInt
    mlp: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    vocab: PositiveInt
    rope_theta: FiniteFloat
    local_rope_theta: FiniteFloat
    sliding_window: PositiveInt
    sliding_window_pattern: PositiveInt
    query_pre_attn_scalar: FiniteFloat
    rms_eps: FiniteFloat
    attn_logit_softcap: FiniteFloat
    final_logit_softcap: FiniteFloat
    context_length: PositiveInt
    bos_token_id: int | None
    eos_token_id: int | None
    add_bos_token: bool
    tied_embeddings: bool = True

    def layer_is_global(self, index: int) -> bool:
        """Whether layer `index` attends globally (the last of every `sliding_window_pattern` layers)."""
        return (index + 1) % self.sliding_window_pattern == 0


@checked
@dataclass(frozen=True)
class Gemma3Checkpoint:
    """Hugging Face-named float32 tensors (transformers' Gemma3ForCausalLM names) and their shape."""

    shape: Gemma3Shape
    tensors: dict[str, np.ndarray]
    source: str


def _required(reader: Any, key: str, where: str) -> Any:
    value = metadata_value(reader, key)
    if value is None:
        raise InvalidArgumentError(
            f"{where} does not state a fact a Gemma 3 model needs",
            argument=key,
            expected="the key in the GGUF metadata (convert_hf_to_gguf writes it for Gemma 3)",
            found="absent",
            fix="convert the model again with a current llama.cpp convert_hf_to_gguf.py",
        )
    return value


def read_gemma3_shape(reader: Any, where: str = "the GGUF file") -> Gemma3Shape:
    """Every Gemma 3 fact from the metadata; refused where MaxText's gemma3 decoder cannot hold the model."""
    a = ARCHITECTURE

    def req(key: str) -> Any:
        return _required(reader, f"{a}.{key}", where)

    def arch_fact(key: str) -> Any:
        value = metadata_value(reader, f"{a}.{key}")
        return ARCHITECTURE_FACTS[key] if value is None else value

    key_length, value_length = int(req("attention.key_length")), int(req("attention.value_length"))
    hidden, heads, layers = int(req("embedding_length")), int(req("attention.head_count")), int(req("block_count"))
    pattern = int(arch_fact("attention.sliding_window_pattern"))
    problems: list[tuple[str, object, object]] = []
    if key_length != value_length:
        problems.append(("attention.value_length", f"= key_length {key_length}", value_length))
    if pattern != MAXTEXT_PATTERN:
        problems.append(("attention.sliding_window_pattern", MAXTEXT_PATTERN, pattern))
    if layers == 62:  # the 27B: llama.cpp scales queries by 1/sqrt(hidden / heads), not 1/sqrt(key_length)
        problems.append(("block_count", "a Gemma 3 size scaled by 1/sqrt(key_length) (1B, 4B, 12B, 270M)", layers))
    scaling = metadata_value(reader, f"{a}.rope.scaling.type")
    if scaling not in (None, "none"):
        problems.append(("rope.scaling.type", "none (Gemma 3 270M/1B)", scaling))
    if problems:
        key, want, found = problems[0]
        raise InvalidArgumentError(
            f"{where}: MaxText's gemma3 decoder cannot hold this model as converted here",
            argument=f"{a}.{key}",
            expected=str(want),
            found=str(found),
            fix="convert a Gemma 3 270M, 1B, 4B or 12B text model without RoPE scaling",
        )
    tokens = _required(reader, "tokenizer.ggml.tokens", where)
    bos = metadata_value(reader, "tokenizer.ggml.bos_token_id")
    eos = metadata_value(reader, "tokenizer.ggml.eos_token_id")
    names = {t.name for t in reader.tensors}
    return Gemma3Shape(
        layers=layers,
        hidden=hidden,
        mlp=int(req("feed_forward_length")),
        heads=heads,
        kv_heads=int(req("attention.head_count_kv")),
        head_dim=key_length,
        vocab=len(tokens),
        rope_theta=float(req("rope.freq_base")),
        local_rope_theta=float(arch_fact("rope.freq_base_swa")),
        sliding_window=int(req("attention.sliding_window")),
        sliding_window_pattern=pattern,
        query_pre_attn_scalar=float(key_length),
        rms_eps=float(req("attention.layer_norm_rms_epsilon")),
        attn_logit_softcap=float(metadata_value(reader, f"{a}.attn_logit_softcapping") or 0.0),
        final_logit_softcap=float(metadata_value(reader, f"{a}.final_logit_softcapping") or 0.0),
        context_length=int(req("context_length")),
        bos_token_id=None if bos is None else int(bos),
        eos_token_id=None if eos is None else int(eos),
        add_bos_token=bool(metadata_value(reader, "tokenizer.ggml.add_bos_token")),
        tied_embeddings="output.weight" not in names,
    )


NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
# GGUF tensor name (per layer: blk.{i}.X) -> transformers' Gemma3ForCausalLM state-dict name
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def hf_name(gguf_name: str) -> str | None:
    return hf_tensor_name(gguf_name, _GLOBAL, _LAYER)


def expected_shapes(shape: Gemma3Shape) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor of a Gemma 3 model of `shape`, with its shape (out, in)."""
    h, hd = shape.hidden, shape.head_dim
    q, kv = shape.heads * hd, shape.kv_heads * hd
    out = {"model.embed_tokens.weight": (shape.vocab, h), "model.norm.weight": (h,)}
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        out |= {p + f"{norm}.weight": (h,) for norm in NORMS}
        out |= {
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_proj.weight": (shape.mlp, h),
            p + "mlp.up_proj.weight": (shape.mlp, h),
            p + "mlp.down_proj.weight": (h, shape.mlp),
        }
    return out


def gemma3_checkpoint_from_reader(reader: Any, p: Path) -> Gemma3Checkpoint:
    """Every tensor dequantized (the gguf library: K-quants included), named and shaped as transformers reads
    them; norms as `w` (the file's value minus 1). No q/k permutation: Gemma's RoPE is llama.cpp's NEOX kind."""
    from gguf.quants import dequantize

    shape = read_gemma3_shape(reader, str(p))
    if not shape.tied_embeddings:
        raise InvalidArgumentError(
            f"{p} has an output head of its own",
            argument="output.weight",
            expected="absent (Gemma 3 ties the output head to the embedding)",
            found="present",
            fix="convert an unmodified Gemma 3 GGUF file",
        )
    tensors: dict[str, np.ndarray] = {}
    unknown = []
    for t in reader.tensors:
        hf = hf_name(t.name)
        if hf is None:
            unknown.append(t.name)
            continue
        array = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        tensors[hf] = array - np.float32(1.0) if hf.endswith("norm.weight") else array
    check_tensors(tensors, expected_shapes(shape), where=str(p), extra=unknown)
    return Gemma3Checkpoint(shape, tensors, str(p))
