"""The closed sets of values the matrix's fields take, and the readers of its one-node values."""

from __future__ import annotations

import datetime
import importlib
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from maxtext_compat.matrix.returns import RETURN_SHAPES, SPELLING_FORM, spelling_problem
from maxtext_compat.matrix.schema import Yaml, normalized_version, parsed
from maxtext_compat.matrix.yaml_node import Node

SCHEMA_VERSION = 1
MATRIX_ENV_VAR = "MAXTEXT_COMPAT_MATRIX"

# Each closed set of values is declared once, as a Literal; the tuple the parser checks against is read from it.
Convention = Literal["legacy", "kv_return", "kv_scan_carry"]
CONVENTIONS: tuple[Convention, ...] = get_args(Convention)
# What the code *calling* MaxText expects: `auto` decides per call by what the caller wrote,
# `legacy` always wants the old return, `kv_return` always the new one (see maxtext_compat.convention.callers).
CallerConvention = Literal["auto", "legacy", "kv_return"]
CALLER_CONVENTIONS: tuple[CallerConvention, ...] = get_args(CallerConvention)
Policy = Literal["ignore", "warn", "error"]
POLICIES: tuple[Policy, ...] = get_args(Policy)
DecoderKind = Literal["linen", "nnx"]
DECODER_KINDS: tuple[DecoderKind, ...] = get_args(DecoderKind)
CallForm = Literal["curried", "flat"]
CALL_FORMS: tuple[CallForm, ...] = get_args(CallForm)
ImportRoot = Literal["MaxText", "maxtext"]
# How a package's `.devN` builds relate to the release they are named for. PEP 440 orders 0.29.0.dev1
# before 0.29.0 (`before_release`); a nightly uploaded after its named release (tpu-inference's
# 0.31.0.dev20261006 came 8 h after 0.31.0) has that release's API (`after_release`).
DevBuildRelation = Literal["after_release", "before_release"]
DEV_BUILD_RELATIONS: tuple[DevBuildRelation, ...] = get_args(DevBuildRelation)
DevBuildPackage = Literal["maxtext", "tpu_inference"]
DEV_BUILD_PACKAGES: tuple[DevBuildPackage, ...] = get_args(DevBuildPackage)
DefectRemedy = Literal["fix", "refuse"]  # a shim repairs it, or a typed error stops the run
DEFECT_REMEDIES: tuple[DefectRemedy, ...] = get_args(DefectRemedy)
Family = Literal["default", "llama2", "qwen3", "gemma3"]
FAMILIES: tuple[Family, ...] = get_args(Family)

# Optional parameters whose presence moved between releases.
OPTIONAL_PARAMS: tuple[str, ...] = (
    "page_state",
    "out_sharding",
    "rope_kwargs",
    "shared_key",
    "shared_value",
    "kv_cache",
    "attention_metadata",
)
CLASS_KEYS: tuple[str, ...] = (
    "attention",
    "attention_op",
    "mla",  # MaxText's multi-head latent attention: an Attention subclass with its own __call__
    "decoder",
    "nnx_decoder",
    "transformer",
    "transformer_linen",
)
OPTIONAL_CLASS_KEYS: frozenset[str] = frozenset({"mla"})  # a user's matrix may leave these out
BLOCK_SIZE_SOURCES: tuple[str, ...] = ("function", "env", "tuned")
# An environment's name is a directory under the envs folder, built and deleted by `envs build`:
# one path component, ASCII, starting with a letter or digit (so never `.`, `..`, hidden or empty).
ENV_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
ENV_NAME_RULE = "1-64 ASCII letters, digits, '.', '_' or '-', starting with a letter or digit"


@dataclass(frozen=True)
class ClassRef:
    """A `module:Qualname` reference to a class inside an installed package."""

    module: str
    qualname: str

    @classmethod
    def parse(cls, text: str) -> ClassRef:
        module, sep, qualname = text.partition(":")
        if not sep or not module or not qualname or " " in text:
            raise ValueError(f"{text!r} is not of the form 'package.module:ClassName'")
        return cls(module, qualname)

    def load(self) -> Any:
        """Import the module and return the class (imports MaxText: heavy, has side effects)."""
        obj: Any = importlib.import_module(self.module)
        for part in self.qualname.split("."):
            obj = getattr(obj, part)
        return obj

    def __str__(self) -> str:
        return f"{self.module}:{self.qualname}"


