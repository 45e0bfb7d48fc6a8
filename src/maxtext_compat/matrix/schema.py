"""Reading a frozen dataclass out of YAML by its own field declarations: the schema is written once.

Why: a schema kept as dataclass fields *and* as parse calls drifts (a field added to one and not the
other is read as a default, silently). Here each field's annotation says how its key is read —
`str` a non-empty string, a `Literal` one of its values, `tuple[X, ...]` a list of X, a dataclass a
mapping read the same way, `X | None` or a default an optional key — and `Annotated[..., Yaml(...)]`
says the rest: another key name, a reader of its own, a mapping's allowed keys, a field the caller
fills in. Checks that span fields live on the class, as `after_read(node)`. Every failure is a
MatrixError from `Node`, naming the file and the dotted key.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from maxtext_compat.matrix.yaml_node import Node

T = TypeVar("T")  # a TypeVar, not PEP 695's `def f[T]`: the package runs on Python 3.11


@dataclass(frozen=True)
class Yaml:
    """How one field is found and read, when its name and type do not say it all."""

    key: str | None = None  # the YAML key, when it differs from the field's name (`class`: a keyword)
    read: Callable[[Node], Any] | None = None  # a reader of its own (one node in, the value out)
    later: bool = False  # a key of this mapping that the caller reads after the rest (it needs them)
    given: bool = False  # not in the YAML at all: the caller passes it (the file's path, a mapping key)
    keys: tuple[str, ...] | None = None  # for a mapping: the only keys it may have


def parsed(parse: Callable[[str], Any], what: str) -> Yaml:
    """A non-empty string turned into a value by `parse`; `what` names the form in the error."""
    return Yaml(read=lambda node: node.parsed(parse, what))


def normalized_version(text: str) -> str:
    """A version kept as text, validated and in its normal form (`v0.2.5` is `0.2.5`)."""
    return str(Version(text))


# Types read from one string, and the words an error uses for them.
PARSED_TYPES: dict[type, tuple[Callable[[str], Any], str]] = {
    Version: (Version, "a PEP 440 version"),
    SpecifierSet: (SpecifierSet, "a version specifier"),
}


def read_struct(cls: type[T], node: Node, *, defaults: Mapping[str, Any] | None = None, **given: Any) -> T:
    """An instance of the dataclass `cls` from the mapping `node` (unknown keys refused first).

    `defaults` give fields whose key is absent or null a value (required fields included);
    `given` are the fields the YAML does not hold."""
    check_keys(cls, node)
    defaults = defaults or {}
    values: dict[str, Any] = {}
    for f in _fields(typing.cast(type, cls)):
        if f.yaml.given or f.yaml.later:
            continue
        child = node.optional(f.key) if f.optional or f.name in defaults else node.child(f.key)
        if child is not None:
            values[f.name] = f.reader(child)
        elif f.name in defaults:
            values[f.name] = defaults[f.name]
        elif not f.has_default:
            values[f.name] = None  # `X | None` without a default: absent or null is None
    obj = cls(**values, **given)
    check = getattr(obj, "after_read", None)
    if check is not None:
        check(node)
    return obj


def check_keys(cls: type, node: Node) -> None:
    """`node` is a mapping with no key `cls` does not declare (a typo would otherwise be ignored)."""
    node.only_keys({f.key for f in _fields(cls) if not f.yaml.given})


@dataclass(frozen=True)
class _Field:
    name: str
    key: str
    optional: bool
    has_default: bool
    yaml: Yaml
    reader: Callable[[Node], Any]


@functools.cache
def _fields(cls: type) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        yaml = _yaml_of(tp)
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        optional = has_default or _allows_none(tp)
        out.append(_Field(f.name, yaml.key or f.name, optional, has_default, yaml, reader_for(tp)))
    return tuple(out)


def reader_for(tp: Any) -> Callable[[Node], Any]:
    """The reader of a value of type `tp` (the node is present and not null)."""
    if get_origin(tp) is Annotated:
        yaml = _yaml_of(tp)
        if yaml.read is not None:
            return yaml.read
        inner = get_args(tp)[0]
        if yaml.keys is not None and get_origin(inner) in (Mapping, dict):
            return _mapping_reader(yaml.keys, reader_for(get_args(inner)[1]))
        return reader_for(inner)
    if _allows_none(tp):
        choices = [a for a in get_args(tp) if a is not type(None)]
        if len(choices) != 1:
            raise TypeError(f"no YAML reader for {tp!r}: a union may only add None to one type")
        return reader_for(choices[0])
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return lambda node: node.choice(args)
    if tp is str:
        return Node.nonempty_string
    if tp is bool:
        return Node.boolean
    if tp is int:
        return Node.integer
    if tp in PARSED_TYPES:
        parse, what = PARSED_TYPES[tp]
        return lambda node: node.parsed(parse, what)
    if origin in (tuple, frozenset) and (origin is frozenset or args[1:] == (Ellipsis,)):
        element = reader_for(args[0])
        return lambda node: origin(element(e) for e in node.elements())
    if origin in (Mapping, dict) and args[0] is str:
        return _mapping_reader(None, reader_for(args[1]))
    if dataclasses.is_dataclass(tp):
        return lambda node: read_struct(tp, node)  # type: ignore[arg-type]
    raise TypeError(f"no YAML reader for {tp!r}: annotate the field with Yaml(read=...)")


def _mapping_reader(keys: tuple[str, ...] | None, value: Callable[[Node], Any]) -> Callable[[Node], dict[str, Any]]:
    def read(node: Node) -> dict[str, Any]:
        if keys is not None:
            node.only_keys(set(keys))
        return {key: value(child) for key, child in node.items()}

    return read


def _yaml_of(tp: Any) -> Yaml:
    """The Yaml marker of an `Annotated[...]` type (an empty one when it has none)."""
    metadata = tp.__metadata__ if get_origin(tp) is Annotated else ()
    return next((m for m in metadata if isinstance(m, Yaml)), Yaml())


def _allows_none(tp: Any) -> bool:
    if get_origin(tp) is Annotated:
        return _allows_none(get_args(tp)[0])
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)
