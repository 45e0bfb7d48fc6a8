"""Small Qwen 3 and Llama 3.1 checkpoints written by transformers itself: the reference for the seed's other families.

Why written here: no small real Qwen 3 or Llama 3.1 checkpoint is installable (the registry has none), so the
reference must come from transformers' own `Qwen3ForCausalLM` and `LlamaForCausalLM`. Each model keeps the feature
its family adds (Qwen 3: per-head query/key RMSNorm, tied embeddings as qwen3-4b; Llama 3.1: `rope_scaling`
exactly as Llama-3.1-8B's config.json, rope_theta 500000) and the seed sizes' head counts and head_dim (32 query
heads, 8 key/value heads, head_dim 128) on a small width. The weights are drawn from a seeded numpy generator (not
torch's initializers, which change between releases) and scaled so greedy decoding is decisive; the tokenizer is a
byte-level BPE with no merges (the kind both families use) and the family's special tokens, built with `tokenizers`.
The directory is written once per spec and reader versions into the suite's cache folder, whole or absent.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maxtext_compat.errors import InvalidArgumentError

GENERATOR = 1  # bump when the weights or files written change for the same spec
VOCAB = 320  # 256 byte tokens, the family's special tokens, reserved tokens up to here
HIDDEN, MLP, LAYERS = 256, 512, 2  # small width and depth; heads and head_dim are the seed sizes'
SEED_HEADS = {"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}
LLAMA31_ROPE_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192}  # fmt: skip
EMBED_STD = 0.1  # the embedding's std: small beside the layers' outputs, so a tied model does not echo its input
GAIN = 1.0  # a linear layer's std is GAIN / sqrt(fan_in)
NORM_STD = 0.1  # norm weights are 1 + NORM_STD * N(0, 1)
FINAL_NORM = 16.0  # the final norm's weights are FINAL_NORM times that: logits of std ~FINAL_NORM * 16 * head scale
READERS = ("transformers", "tokenizers", "safetensors", "numpy")

LLAMA31_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
QWEN3_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class FamilySpec:
    """One family's small model: transformers' config keys, its special tokens and chat template (the turn format
    of the family's own template, without its tool and date preamble)."""

    name: str
    title: str
    model_type: str
    config: dict[str, Any]
    specials: tuple[str, ...]
    bos: str | None
    eos: str
    chat_template: str
    seed: int
    maxtext_model: str  # the MaxText model file whose family facts the conversion starts from
    extra: dict[str, Any] = field(default_factory=dict)


FAMILIES: dict[str, FamilySpec] = {
    "llama31": FamilySpec(
        name="llama31",
        title="Llama 3.1",
        model_type="llama",
        config={
            "rope_theta": 500000.0,
            "rope_scaling": LLAMA31_ROPE_SCALING,
            "rms_norm_eps": 1e-5,
            "max_position_embeddings": 131072,
            "tie_word_embeddings": False,
        },
        specials=("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
        chat_template=LLAMA31_TEMPLATE,
        seed=31,
        maxtext_model="llama3.1-8b",
    ),
    "qwen3": FamilySpec(
        name="qwen3",
        title="Qwen 3",
        model_type="qwen3",
        config={
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 40960,
            "tie_word_embeddings": True,
        },
        specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        bos=None,
        eos="<|im_end|>",
        chat_template=QWEN3_TEMPLATE,
        seed=3,
        maxtext_model="qwen3-4b",
    ),
}


def spec(name: str) -> FamilySpec:
    if name not in FAMILIES:
        raise InvalidArgumentError(
            "no small checkpoint of that family is written here",
            argument="family",
            expected=f"one of {sorted(FAMILIES)}",
            found=repr(name),
            fix="pass 'llama31' or 'qwen3'",
        )
    return FAMILIES[name]


def hf_config(s: FamilySpec) -> dict[str, Any]:
    """transformers' config keys of the small model (sizes, family facts, special token ids)."""
    ids = {t: 256 + i for i, t in enumerate(s.specials)}
    return {
        "hidden_size": HIDDEN, "intermediate_size": MLP, "num_hidden_layers": LAYERS, "vocab_size": VOCAB,
        **SEED_HEADS, **s.config, "hidden_act": "silu", "attention_bias": False,
        "bos_token_id": ids.get(s.bos) if s.bos else None, "eos_token_id": ids[s.eos],
    }  # fmt: skip


def build_tokenizer(s: FamilySpec) -> Any:
    """A byte-level BPE without merges: ids 0-255 are the bytes, the family's special tokens follow, then
    reserved ones up to VOCAB; a Llama 3.1 tokenizer puts its <|begin_of_text|> in front of every text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=_byte_of)
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    reserved = [f"<|reserved_special_token_{i}|>" for i in range(VOCAB - 256 - len(s.specials))]
    tokenizer.add_special_tokens([*s.specials, *reserved])
    if s.bos is not None:
        bos_id = tokenizer.token_to_id(s.bos)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{s.bos} $A", pair=f"{s.bos} $A {s.bos} $B", special_tokens=[(s.bos, bos_id)]
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def _byte_of(ch: str) -> int:
    """The byte a ByteLevel alphabet character stands for (GPT-2's bytes_to_unicode, inverted)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    if ord(ch) in printable:
        return ord(ch)
    others = [b for b in range(256) if b not in printable]
    return others[ord(ch) - 256]


def weights(s: FamilySpec, names_shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """Seeded float32 weights for every tensor of the model (by name, in sorted order): embeddings N(0, EMBED_STD),
    linear layers N(0, GAIN^2 / fan_in), norm weights 1 + N(0, NORM_STD)."""
    import numpy as np

    rng = np.random.default_rng(s.seed)
    out = {}
    for name in sorted(names_shapes):
        shape = names_shapes[name]
        draw = rng.standard_normal(shape).astype(np.float32)
        if name == "model.norm.weight":
            out[name] = FINAL_NORM * (1.0 + NORM_STD * draw)
        elif name.endswith("norm.weight"):
            out[name] = 1.0 + NORM_STD * draw
        elif "embed_tokens" in name:
            out[name] = EMBED_STD * draw
        else:
            out[name] = (GAIN / np.sqrt(shape[-1])) * draw
    return {k: v.astype(np.float32) for k, v in out.items()}


def _key(s: FamilySpec) -> str:
    versions = {n: importlib.metadata.version(n) for n in READERS}
    text = json.dumps([GENERATOR, s.name, hf_config(s), s.specials, s.chat_template, s.seed, EMBED_STD, GAIN,
                       NORM_STD, FINAL_NORM, versions], sort_keys=True)  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def default_cache() -> Path:
    from maxtext_compat.runner.caches import cache_base

    base = cache_base()
    return (base if base is not None else Path.home() / ".cache" / "maxtext-compat") / "families"


def family_dir(name: str, cache: Path | None = None) -> Path:
    """The Hugging Face directory of family `name` (config.json, model.safetensors, tokenizer files), written by
    transformers once per spec and reader versions under `cache` (default: the suite's cache folder)."""
    import fcntl
    import os
    import shutil

    s = spec(name)
    root = cache if cache is not None else default_cache()
    out = root / f"{s.name}-{_key(s)}"
    if (out / "config.json").is_file():
        return out
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # processes that start together write it once
        if not (out / "config.json").is_file():
            partial = out.with_name(out.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            write_family(s, partial)
            partial.rename(out)
    finally:
        os.close(fd)
    return out


def write_family(s: FamilySpec, out: Path) -> None:
    """Build the model with transformers, give it `weights`, save it and its tokenizer into `out`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    config = AutoConfig.for_model(s.model_type, **hf_config(s))
    torch.manual_seed(s.seed)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    state = model.state_dict()
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    drawn = weights(s, {k: tuple(v.shape) for k, v in state.items() if k not in tied})
    model.load_state_dict({k: torch.from_numpy(v) for k, v in drawn.items()}, strict=not tied)
    if tied:
        model.tie_weights()
    model.save_pretrained(str(out), safe_serialization=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(s), bos_token=s.bos, eos_token=s.eos,
                                   clean_up_tokenization_spaces=False)  # fmt: skip
    fast.chat_template = s.chat_template
    fast.save_pretrained(str(out))


PROMPTS = ("Seattle is a", "The capital of France is", "Once upon a time", "The best way to learn Python is")
NEW_TOKENS = 32
# Past 2048 tokens (the llama3 scaling's high-frequency wavelength cut, 8192 / 4): the arithmetic is in
# tests/compat/test_real_families.py. One byte is one token here.
LONG_PROMPT = "Counting: " + " ".join(str(n) for n in range(1, 541)) + " and"


def hf_model(path: Path) -> tuple[Any, Any]:
    """(tokenizer, model) as transformers reads the written directory, float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return AutoTokenizer.from_pretrained(str(path)), model.eval()


def hf_greedy_margins(model: Any, ids: list[int], new_tokens: int) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation of `ids` and, at each step, its top-1 minus top-2 logit."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=model.config.eos_token_id)  # fmt: skip
    margins = []
    for step in out.logits:
        top = torch.topk(step[0].float(), 2).values
        margins.append(float(top[0] - top[1]))
    return out.sequences[0, len(ids) :].tolist(), margins
