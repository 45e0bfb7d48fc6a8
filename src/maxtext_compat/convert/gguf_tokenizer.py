"""The tokenizer a GGUF file carries, as a Hugging Face `tokenizers` tokenizer (tokenizer.json).

Why rebuild it: vLLM and the reference need tokenizer files next to the model, and the GGUF file
is the only copy we ship. GPT-2-style byte-level BPE ("gpt2" model) is supported, with the
pre-tokenizers llama.cpp names ("smollm": digits split one by one, then GPT-2's regex).
"""

from __future__ import annotations

from typing import Any

from maxtext_compat.contract import checked
from maxtext_compat.errors import InvalidArgumentError

CONTROL = 3  # llama.cpp token type of special tokens (<|im_start|>, <|endoftext|>, ...)
PRE_TOKENIZERS = ("smollm", "gpt2", "default")


def _strings(reader: Any, key: str) -> list[str]:
    field = reader.fields[key]
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


@checked
def tokenizer_from_gguf(reader: Any) -> Any:
    """A `tokenizers.Tokenizer` equal to the model's own (byte-level BPE)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    kind = reader.fields["tokenizer.ggml.model"].contents()
    pre = reader.fields["tokenizer.ggml.pre"].contents() if "tokenizer.ggml.pre" in reader.fields else "default"
    if kind != "gpt2" or pre not in PRE_TOKENIZERS:
        raise InvalidArgumentError(
            "this GGUF tokenizer is not supported",
            argument="tokenizer.ggml.model / tokenizer.ggml.pre",
            expected=f"gpt2 with a pre-tokenizer in {list(PRE_TOKENIZERS)}",
            found=f"{kind} / {pre}",
            fix="convert a model whose tokenizer is GPT-2-style byte-level BPE, or pass its tokenizer.json",
        )
    tokens = _strings(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in _strings(reader, "tokenizer.ggml.merges")]
    types = list(reader.fields["tokenizer.ggml.token_type"].contents())
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, ignore_merges=False))
    steps = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if pre == "smollm":
        steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    special = [t for t, k in zip(tokens, types, strict=True) if k == CONTROL]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return tok
