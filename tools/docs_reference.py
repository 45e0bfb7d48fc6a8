"""Reference pages generated from what the code reads: the matrix's rows, its file format, the public API.

Why generated: the conventions table is the one `maxtext_compat.resolve()` answers from, the file format is the
one `matrix/schema.py` reads (each field's annotation is how its key is read), and the API reference is the
docstrings whose examples run as doctests; a copy of any of them would drift. Called by tools/mkdocs_hooks.py.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import io
import re
import tokenize
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args, get_origin

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from maxtext_compat.matrix import CompatMatrix, load_matrix
from maxtext_compat.matrix import schema as matrix_schema

PUBLIC_MODULES = ("maxtext_compat", "maxtext_compat.adapters", "maxtext_compat.shims")


def _cell(value: object) -> str:
    text = "-" if value is None or value == "" or value == () else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _code(value: object) -> str:
    return "-" if value is None or value == () else f"`{_cell(value)}`"


def _list(values: object) -> str:
    return ", ".join(f"`{v}`" for v in values) if values else "-"  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------- conventions


def conventions_page(m: CompatMatrix | None = None) -> str:
    """Every MaxText row and tpu-inference range of compat_matrix.yaml, as the resolver reads them."""
    m = m or load_matrix()
    rows = sorted(m.maxtext, key=lambda r: r.release)
    out = [
        "# Call conventions per release",
        "",
        "<!-- generated from compat_matrix.yaml by tools/docs_reference.py -->",
        "",
        f"The rows `maxtext_compat.resolve()` answers from (`{m.source.split('/')[-1]}`, schema version "
        f"{m.schema_version}). `maxtext-compat resolve --maxtext X --tpu-inference Y` shows one decision.",
        "",
        "## MaxText releases",
        "",
        "| release | on PyPI | import root | convention | callers default | default decoder | scan KV carry "
        "| old calls | vLLM path needs tpu-inference |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        policy = r.deprecation.policy + (f" (ends in {r.deprecation.ends_in})" if r.deprecation.ends_in else "")
        needs = _code(r.requires.tpu_inference) if r.requires.tpu_inference else "-"
        out.append(
            f"| {r.name} | {r.date} | `{r.import_root}` | **{r.convention}** | {r.callers} | {r.default_decoder} | "
            f"{'yes' if r.scan_kv_carry else 'no'} | {policy} | {needs} |"
        )
    kinds = list(rows[-1].returns)
    out += ["", "### What each layer returns", "", "| release | " + " | ".join(kinds) + " |"]
    out.append("|---" * (len(kinds) + 1) + "|")
    out += [f"| {r.name} | " + " | ".join(_code(r.returns.get(k)) for k in kinds) + " |" for r in rows]
    out += ["", "### Optional parameters", "", "| release | Attention | decoder layer | Decoder |", "|---|---|---|---|"]
    out += [
        f"| {r.name} | {_list(r.params.attention)} | {_list(r.params.decoder_layer)} | {_list(r.params.decoder)} |"
        for r in rows
    ]
    out += ["", "### Classes", "", "| release | " + " | ".join(rows[-1].classes) + " |"]
    out.append("|---" * (len(rows[-1].classes) + 1) + "|")
    out += [f"| {r.name} | " + " | ".join(_code(r.classes.get(k)) for k in rows[-1].classes) + " |" for r in rows]
    out += [
        "",
        "### The vLLM path",
        "",
        "| release | attention modes | RPA module | call form | serve return | adapter (arity) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        v = r.vllm
        if v is None:
            out.append(f"| {r.name} | none: the backport (maxtext_compat.backport) serves it | | | | |")
            continue
        out.append(
            f"| {r.name} | {_list(v.attention_modes)} | `{v.rpa_module}` | {v.rpa_call_form} | "
            f"{v.serve_return_order} | `{v.adapter}` ({v.adapter_return_arity}) |"
        )
    out += ["", "### Known defects", ""]
    for r in rows:
        for d in r.known_defects:
            out.append(
                f"- **{r.name}** `{d.id}` ({d.remedy}, when {d.when.describe()}): {_cell(d.summary)}"
                + (f"; fixed upstream in {d.upstream_fix}" if d.upstream_fix else "")
            )
    out += [
        "",
        "## tpu-inference ranges",
        "",
        "| range | releases (jax, vllm-tpu, date) | RPA entry point | call form | optional keywords "
        "| metadata fields | model return | CPU block sizes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in m.tpu_inference:
        rel = "; ".join(f"{v} (jax {x.jax}, vllm-tpu {x.vllm_tpu or '-'}, {x.date})" for v, x in t.releases.items())
        out.append(
            f"| `{t.label}` | {rel} | `{t.rpa.module}.{t.rpa.function}` | {t.rpa.call_form} | "
            f"{_list(t.rpa.optional_kwargs)} | {_list(t.metadata.fields)} | {t.model_return_arity}-tuple | "
            f"{_list(t.block_sizes)} |"
        )
    out += [
        "",
        "## The CPU shim",
        "",
        f"Verified on jax {', '.join(m.cpu_shim.verified_jax)}; the real kernel of tpu-inference "
        f"{', '.join(m.cpu_shim.verified_tpu_inference)}.",
        "",
    ]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------- file format


def _type_words(tp: Any, links: dict[type, str]) -> str:
    """How a field's value is written in YAML, in words (the reader's own rules, see matrix/schema.py)."""
    if get_origin(tp) is Annotated:
        yaml = matrix_schema._yaml_of(tp)
        inner = get_args(tp)[0]
        if yaml.read is not None:
            doc = (inspect.getdoc(yaml.read) or "").split("\n")[0].rstrip(".")
            return doc or _type_words(inner, links)
        return _type_words(inner, links)
    args = get_args(tp)
    if get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return " or ".join(_type_words(a, links) for a in rest) + " (or null)"
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if tp is str:
        return "text"
    if tp is bool:
        return "true / false"
    if tp is int:
        return "an integer"
    if tp is Version:
        return "a PEP 440 version"
    if tp is SpecifierSet:
        return "a version specifier (PEP 440)"
    if get_origin(tp) in (tuple, frozenset):
        return "a list of " + _type_words(args[0], links)
    if get_origin(tp) in (Mapping, dict):
        return "a mapping of name to " + _type_words(args[1], links)
    if dataclasses.is_dataclass(tp):
        return f"a mapping: [{tp.__name__}](#{links[tp]})"  # type: ignore[index]
    return f"`{getattr(tp, '__name__', tp)}`"


def _field_comments(cls: type) -> dict[str, str]:
    """The `# ...` comment on each field's line in the class source (the schema's own notes)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    comments: dict[str, str] = {}
    field_at: dict[int, str] = {}
    for line_no, line in enumerate(source.splitlines(), 1):
        match = re.match(r"\s{4}(\w+):", line)
        if match:
            field_at[line_no] = match.group(1)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and tok.start[0] in field_at:
            comments[field_at[tok.start[0]]] = tok.string.lstrip("# ").strip()
    return comments


