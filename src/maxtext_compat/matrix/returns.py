"""What a layer call returns, read from a release row's `returns:` spelling: the values' names, in order.

Why parsed names and not code per release: the call rule reshapes results and `migrate` rewrites unpackings from
the same spellings the docs' table prints, so a row that changes a release's return changes all three. A value is
found by its name (`hidden` in `(logits, hidden, kv_caches)`), never by a position written in code.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from maxtext_compat.errors import InvalidArgumentError, ProbeMismatchError

KV_NAMES = ("kv_cache", "kv_caches")  # the KV result's name in a new return (one cache, or one per layer)
# Per layer kind `returns:` may give, what a caller of the old (pre-#2616) convention unpacks, then what a caller of
# the new one does (the scanned layer's are the scan's carries; the Transformer has one form per attention mode).
# A row spells its own release's return; MaxTextRow.after_read holds it to these by name.
RETURN_SHAPES: dict[str, tuple[str, ...]] = {
    "attention": ("out", "(out, kv_cache)"),
    "decoder_layer": ("y", "(y, kv_cache)"),
    "decoder_layer_scanned": ("(y, None)", "((y, stacked_kv, idx), None)"),
    "decoder": ("(logits, hidden)", "(logits, hidden, kv_caches)"),
    "transformer": ("logits",),
    "transformer_vllm": ("(hidden, kv_caches)",),
}
SPELLING_FORM = "a value's name (out) or a tuple of distinct names ((out, kv_cache)); a name may be a nested tuple"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ReturnShape:
    """A return spelled `name` (one bare value) or `(a, b, ...)` (a tuple; an item may itself be a tuple)."""

    names: tuple[str, ...]
    bare: bool

    @classmethod
    def parse(cls, spelling: str) -> ReturnShape:
        text = spelling.strip()
        if not (text.startswith("(") and text.endswith(")")):
            return cls((text,), bare=True)
        items, depth, start = [], 0, 1
        for i, ch in enumerate(text[1:-1], start=1):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if ch == "," and depth == 0:
                items.append(text[start:i].strip())
                start = i + 1
        items.append(text[start:-1].strip())
        return cls(tuple(items), bare=False)

    @property
    def spelling(self) -> str:
        return self.names[0] if self.bare else f"({', '.join(self.names)})"

    @property
    def arity(self) -> int:
        """How many values a caller unpacks (1 for a bare value)."""
        return len(self.names)

    @property
    def kv_index(self) -> int | None:
        """The KV result's position (the number of values before it), or None when the return has none."""
        return next((i for i, n in enumerate(self.names) if n in KV_NAMES), None)

    @property
    def kv_name(self) -> str:
        """The KV result's name (a shape without one is refused: nothing to hand the caches back in)."""
        if self.kv_index is None:
            raise InvalidArgumentError(
                f"the return {self.spelling} has no KV result",
                argument="returns",
                expected=f"a spelling naming one of {', '.join(KV_NAMES)}",
                found=self.spelling,
                fix="correct `returns:` in compat_matrix.yaml: a new-convention return names its KV result",
            )
        return self.names[self.kv_index]

    def values(self, result: Any, where: str) -> dict[str, Any]:
        """The result's values by name; a result that is not this shape is refused, never sliced."""
        if self.bare:
            return {self.names[0]: result}
        if not isinstance(result, (tuple, list)) or len(result) != self.arity:
            found = f"a {len(result)}-tuple" if isinstance(result, (tuple, list)) else type(result).__name__
            raise ProbeMismatchError(
                f"{where} returned {found}, where compat_matrix.yaml says {self.spelling}",
                argument="returns",
                expected=self.spelling,
                found=found,
                fix="correct the release's `returns:` in compat_matrix.yaml (maxtext-compat facts reads them from "
                "its code), or report the release's return",
            )
        return dict(zip(self.names, result, strict=True))

    def build(self, values: Mapping[str, Any]) -> Any:
        """This shape's value made from named values (a fresh tuple; a bare shape gives its one value)."""
        missing = [n for n in self.names if n not in values]
        if missing:
            raise InvalidArgumentError(
                f"no value for {', '.join(missing)} to build {self.spelling}",
                argument="returns",
                expected=f"values named {', '.join(self.names)}",
                found=", ".join(values) or "none",
                fix="the two spellings name different values: correct `returns:` in compat_matrix.yaml",
            )
        return values[self.names[0]] if self.bare else tuple(values[n] for n in self.names)

    def reshape(self, result: Any, to: ReturnShape, where: str, **extra: Any) -> Any:
        """`result`, shaped as self, in shape `to` (values by name; `extra` supplies those self lacks)."""
        return to.build({**extra, **self.values(result, where)})


def spelling_problem(spelling: str) -> str | None:
    """What is wrong with a `returns:` spelling, or None."""
    if spelling.count("(") != spelling.count(")"):
        return "unbalanced parentheses"
    shape = ReturnShape.parse(spelling)
    for name in shape.names:
        if name.startswith("("):
            if (inner := spelling_problem(name)) is not None:
                return inner
        elif not _NAME.fullmatch(name):
            return f"{name!r} is not a name"
    if len(set(shape.names)) != len(shape.names):
        return "a name appears twice"
    return None


def convention_problem(kind: str, spelling: str, *, takes_kv: bool) -> str | None:
    """Why `spelling` cannot be a `kind` call's return on a release that takes KV arguments or not, or None: the
    old caller's values are all there by name, with a KV result exactly when the release takes KV arguments."""
    shape = ReturnShape.parse(spelling)
    names = set(shape.names)
    if kind == "transformer_vllm":
        return None if "hidden" in names and shape.kv_index is not None else "it names no hidden state or KV result"
    if kind not in ("attention", "decoder_layer", "decoder", "transformer"):
        return None  # the scan's carry: passed through as MaxText returns it
    wanted = set(caller_shape(kind, new=False).names)
    kv = names & set(KV_NAMES)
    if names - kv != wanted:
        return f"it names {sorted(names - kv)}, where an old caller's values are {sorted(wanted)}"
    if bool(kv) != (takes_kv and kind != "transformer"):
        return "a KV result on a release without KV arguments" if kv else "no KV result, though the release takes one"
    return None


@functools.cache
def shape_of(spelling: str) -> ReturnShape:
    """The parsed spelling (each spelling parsed once: the call rule asks on every traced call)."""
    return ReturnShape.parse(spelling)


def caller_shape(kind: str, *, new: bool) -> ReturnShape:
    """What a caller of the old (pre-#2616) or the new convention unpacks from a `kind` call (RETURN_SHAPES)."""
    spellings = RETURN_SHAPES[kind]
    return shape_of(spellings[-1] if new else spellings[0])


def one_shape(spellings: Sequence[str]) -> ReturnShape | None:
    """The shape every spelling agrees on, or None when they differ (or there are none)."""
    distinct = set(spellings)
    return ReturnShape.parse(distinct.pop()) if len(distinct) == 1 else None
