"""One conversion: a GGUF file or a Hugging Face model directory -> a directory vLLM and MaxText serve.

    OUT/config.json, tokenizer.json, tokenizer_config.json, generation_config.json   (vLLM)
    OUT/maxtext_config.json     the MaxText keys `maxtext-compat serve OUT` passes on
    OUT/checkpoint/             the orbax checkpoint (load_parameters_path) for the installed MaxText

Why a staging directory: every file is written into a hidden sibling of OUT and the whole
directory is renamed into place at the end, so an interrupted or failed conversion never leaves a
directory that looks complete (the staging directory is removed on failure). An existing OUT is
refused unless `force`, then replaced only after the new one is complete.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maxtext_compat.contract import checked
from maxtext_compat.convert.maxtext_tree import Checkpoint
from maxtext_compat.errors import InvalidArgumentError

CHECKPOINT_DIR = "checkpoint"
# chat_template.jinja: where transformers (4.43 and later) saves a tokenizer's chat template
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                      "chat_template.jinja")  # fmt: skip
TOKENIZERS = ("tokenizer.json", "tokenizer.model")  # one of them must be there for vLLM to tokenize
WEIGHT_DTYPES = ("float32", "bfloat16")


@checked
@dataclass
class ConversionResult:
    """What a conversion wrote; `maxtext_config` holds the keys `serve` passes to MaxText."""

    out: str
    source: str
    checkpoint: str | None
    maxtext_config: dict[str, Any]
    files: list[str] = field(default_factory=list)
    chat_template_source: str = "none"  # the written directory's chat template: argument, file, family or none
    chat_template_note: str = ""  # the same, in a sentence (the CLI prints it)


def _is_gguf(path: Path) -> bool:
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


@checked
def read_source(src: str | Path) -> tuple[Checkpoint, Any, str | None]:
    """(checkpoint, tokenizers.Tokenizer or None, chat template) of a .gguf file or a model directory; a GGUF
    file's family (Llama or Gemma 3) is its `general.architecture`."""
    p = Path(src)
    if _is_gguf(p):
        import gguf

        from maxtext_compat.convert.gguf_gemma3 import ARCHITECTURE, gemma3_checkpoint_from_reader
        from maxtext_compat.convert.gguf_llama import checkpoint_from_reader, metadata_value
        from maxtext_compat.convert.gguf_tokenizer import tokenizer_from_gguf

        reader = gguf.GGUFReader(str(p))
        template = reader.fields.get("tokenizer.chat_template")
        chat = template.contents() if template else None
        arch = metadata_value(reader, "general.architecture")
        read = gemma3_checkpoint_from_reader if arch == ARCHITECTURE else checkpoint_from_reader
        return read(reader, p), tokenizer_from_gguf(reader), chat
    if p.is_dir():
        from maxtext_compat.convert.hf_dir import read_hf_dir

        if not any((p / name).is_file() for name in TOKENIZERS):
            raise InvalidArgumentError(
                "the model directory has no tokenizer; vLLM could not tokenize a prompt",
                argument="source",
                expected=f"one of {list(TOKENIZERS)} beside config.json",
                found=f"{p} with {sorted(x.name for x in p.iterdir())[:8]}",
                fix="save the tokenizer into the directory (tokenizer.save_pretrained(dir)) and convert again",
            )
        return read_hf_dir(p), None, None
    raise InvalidArgumentError(
        "the conversion source is neither a GGUF file nor a model directory",
        argument="source",
        expected="a .gguf file (starting with the GGUF magic) or a directory with config.json and *.safetensors",
        found=f"{p} ({'a file' if p.is_file() else 'nothing there'})",
        fix="pass the path of a Llama-family .gguf file or a Hugging Face model directory",
    )


def _is_conversion(out: Path) -> bool:
    """Whether `out` holds what a conversion writes (the only kind of directory `force` replaces)."""
    from maxtext_compat.serving.model_dir import MAXTEXT_CONFIG
    from maxtext_compat.serving.serve_inputs import check_model_dir

    try:
        check_model_dir(str(out))  # config.json naming MaxTextForCausalLM, read as `serve` reads it
    except InvalidArgumentError:
        return False
    return (out / MAXTEXT_CONFIG).is_file()


