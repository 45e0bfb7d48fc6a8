"""Which chat template a conversion writes: the user's, the source's own, or its family's as MaxText ships it.

Why a family template: a GGUF file may carry none (Gemma 3 270M's does not), and a served directory without one
answers /v1/chat/completions with vLLM's refusal. Gemma 3's turns are one format for the family (Google's:
`<start_of_turn>user ... <end_of_turn>`, the assistant named `model`), and MaxText ships its template as
`maxtext/examples/chat_templates/gemma-3-27b-chat_template.json` (0.2.4 and later, Apache-2.0).
`templates/gemma3.jinja` is that file's text, byte for byte, so 0.1.0 to 0.2.3 get it too;
tests/compat/test_real_gemma3.py holds it equal to the installed MaxText's wherever one ships it. A family without
such a template gets none, and the result says so: the text is never made up.

Order: the user's (`--chat-template`, as vLLM's flag of that name: it wins over the source's), the source's own
(a GGUF file's `tokenizer.chat_template`; a directory's chat_template.jinja or tokenizer_config.json), the family's.
Imports neither jax nor MaxText.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Literal

from maxtext_compat.errors import InvalidArgumentError

Source = Literal["argument", "file", "family", "none"]
# general.architecture -> (the packaged template, where MaxText ships the same text)
FAMILY_TEMPLATES = {
    "gemma3": ("gemma3.jinja", "maxtext/examples/chat_templates/gemma-3-27b-chat_template.json"),
}


@dataclass(frozen=True)
class ChatTemplate:
    """The template written into tokenizer_config.json (None: none), where it came from, and a line saying so."""

    text: str | None
    source: Source
    note: str


def family_template(architecture: str | None) -> str | None:
    """The packaged template of a GGUF `general.architecture`, or None for a family without one."""
    entry = FAMILY_TEMPLATES.get(architecture or "")
    if entry is None:
        return None
    return resources.files("maxtext_compat.convert").joinpath("templates", entry[0]).read_text(encoding="utf-8")


def read_template_file(path: str | Path) -> str:
    """A template file as vLLM's `--chat-template` takes it (Jinja text), or a JSON object with a "chat_template"
    string (a tokenizer_config.json, MaxText's chat_templates/*.json); its syntax checked where jinja2 is installed."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(
            "the chat template file cannot be read", argument="chat_template",
            expected="a readable UTF-8 file: Jinja text, or JSON with a \"chat_template\" string",
            found=f"{p}: {type(exc).__name__}: {exc}", fix="pass the path of the template file",
        ) from exc  # fmt: skip
    if p.suffix == ".json":
        try:
            value = json.loads(text).get("chat_template")
        except (ValueError, AttributeError) as exc:
            value = exc
        if not isinstance(value, str):
            raise InvalidArgumentError(
                "the chat template JSON has no \"chat_template\" string", argument="chat_template",
                expected='a JSON object {"chat_template": "..."} (tokenizer_config.json form)',
                found=f"{p}: {value!r}"[:200], fix="pass the .jinja file itself, or a JSON object with that key",
            )  # fmt: skip
        text = value
    if not text.strip():
        raise InvalidArgumentError(
            "the chat template file is empty", argument="chat_template", expected="a Jinja chat template",
            found=str(p), fix="pass the file that holds the template",
        )  # fmt: skip
    _check_syntax(text, str(p))
    return text


def _check_syntax(text: str, where: str) -> None:
    try:
        import jinja2
    except ImportError:  # vLLM parses it when it serves; every serving environment has jinja2
        return
    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise InvalidArgumentError(
            "the chat template is not valid Jinja", argument="chat_template", expected="a template jinja2 parses",
            found=f"{where}, line {exc.lineno}: {exc.message}", fix="correct the template",
        ) from exc  # fmt: skip


def given_template(path: str | Path) -> ChatTemplate:
    """The user's template file, read and checked once (`read_template_file`), before the source is read."""
    return ChatTemplate(read_template_file(path), "argument", f"chat template: {path}, as given")


def choose(*, given: ChatTemplate | None, in_file: str | None, architecture: str | None) -> ChatTemplate:
    """The template a conversion writes, by the order in the module docstring; `given`: `given_template`'s."""
    if given is not None:
        return replace(given, note=given.note + " (in place of the source's own)") if in_file else given
    if in_file:
        return ChatTemplate(in_file, "file", "chat template: the source's own")
    family = family_template(architecture)
    if family is not None:
        shipped = FAMILY_TEMPLATES[architecture or ""][1]
        return ChatTemplate(family, "family", f"chat template: {architecture}'s, as MaxText ships it ({shipped}); "
                                              "the file carries none")  # fmt: skip
    return ChatTemplate(None, "none", "chat template: none (the source carries none); /v1/chat/completions "
                                      "needs one: convert again with --chat-template FILE, or serve with vLLM's "
                                      "flag")  # fmt: skip