def _struct_types(root: type) -> list[type]:
    """`root` and every dataclass its fields hold, in the order a reader meets them."""
    seen: list[type] = []
    todo = [root]
    while todo:
        cls = todo.pop(0)
        if cls in seen:
            continue
        seen.append(cls)
        hints = typing.get_type_hints(cls, include_extras=True)
        for f in dataclasses.fields(cls):
            todo += [
                t
                for t in _nested(hints[f.name])
                if isinstance(t, type) and dataclasses.is_dataclass(t) and t not in seen
            ]
    return seen


def _nested(tp: Any) -> list[Any]:
    return [tp, *(n for a in get_args(tp) for n in _nested(a))]


def matrix_format_page() -> str:
    """Every key of compat_matrix.yaml, from the dataclasses the reader fills (matrix/types.py, schema.py)."""
    from maxtext_compat.matrix.types import CompatMatrix as Root

    structs = _struct_types(Root)
    links = {cls: cls.__name__.lower() for cls in structs}
    out = [
        "# Matrix file format",
        "",
        "<!-- generated from maxtext_compat/matrix/types.py through matrix/schema.py by tools/docs_reference.py -->",
        "",
        "`compat_matrix.yaml` is read into these typed rows; each field's annotation is also how its key is read,",
        "so this page is the reader's own schema. A key that is not listed is refused (a typo is never ignored), and",
        "every failure is a `MatrixError` naming the file and the dotted key. `MAXTEXT_COMPAT_MATRIX` names your copy.",
    ]
    for cls in structs:
        doc = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
        if doc.startswith(cls.__name__ + "("):  # a dataclass's generated docstring says nothing
            doc = ""
        out += ["", f"## {cls.__name__}", "", doc, "", "| key | value | required | note |", "|---|---|---|---|"]
        notes = _field_comments(cls)
        for f in matrix_schema._fields(cls):
            if f.yaml.given:
                continue
            required = "no" if f.optional else "yes"
            note = notes.get(f.name, "")
            if f.yaml.keys:
                note = (note + "; " if note else "") + "keys: " + ", ".join(f"`{k}`" for k in f.yaml.keys)
            hint = typing.get_type_hints(cls, include_extras=True)[f.name]
            out.append(f"| `{f.key}` | {_cell(_type_words(hint, links))} | {required} | {_cell(note)} |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------- API


def _docstring_markdown(doc: str) -> str:
    """A docstring as Markdown: prose as is, each run of doctest lines (and its output) as a pycon block."""
    out: list[str] = []
    block: list[str] = []
    in_example = False
    for line in doc.splitlines():
        starts = line.lstrip().startswith((">>>", "..."))
        if starts or (in_example and line.strip()):
            block.append(line)
            in_example = True
            continue
        if block:
            out += ["```pycon", *block, "```"]
            block, in_example = [], False
        out.append(line)
    if block:
        out += ["```pycon", *block, "```"]
    return "\n".join(out)


def _signature(obj: Any) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""


def api_page() -> str:
    """Each public name (`__all__`) of the package and its two faces, with its docstring and examples."""
    out = [
        "# Python API",
        "",
        "<!-- generated from __all__ and the docstrings by tools/docs_reference.py -->",
        "",
        "Every public name, with its docstring. The examples run as doctests in the test suite "
        "(`tests/unit/test_docstrings.py`, in the environment without MaxText or jax).",
    ]
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        out += ["", f"## `{module_name}`", "", _docstring_markdown(inspect.getdoc(module) or "")]
        for name in sorted(module.__all__, key=str.lower):
            obj = getattr(module, name)
            if not callable(obj):
                continue  # __version__: shown in the module's docstring
            kind = "class" if inspect.isclass(obj) else "function"
            out += ["", f"### `{module_name}.{name}`", "", f"*{kind}* `{name}{_signature(obj)}`", ""]
            out.append(_docstring_markdown(inspect.getdoc(obj) or "*(no docstring)*"))
    return "\n".join(out) + "\n"
