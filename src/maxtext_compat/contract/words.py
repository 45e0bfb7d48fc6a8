"""The words of a contract error: what a type hint expects, what was found, and the default fix.

Why generated from the hint: the expected part of every error must say what the signature says, in words a
user reads (`an int >= 1 or None`, not `Annotated[int, Rule(...)] | None`), and the hint is the one source.
"""

from __future__ import annotations

import collections.abc as abc
import types
import typing
from pathlib import PurePath
from typing import Any

from maxtext_compat.contract.rules import Rule

_NAMES: dict[Any, str] = {
    int: "an int",
    float: "a number",
    bool: "True or False",
    str: "a str",
    bytes: "bytes",
    type(None): "None",
    type: "a class",
    object: "any value",
    PurePath: "a path",
    abc.Hashable: "a hashable value (str, int, tuple, ...)",
    abc.Callable: "a callable",
}
_CONTAINERS: dict[Any, str] = {
    abc.Sequence: "a sequence",
    abc.Iterable: "an iterable",
    abc.Iterator: "an iterator",
    abc.Mapping: "a mapping",
    abc.Collection: "a collection",
    list: "a list",
    tuple: "a tuple",
    dict: "a dict",
    set: "a set",
    frozenset: "a frozenset",
}


def _article(name: str) -> str:
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


def _plural(hint: Any) -> str:
    """`ints`, `SequenceSlices`: an item type named as the members of a container."""
    text = expected(hint)
    for prefix in ("an ", "a "):
        if text.startswith(prefix) and " " not in text[len(prefix) :]:
            return text[len(prefix) :] + "s"
    return text


def expected(hint: Any) -> str:
    """What `hint` accepts, in words."""
    if hint is Any:
        return "any value"
    if isinstance(hint, str):
        return hint
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Annotated:
        rules = [m for m in args[1:] if isinstance(m, Rule)]
        return rules[-1].expected if rules else expected(args[0])
    if origin in (typing.Union, types.UnionType):
        parts = [expected(a) for a in args if a is not type(None)]
        return " or ".join([*parts, "None"] if type(None) in args else parts)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (abc.Callable,):
        return "a callable"
    if origin is type:
        return f"a subclass of {_name(args[0])}" if args else "a class"
    if origin in _CONTAINERS:
        what = _CONTAINERS[origin]
        if origin is tuple and args and (len(args) != 2 or args[1] is not Ellipsis):
            return f"a tuple of {len(args)} ({', '.join(expected(a) for a in args)})"
        if origin in (dict, abc.Mapping) and len(args) == 2:
            return f"{what} of {_plural(args[0])} to {_plural(args[1])}"
        return f"{what} of {_plural(args[0])}" if args else what
    if hint in _NAMES:
        return _NAMES[hint]
    if isinstance(hint, type):
        return _article(hint.__name__)
    return _article(str(hint))


def _name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint)


def found(value: Any) -> str:
    """A value for an error message: type and shape for arrays, a short repr and its type otherwise."""
    shape = getattr(type(value), "shape", None) is not None and getattr(value, "shape", None)
    if shape is not None and shape is not False:
        return f"{type(value).__name__} of shape {tuple(shape)}"
    text = repr(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def type_fix(name: str, hint: Any, value: Any) -> str:
    """The default fix for a value of the wrong type."""
    want = expected(hint)
    base = f"pass {name} as {want}"
    if isinstance(value, bool) and "int" in want:
        return base + " (True/False is not a count or an id)"
    if isinstance(value, float) and "an int" in want:
        return (
            base
            + f": a float would be truncated (int({name}) only when it is whole; never round a page id or a length)"
        )
    if isinstance(value, str) and ("int" in want or "number" in want):
        return base + f", e.g. int({name}) (a str is not converted)"
    return base
