"""The tokenizer a GGUF file carries, as a Hugging Face `tokenizers` tokenizer (tokenizer.json).

Why rebuild it: vLLM and the reference need tokenizer files next to the model, and the GGUF file
is the only copy we ship. GPT-2-style byte-level BPE ("gpt2" model) is supported, with the
pre-tokenizers llama.cpp names ("smollm": digits split one by one, then GPT-2's regex); and Gemma 3's
SentencePiece BPE ("llama" model of a gemma3 file): byte fallback, spaces as "▁", no prefix space,
merges recovered from the vocabulary (the file lists none; a token's position is its merge rank),
and the BOS token the file says to add.
"""

from __future__ import annotations

from typing import Any

from maxtext_compat.contract import checked
from maxtext_compat.errors import InvalidArgumentError

CONTROL = 3  # llama.cpp token type of special tokens (<|im_start|>, <|endoftext|>, ...)
PRE_TOKENIZERS = ("smollm", "gpt2", "default")
SENTENCEPIECE_ARCHITECTURES = ("gemma3",)
SPACE = "\u2581"  # SentencePiece's visible space


def _strings(reader: Any, key: str) -> list[str]:
    field = reader.fields[key]
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


@checked
def tokenizer_from_gguf(reader: Any) -> Any:
    """A `tokenizers.Tokenizer` equal to the model's own (byte-level BPE)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from maxtext_compat.convert.gguf_llama import metadata_value

    kind = reader.fields["tokenizer.ggml.model"].contents()
    pre = metadata_value(reader, "tokenizer.ggml.pre", "default")
    arch = metadata_value(reader, "general.architecture")
    if kind == "llama" and arch in SENTENCEPIECE_ARCHITECTURES:
        return _gemma_sentencepiece(reader)
    if kind != "gpt2" or pre not in PRE_TOKENIZERS:
        raise InvalidArgumentError(
            "this GGUF tokenizer is not supported",
            argument="tokenizer.ggml.model / tokenizer.ggml.pre",
            expected=f"gpt2 with a pre-tokenizer in {list(PRE_TOKENIZERS)}, or llama in {SENTENCEPIECE_ARCHITECTURES}",
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


def _merges(tokens: list[str]) -> list[tuple[str, str]]:
    """Every split of a token into two tokens of the vocabulary, ranked by the merged token's position (then the
    longer left piece first): the order SentencePiece's BPE merges in, which a Gemma GGUF file implies."""
    index = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for rank, token in enumerate(tokens):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in index and right in index:
                ranked.append((rank, -cut, index[left], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _gemma_sentencepiece(reader: Any) -> Any:
    """Gemma's tokenizer: BPE over "▁"-spelled text with byte fallback, control tokens whole, BOS added."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    # llama.cpp stores a token of two or more spaces as spaces; the model spells them with SPACE
    tokens = [
        SPACE * len(t) if len(t) > 1 and not t.strip(" ") else t for t in _strings(reader, "tokenizer.ggml.tokens")
    ]
    types = list(reader.fields["tokenizer.ggml.token_type"].contents())
    unk_id = (
        reader.fields["tokenizer.ggml.unknown_token_id"].contents()
        if "tokenizer.ggml.unknown_token_id" in reader.fields
        else None
    )
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=_merges(tokens), byte_fallback=True,
                     fuse_unk=True, unk_token=None if unk_id is None else tokens[int(unk_id)])  # fmt: skip
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types, strict=True) if k == CONTROL])  # fmt: skip
    add_bos = "tokenizer.ggml.add_bos_token" in reader.fields and bool(
        reader.fields["tokenizer.ggml.add_bos_token"].contents()
    )
    if add_bos and "tokenizer.ggml.bos_token_id" in reader.fields:
        bos = tokens[int(reader.fields["tokenizer.ggml.bos_token_id"].contents())]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokens.index(bos))]
        )
    return tok