_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def read_iso_date(n: Node) -> str:
    """A calendar date written YYYY-MM-DD (the day the release reached PyPI, UTC)."""
    text = n.nonempty_string()
    try:
        datetime.date.fromisoformat(text)
    except ValueError:
        text = ""
    if not _ISO_DATE.fullmatch(text):
        raise n.error(
            "is not a calendar date",
            expected='a quoted date such as "2026-10-02"',
            fix="write the day the release was uploaded to PyPI (UTC) as YYYY-MM-DD, quoted",
        )
    return text


def read_param_names(n: Node) -> frozenset[str]:
    out = n.string_list()
    for p in out:
        if p not in OPTIONAL_PARAMS:
            raise n.error(
                f"unknown optional parameter {p!r}",
                expected=f"names from {list(OPTIONAL_PARAMS)}",
                fix=f"remove {p!r} from `{n.key}` or correct its spelling",
            )
    return frozenset(out)


def read_block_sizes(n: Node) -> tuple[str, ...]:
    sources = n.string_list()
    for b in sources:
        if b not in BLOCK_SIZE_SOURCES:
            raise n.error(
                f"unknown block-size source {b!r}",
                expected=f"names from {list(BLOCK_SIZE_SOURCES)}",
                fix=f"list only {', '.join(BLOCK_SIZE_SOURCES)} under block_sizes (remove {b!r})",
            )
    return sources


def arity(what: str) -> Yaml:
    """How many values `what` returns: 3 or 4."""

    def read(n: Node) -> int:
        value = n.integer()
        if value not in (3, 4):
            key = n.key.rsplit(".", 1)[-1]
            raise n.error(
                "must be 3 or 4",
                expected="3 or 4",
                fix=f"set {key} to the number of values the release's {what} returns (3 or 4)",
            )
        return value

    return Yaml(read=read)


def read_class_refs(n: Node) -> dict[str, ClassRef | None]:
    """`classes:` every key of CLASS_KEYS (null: the release has no such class); attention, transformer and
    one decoder must name classes."""
    n.only_keys(set(CLASS_KEYS))
    classes: dict[str, ClassRef | None] = {}
    for key in CLASS_KEYS:
        c = n.optional(key) if key in OPTIONAL_CLASS_KEYS else n.child(key)
        classes[key] = None if c is None or c.value is None else c.parsed(ClassRef.parse, CLASS_REF_FORM)
    if classes["attention"] is None or classes["transformer"] is None:
        raise n.error(
            "attention and transformer must name classes",
            fix=f"set `{n.key}.attention` and `{n.key}.transformer` to 'module:Class' references",
        )
    if classes["decoder"] is None and classes["nnx_decoder"] is None:
        raise n.error(
            "at least one of decoder / nnx_decoder must name a class",
            fix=f"set `{n.key}.decoder` (Linen) or `{n.key}.nnx_decoder` (NNX) to a 'module:Class' reference",
        )
    return classes


def read_return_shapes(n: Node) -> dict[str, str | None]:
    """`returns:` per layer kind of RETURN_SHAPES, a spelling of named values (null: the release has no such layer);
    the row checks the names against its convention (MaxTextRow.after_read)."""
    n.only_keys(set(RETURN_SHAPES))
    returns: dict[str, str | None] = {}
    for kind in RETURN_SHAPES:
        r = n.child(kind)
        if r.value is None:
            returns[kind] = None
            continue
        spelling = r.nonempty_string()
        if (problem := spelling_problem(spelling)) is not None:
            raise r.error(f"is not a return spelling: {problem}", expected=SPELLING_FORM)
        returns[kind] = spelling
    return returns


CLASS_REF_FORM = "a 'module:Class' reference"
# The field types whose YAML form is not their Python type's.
ClassRefText = Annotated[ClassRef, parsed(ClassRef.parse, CLASS_REF_FORM)]
VersionText = Annotated[str, parsed(normalized_version, "a version")]
IsoDate = Annotated[str, Yaml(read=read_iso_date)]
ParamNames = Annotated[frozenset[str], Yaml(read=read_param_names)]
FreeText = Annotated[str, Yaml(read=Node.string)]  # may be empty
