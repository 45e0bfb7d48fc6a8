"""Our hints as beartype checks them, and, on the error path, which part of an argument broke which part.

Why containers are rewritten: beartype checks one random item of a container per call, so the same call could
pass once and fail the next, and the error path could not say which item was wrong. Here a container hint
(`Sequence[int]`, `dict[str, V]`, `tuple[int, ...]`) becomes its container type plus a validator over every
item: deterministic, complete, and `explain` names the item (`pages[3]`). Rules become `Is[...]` validators.
Iterables and iterators keep only their type: checking their items would consume them.
"""

from __future__ import annotations

import collections.abc as abc
import numbers
import types
import typing
from collections.abc import Callable
from typing import Any, NamedTuple

from maxtext_compat.contract.rules import Rule, is_int, is_number
from maxtext_compat.errors import ParamViolation
from maxtext_compat.locks import fork_safe_lock

_CONF: Any = None
_CONF_LOCK = fork_safe_lock()
_SEQUENCES = (abc.Sequence, abc.MutableSequence, abc.Collection, abc.Set, list, tuple, set, frozenset)
_MAPPINGS = (abc.Mapping, abc.MutableMapping, dict)


def conf() -> Any:
    """The project's BeartypeConf (importing beartype, ~250 ms, the first time)."""
    global _CONF
    with _CONF_LOCK:
        if _CONF is None:
            import beartype
            from beartype.vale import Is

            not_bool = Is[lambda x: not isinstance(x, bool)]
            _CONF = beartype.BeartypeConf(
                hint_overrides=beartype.FrozenDict(
                    {int: typing.Annotated[numbers.Integral, not_bool], float: typing.Annotated[numbers.Real, not_bool]}
                ),
                violation_param_type=ParamViolation,
                is_color=False,
            )
    return _CONF


def _fixed_tuple(origin: Any, args: tuple[Any, ...]) -> bool:
    return origin is tuple and bool(args) and not (len(args) == 2 and args[1] is Ellipsis)


def bearable(value: Any, hint: Any) -> bool:
    """Whether `hint` (ours) accepts `value`."""
    from beartype.door import is_bearable

    return bool(is_bearable(value, to_beartype(hint), conf=conf()))


def _tester(hint: Any) -> Callable[[Any], bool]:
    """A fast test of one item against `hint` (ours)."""
    if hint is Any:  # a class since Python 3.11: before the isinstance branch
        return lambda x: True
    if hint is int:
        return is_int
    if hint is float:
        return is_number
    if isinstance(hint, type) and hint not in (bool, numbers.Integral, numbers.Real):
        return lambda x: isinstance(x, hint)
    from beartype.door import is_bearable

    checked, c = to_beartype(hint), conf()
    return lambda x: bool(is_bearable(x, checked, conf=c))


_CONVERTED: dict[tuple[Any, bool], Any] = {}


def to_beartype(hint: Any, *, rules: bool = True) -> Any:
    """Our hint as beartype checks it (cached: beartype compiles one tester per hint object it is given)."""
    key = (hint, rules)
    try:
        return _CONVERTED[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable hint (a Literal of a list): converted every time
        return _convert(hint, rules)
    found = _CONVERTED[key] = _convert(hint, rules)
    return found


def _convert(hint: Any, rules: bool) -> Any:
    """Rules as `Is[...]` (dropped with rules=False), containers checked whole."""
    from beartype.vale import Is

    conf()
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        base = object if args[0] is Any else to_beartype(args[0], rules=rules)
        meta = [Is[_one_argument(m.check)] for m in args[1:] if isinstance(m, Rule)] if rules else []
        return typing.Annotated[(base, *meta)] if meta else base
    if origin in (typing.Union, types.UnionType):
        return typing.Union[tuple(to_beartype(a, rules=rules) for a in args)]  # noqa: UP007
    if _fixed_tuple(origin, args):
        return tuple[tuple(to_beartype(a, rules=rules) for a in args)]  # type: ignore[misc]
    if origin in _SEQUENCES and args:
        each = _tester(_strip(args[0]) if not rules else args[0])
        return typing.Annotated[origin, Is[lambda xs: all(each(x) for x in xs)]]
    if origin in _MAPPINGS and len(args) == 2:
        key, value = (_tester(_strip(a) if not rules else a) for a in args)
        return typing.Annotated[origin, Is[lambda m: all(key(k) and value(v) for k, v in m.items())]]
    return hint


def _strip(hint: Any) -> Any:
    """`hint` without its rules (for checking the type alone)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return _strip(args[0])
    if origin in (typing.Union, types.UnionType):
        return typing.Union[tuple(_strip(a) for a in args)]  # noqa: UP007
    if args and origin is not None and not isinstance(args[0], list) and origin is not typing.Literal:
        try:
            return origin[tuple(_strip(a) for a in args)]
        except TypeError:
            return hint
    return hint


def _one_argument(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """beartype's `Is[...]` takes a callable of exactly one parameter (a bound method or a default has more)."""
    return lambda value: check(value)


class Culprit(NamedTuple):
    """The part of an argument that broke its hint: where (`pages[3]`), what it had to be, what it was."""

    label: str
    hint: Any
    value: Any
    rule: Rule | None  # None: a wrong type; else the rule it broke (a type rule or a value rule)


def explain(value: Any, hint: Any, label: str) -> Culprit | None:
    """The innermost part of `value` that `hint` refuses (None: it accepts all of it)."""
    if bearable(value, hint):
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        inner = explain(value, args[0], label) if args[0] is not Any else None
        if inner is not None:  # the type is wrong: an item's own words, or this level's (its rules say more)
            return inner if inner.label != label else Culprit(label, hint, value, None)
        broken = [m for m in args[1:] if isinstance(m, Rule) and not m.check(value)]
        return Culprit(label, hint, value, broken[0] if broken else None)
    if origin in (typing.Union, types.UnionType):
        fitting = [a for a in args if bearable(value, _strip(a))]
        return explain(value, fitting[0], label) if len(fitting) == 1 else Culprit(label, hint, value, None)
    parts: list[tuple[Any, Any, str]] = []  # (item, its hint, its label) of a container that has the right type
    if _fixed_tuple(origin, args) and isinstance(value, tuple) and len(value) == len(args):
        parts = [(value[i], a, f"{label}[{i}]") for i, a in enumerate(args)]
    elif origin in _SEQUENCES and args and isinstance(value, origin):
        parts = [(x, args[0], f"{label}[{i}]") for i, x in enumerate(value)]
    elif origin in _MAPPINGS and len(args) == 2 and isinstance(value, origin):
        for k, v in value.items():
            parts += [(k, args[0], f"{label} key {k!r}"), (v, args[1], f"{label}[{k!r}]")]
    for item, item_hint, item_label in parts:
        found = explain(item, item_hint, item_label)
        if found is not None:
            return found
    return Culprit(label, hint, value, None)