def check_out(out: Path, src: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise InvalidArgumentError(
            "the output path is a file", argument="out", expected="a new or empty directory", found=str(out),
            fix="choose another output path",
        )  # fmt: skip
    if src.resolve().is_relative_to(out.resolve()):
        raise InvalidArgumentError(
            "the output directory holds the source; replacing it would delete the source",
            argument="out",
            expected="a directory outside the source's",
            found=f"out {out}, source {src}",
            fix="write the conversion into a new directory",
        )
    entries = sorted(x.name for x in out.iterdir()) if out.is_dir() else []
    if entries and not (force and _is_conversion(out)):
        raise InvalidArgumentError(
            "the output directory is not empty" + (" and was not written by a conversion" if force else ""),
            argument="out",
            expected="a new or empty directory" + ("" if force else ", or --force to replace an earlier conversion"),
            found=f"{out} with {entries[:6]}",
            fix="choose a new directory"
            + ("; --force replaces only a directory maxtext-compat convert wrote" if force else ", or pass --force"),
        )


def put_in_place(staging: Path, out: Path) -> None:
    """Rename the complete staging directory to `out`; an old `out` is moved aside first, removed last."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.rename(out, old / "previous")
    os.rename(staging, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@checked
def convert(
    src: str | Path,
    out: str | Path,
    *,
    checkpoint: bool = True,
    scan_layers: bool = False,
    weight_dtype: str = "float32",
    force: bool = False,
    chat_template: str | Path | None = None,
) -> ConversionResult:
    """Convert `src` into the model directory `out` (see the module docstring); all or nothing. `chat_template`: a
    template file that wins over the source's own (convert/chat_template.py says which one is written)."""
    from maxtext_compat.convert.chat_template import choose, given_template
    from maxtext_compat.convert.gguf_gemma3 import ARCHITECTURE as GEMMA3
    from maxtext_compat.convert.gguf_gemma3 import Gemma3Checkpoint
    from maxtext_compat.convert.maxtext_checkpoint import checkpoint_overrides, write_maxtext_checkpoint
    from maxtext_compat.convert.vllm_dir import set_chat_template, write_model_files, write_tokenizer

    if weight_dtype not in WEIGHT_DTYPES:
        raise InvalidArgumentError(
            "unsupported weight dtype for the checkpoint",
            argument="weight_dtype",
            expected=f"one of {list(WEIGHT_DTYPES)}",
            found=repr(weight_dtype),
            fix="pass weight_dtype='float32' (exact) or 'bfloat16' (half the size)",
        )
    target = Path(out).absolute()
    check_out(target, Path(src), force)
    given = None if chat_template is None else given_template(chat_template)  # refused before the source is read
    ckpt, tokenizer, in_file = read_source(src)  # before any directory is made: a bad source leaves nothing
    if tokenizer is None and in_file is None:  # a model directory: its tokenizer_config.json may hold one
        in_file = _directory_template(Path(src))
    family = GEMMA3 if isinstance(ckpt, Gemma3Checkpoint) else None
    template = choose(given=given, in_file=in_file, architecture=family)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        maxtext = checkpoint_overrides(ckpt, scan_layers=scan_layers, weight_dtype=weight_dtype)
        ckpt_path = None
        if checkpoint:
            write_maxtext_checkpoint(ckpt, str(staging / CHECKPOINT_DIR), scan_layers=scan_layers,
                                     weight_dtype=weight_dtype)  # fmt: skip
            ckpt_path = str(target / CHECKPOINT_DIR)
        if tokenizer is not None:
            write_tokenizer(staging, tokenizer, ckpt.shape, chat_template=template.text)
        else:
            for name in HF_TOKENIZER_FILES:
                if (Path(src) / name).is_file():
                    shutil.copy2(Path(src) / name, staging / name)
            if template.source == "argument":
                set_chat_template(staging, template.text)
        write_model_files(staging, ckpt.shape, maxtext, ckpt_path)
        files = sorted(x.name for x in staging.iterdir())
        put_in_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ConversionResult(str(target), str(src), ckpt_path, maxtext, files, template.source, template.note)


def _directory_template(src: Path) -> str | None:
    """A model directory's chat template as transformers reads it: chat_template.jinja, else tokenizer_config.json's
    "chat_template" string; None when it has neither."""
    import json

    if (src / "chat_template.jinja").is_file():
        return (src / "chat_template.jinja").read_text(encoding="utf-8")
    try:
        value = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None
