"""A strict, path-tracking reader over safe-loaded YAML.

Why: compat_matrix.yaml is user-editable data read at run time. Any malformed document
must end in a `MatrixError` that names the file and the dotted key, never in a
`KeyError`/`TypeError` from deep inside the loader, and never in a silent default.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import yaml

from maxtext_compat.errors import MatrixError

T = TypeVar("T")
C = TypeVar("C", bound=str)


class _StrictSafeLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys (PyYAML keeps the last one silently)."""


def _construct_mapping_no_duplicates(loader: _StrictSafeLoader, node: yaml.MappingNode, deep: bool = False):
    # Explicit keys must be unique; keys brought in by a `<<:` merge may be overridden (YAML spec).
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                "found an unhashable key",
                key_node.start_mark,
            ) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r}",
                key_node.start_mark,
            )
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictSafeLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping_no_duplicates,  # type: ignore[arg-type]
)


def safe_load_text(text: str, path: str) -> Any:
    """Parse YAML with the safe loader only; every parser error becomes a MatrixError."""
    try:
        return yaml.load(text, Loader=_StrictSafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise MatrixError(
            f"not valid YAML for the safe loader{where}: {problem}",
            path=path,
            fix="fix the YAML syntax; only plain YAML is accepted (no !!python tags or other custom tags)",
        ) from None
    except Exception as exc:
        # PyYAML's safe constructors raise plain exceptions on odd tagged scalars
        # (`!!bool 1` KeyError, `!!int ''` IndexError, `!!timestamp x` AttributeError, huge dates ...).
        raise MatrixError(
            f"a value could not be read: {type(exc).__name__}: {exc}",
            path=path,
            fix="quote unusual scalars (dates, numbers) as strings",
        ) from None


_TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false", dict: "a mapping", list: "a list"}


class Node:
    """A value in the document together with its dotted key path."""

    def __init__(self, value: Any, key: str, path: str) -> None:
        self.value = value
        self.key = key
        self.path = path

    def error(self, message: str, *, expected: Any = None, fix: str | None = None) -> MatrixError:
        found = None if expected is None else _describe(self.value)
        if fix is None:
            fix = (
                f"set `{self.key or '<top level>'}` to {expected}"
                if expected is not None
                else (f"correct `{self.key or '<top level>'}` in {self.path}")
            )
        return MatrixError(message, path=self.path, key=self.key, expected=expected, found=found, fix=fix)

    # -- structure -------------------------------------------------------------------------------
    def mapping(self) -> dict[str, Any]:
        if not isinstance(self.value, dict):
            raise self.error("must be a mapping", expected="a mapping of names to values")
        for k in self.value:
            if not isinstance(k, str):
                raise self.error(f"has a non-string key {k!r}", expected="string keys", fix="quote the key")
        return self.value

    def child(self, name: str) -> Node:
        m = self.mapping()
        if name not in m:
            raise MatrixError(
                "required key is missing",
                path=self.path,
                key=self._join(name),
                fix=f"add `{name}:` under `{self.key or '<top level>'}`",
            )
        return Node(m[name], self._join(name), self.path)

    def optional(self, name: str) -> Node | None:
        m = self.mapping()
        if name not in m or m[name] is None:
            return None
        return Node(m[name], self._join(name), self.path)

    def has(self, name: str) -> bool:
        return name in self.mapping()

    def only_keys(self, allowed: set[str]) -> None:
        unknown = sorted(set(self.mapping()) - allowed)
        if unknown:
            raise MatrixError(
                f"unknown key(s) {unknown}",
                path=self.path,
                key=self.key,
                expected=f"only {sorted(allowed)}",
                found=unknown,
                fix="remove or rename the key (a typo here would otherwise be ignored silently)",
            )

    def child_at(self, index: int, name: str) -> Node:
        """`name` of the list element `index` (for errors that point into a list)."""
        return Node(self.value[index], f"{self.key}[{index}]", self.path).child(name)

    def items(self) -> Iterator[tuple[str, Node]]:
        for k, v in self.mapping().items():
            yield k, Node(v, self._join(k), self.path)

    def elements(self) -> Iterator[Node]:
        if not isinstance(self.value, list):
            raise self.error("must be a list", expected="a list")
        for i, v in enumerate(self.value):
            yield Node(v, f"{self.key}[{i}]", self.path)

    # -- scalars ---------------------------------------------------------------------------------
    def string(self) -> str:
        v = self.value
        if isinstance(v, _dt.date):  # YAML turns unquoted 2025-09-15 into a date
            return v.isoformat()
        if isinstance(v, float):  # unquoted 3.10 is the float 3.1: the version would be silently wrong
            raise self.error(
                "is a number, not a string (an unquoted version such as 3.10 reads as 3.1)",
                expected="a quoted string",
                fix=f'quote it, e.g. `{self.key.rsplit(".", 1)[-1]}: "{v}"`',
            )
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise self.error("must be a string", expected="a string")
        return str(v)

    def nonempty_string(self) -> str:
        s = self.string().strip()
        if not s:
            raise self.error("must not be empty", expected="a non-empty string")
        return s

    def boolean(self) -> bool:
        if not isinstance(self.value, bool):
            raise self.error("must be true or false", expected="true or false")
        return self.value

    def integer(self) -> int:
        if isinstance(self.value, bool) or not isinstance(self.value, int):
            raise self.error("must be an integer", expected="an integer")
        return self.value

    def choice(self, allowed: tuple[C, ...]) -> C:
        """The value, which must be one of `allowed` (returned as the element of `allowed` it equals)."""
        s = self.string()
        for option in allowed:
            if s == option:
                return option
        raise self.error("has an unknown value", expected=f"one of {list(allowed)}")

    def string_list(self) -> tuple[str, ...]:
        return tuple(n.nonempty_string() for n in self.elements())

    def string_map(self) -> dict[str, str]:
        return {k: n.string() for k, n in self.items()}

    def parsed(self, parse: Callable[[str], T], what: str) -> T:
        s = self.nonempty_string()
        try:
            return parse(s)
        except Exception as exc:
            raise self.error(f"is not {what}: {exc}", expected=what) from None

    def _join(self, name: str) -> str:
        return f"{self.key}.{name}" if self.key else name


def _describe(value: Any) -> str:
    for t, name in _TYPE_NAMES.items():
        if type(value) is t:
            text = repr(value)
            return f"{name} {text[:60]}" if t in (str, int, bool) else name
    if value is None:
        return "nothing (null)"
    return type(value).__name__
