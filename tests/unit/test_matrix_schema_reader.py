"""The schema reader: a dataclass's own field declarations decide how each YAML key is read.

Every annotation form the matrix uses is read into the declared value and refused with a MatrixError naming the
dotted key (never a TypeError from the dataclass, never a silent default); every struct of the shipped matrix
resolves a reader for every field, so a field whose type the reader does not know fails here, not at a user's load.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Literal

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from maxtext_compat.errors import MatrixError
from maxtext_compat.matrix import CompatMatrix
from maxtext_compat.matrix.schema import Yaml, read_struct, reader_for
from maxtext_compat.matrix.yaml_node import Node

pytestmark = pytest.mark.envs("unit")


@dataclass(frozen=True)
class Inner:
    name: str
    level: int = 1


@dataclass(frozen=True)
class Sample:
    title: str
    flag: bool
    mode: Literal["a", "b"]
    tags: tuple[str, ...]
    members: frozenset[str]
    inner: Inner
    items: tuple[Inner, ...]
    release: Version
    spec: SpecifierSet
    by_name: Mapping[str, int]
    limited: Annotated[Mapping[str, str], Yaml(keys=("x", "y"))]
    renamed: Annotated[str, Yaml(key="class")]
    maybe: str | None
    source: Annotated[str, Yaml(given=True)]
    later: Annotated[str, Yaml(later=True)] = "filled by the caller"
    doubled: Annotated[int, Yaml(read=lambda n: 2 * n.integer())] = 0
    note: str = "default"
    extra: Inner = field(default_factory=lambda: Inner("d"))

    def after_read(self, node: Node) -> None:
        if self.mode == "b" and not self.flag:
            raise node.child("mode").error("b needs flag", fix="set flag: true")


GOOD = {
    "title": "t", "flag": True, "mode": "b", "tags": ["p", "q"], "members": ["m", "m", "n"],
    "inner": {"name": "i"}, "items": [{"name": "j", "level": 3}], "release": "0.2.5.0", "spec": ">=0.31,<0.33",
    "by_name": {"k": 1}, "limited": {"x": "1"}, "class": "C", "later": "ignored: read by the caller",
    "doubled": 21,
}  # fmt: skip


def read(doc: object) -> Sample:
    return read_struct(Sample, Node(yaml.safe_load(yaml.safe_dump(doc)), "", "f.yaml"), source="f.yaml")


def test_every_annotation_form_reads_the_value_it_declares():
    s = read(GOOD)
    assert (s.title, s.flag, s.mode, s.tags, s.members) == ("t", True, "b", ("p", "q"), frozenset({"m", "n"}))
    assert s.inner == Inner("i", 1) and s.items == (Inner("j", 3),)
    assert s.release == Version("0.2.5") and s.spec == SpecifierSet(">=0.31,<0.33")
    assert (dict(s.by_name), dict(s.limited), s.renamed) == ({"k": 1}, {"x": "1"}, "C")
    assert (s.maybe, s.source, s.later, s.doubled, s.note, s.extra) == (
        None, "f.yaml", "filled by the caller", 42, "default", Inner("d")
    )  # fmt: skip


def test_null_is_absent_for_an_optional_field_and_an_error_for_a_required_one():
    assert read({**GOOD, "maybe": None, "note": None}).note == "default"
    with pytest.raises(MatrixError) as e:
        read({**GOOD, "title": None})
    assert e.value.key == "title" and "must be a string" in str(e.value)


def test_defaults_fill_absent_keys_even_required_ones_and_the_yaml_wins_where_present():
    doc = {k: v for k, v in GOOD.items() if k not in ("title", "note")}
    s = read_struct(
        Sample, Node(doc, "", "f.yaml"), defaults={"title": "from a base", "note": "n", "flag": False}, source="f"
    )
    assert (s.title, s.note, s.flag) == ("from a base", "n", True)
    with pytest.raises(MatrixError) as e:
        read(doc)  # without defaults, title is required
    assert e.value.key == "title" and "required key is missing" in str(e.value)


BAD = [
    # (change, dotted key named, words in the message)
    ({"title": ""}, "title", "must not be empty"),
    ({"flag": "yes"}, "flag", "true or false"),
    ({"mode": "c"}, "mode", "one of ['a', 'b']"),
    ({"tags": "p"}, "tags", "must be a list"),
    ({"tags": ["p", 3.1]}, "tags[1]", "is a number"),
    ({"inner": {"name": "i", "colour": 1}}, "inner", "unknown key(s) ['colour']"),
    ({"inner": {}}, "inner.name", "required key is missing"),
    ({"items": [{"name": "j", "level": "3"}]}, "items[0].level", "must be an integer"),
    ({"release": "not a version"}, "release", "a PEP 440 version"),
    ({"spec": "~~1"}, "spec", "a version specifier"),
    ({"by_name": {"k": "1"}}, "by_name.k", "must be an integer"),
    ({"limited": {"z": "1"}}, "limited", "unknown key(s) ['z']"),
    ({"renamed": "C"}, "", "unknown key(s) ['renamed']"),  # the YAML key is `class`, not the field name
    ({"source": "x"}, "", "unknown key(s) ['source']"),  # a given field is not in the YAML
    ({"doubled": "21"}, "doubled", "must be an integer"),
    ({"flag": False}, "mode", "b needs flag"),  # after_read: a check across fields
]


@pytest.mark.parametrize(("change", "key", "words"), BAD, ids=[k or "top" for _, k, _ in BAD])
def test_wrong_input_is_a_matrix_error_naming_the_key(change, key, words):
    with pytest.raises(MatrixError) as e:
        read({**GOOD, **change})
    assert e.value.key == key and words in str(e.value) and e.value.path == "f.yaml"


def test_a_missing_required_key_is_named_with_where_to_add_it():
    doc = dict(GOOD)
    del doc["class"]
    with pytest.raises(MatrixError) as e:
        read(doc)
    assert e.value.key == "class" and "add `class:` under `<top level>`" in str(e.value)


def test_an_annotation_the_reader_does_not_know_is_refused_when_the_reader_is_built():
    with pytest.raises(TypeError, match="no YAML reader"):
        reader_for(complex)
    with pytest.raises(TypeError, match="only add None to one type"):
        reader_for(str | int | None)


def _structs(cls: type, seen: set[type]) -> None:
    """Every dataclass reachable from `cls` through its fields' types."""
    if cls in seen:
        return
    seen.add(cls)
    import typing

    for hint in typing.get_type_hints(cls).values():
        for arg in [hint, *typing.get_args(hint), *(a for h in typing.get_args(hint) for a in typing.get_args(h))]:
            if dataclasses.is_dataclass(arg) and isinstance(arg, type):
                _structs(arg, seen)


def test_every_field_of_every_matrix_struct_has_a_reader():
    seen: set[type] = set()
    _structs(CompatMatrix, seen)
    assert len(seen) >= 12, sorted(c.__name__ for c in seen)  # the matrix, its rows and their parts
    import typing

    for cls in seen:
        for name, hint in typing.get_type_hints(cls, include_extras=True).items():
            assert callable(reader_for(hint)), f"{cls.__name__}.{name}"
