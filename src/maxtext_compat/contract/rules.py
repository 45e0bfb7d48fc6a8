"""Value rules declared beside the type: `Annotated[int, Rule(...)]`, and the hints the public API shares.

Why our own marker and not beartype's `Is[...]` directly: a rule carries the words of its error (what is
expected, how to fix it) as well as its check, and importing beartype costs ~250 ms; the rules are plain
objects here and become beartype validators only when a checked callable is first called (contract.check).

Numbers, decided once for the whole API (docs/api-contract.md):
- `int` accepts Python and numpy integer scalars (np.int64 page ids and counts are common), never a bool
  (True is not a count) nor a float, even a whole one (16.0 would be truncated somewhere);
- `float` accepts any real number (int, numpy scalars), never a bool; NaN and infinity pass unless the
  parameter declares `Finite` (a NaN pad value is legitimate, a NaN scale is not).
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any


@dataclass(frozen=True)
class Rule:
    """A value rule: `check(value)` must hold; `expected` and `fix` are the error's words (the fix may use
    `{name}` for the argument's name)."""

    expected: str
    check: Callable[[Any], bool]
    fix: str = ""
    is_type: bool = False  # breaking it is a wrong type (InvalidArgumentTypeError), not a wrong value

    def fix_for(self, name: str) -> str:
        return (self.fix or f"pass {{name}} as {self.expected}").format(name=name)


def is_int(x: object) -> bool:
    """An integer as the API accepts one: Python or numpy integer scalar, not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_number(x: object) -> bool:
    """A real number as the API accepts one: int, float or numpy scalar, not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _all_ints(xs: Sequence[Any]) -> bool:
    return all(is_int(x) for x in xs)


def _has_shape_and_dtype(x: object) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


PositiveInt = Annotated[int, Rule("an int >= 1", lambda x: x >= 1, "pass {name} >= 1")]
NonNegativeInt = Annotated[int, Rule("an int >= 0", lambda x: x >= 0, "pass {name} >= 0")]
FiniteFloat = Annotated[float, Rule("a finite number (not NaN or infinity)", lambda x: math.isfinite(x))]
# Every item checked (beartype samples one item of a container per call: a page list needs them all).
IntSequence = Annotated[
    Sequence[int],
    Rule(
        "a sequence of ints (Python or numpy integers: a float would be truncated)",
        _all_ints,
        "pass {name} as ints, e.g. [int(p) for p in {name}]; a float page id or length is never rounded",
        is_type=True,
    ),
]
Array = Annotated[
    Any,
    Rule(
        "an array with .shape and .dtype (a numpy or jax array)",
        _has_shape_and_dtype,
        "pass {name} as an array: jnp.asarray({name}) (or np.asarray), not a Python list",
        is_type=True,
    ),
]


def all_of(what: str, ok: Callable[[Any], bool], fix: str = "") -> Rule:
    """A type rule over every item of a sequence (`what`: the sequence in words, e.g. "a list of SequenceSlices")."""
    return Rule(what, lambda xs: all(ok(x) for x in xs), fix, is_type=True)


class LazyType:
    """A class named by its module and name, resolved when a value is checked (TYPE_CHECKING-only names).

    Why: `Mesh` is imported under TYPE_CHECKING so `import maxtext_compat.paged` does not import jax; a value
    can only be an instance when its module is already imported, so the check never imports it either."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def isinstance(self, value: object) -> bool:
        mod = sys.modules.get(self.module)
        cls = getattr(mod, self.name, None) if mod is not None else None
        return isinstance(cls, type) and isinstance(value, cls)

    def hint(self) -> Any:
        return Annotated[Any, Rule(f"a {self.module}.{self.name}", self.isinstance, is_type=True)]


# Names the public API imports only under TYPE_CHECKING, resolved by module when a value is checked.
LAZY_TYPES: dict[str, LazyType] = {
    "Mesh": LazyType("jax.sharding", "Mesh"),
    "NamedSharding": LazyType("jax.sharding", "NamedSharding"),
    "Resolution": LazyType("maxtext_compat.resolution.resolver", "Resolution"),
    "CompatMatrix": LazyType("maxtext_compat.matrix.types", "CompatMatrix"),
}
