"""Package faces that import their contents on first use (`import maxtext_compat.x` stays light).

Why one helper: every face needs the same three things (an export table, `__getattr__` that imports the
owning module once, `__dir__` that lists the exports); written once, no face forgets one of them.
Type checkers and IDEs see the names through each face's `if TYPE_CHECKING:` imports.

`on_first_call` does the same for one function's wrapper: `maxtext_compat.resolve` is `@checked`, and the
contract package (typing, inspect and its rules, ~20 ms) is imported at the first call, not by the import.
"""

from __future__ import annotations

import functools
import importlib

TYPE_CHECKING = False  # not typing's: this module is part of `import maxtext_compat` (see errors.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar

    F = TypeVar("F", bound=Callable[..., Any])


def lazy_face(
    package: str,
    exports: dict[str, str],
    *,
    face: str | None = None,
    before_first: Callable[[str], None] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(`__getattr__`, `__dir__`) for the face `face` (default `package`): name -> the module, relative to
    `package`, that defines it.

    `before_first(module)` runs before a module is imported through the face (e.g. registering built-in
    profiles the first time the profile API is reached)."""
    module = importlib.import_module(face or package)
    # A name that is also a submodule's would be shadowed by the submodule once it is imported (the import
    # system sets the attribute), and `from face import name` would hand out the module: refused here.
    shadowed = sorted(set(exports) & {owner.rpartition(".")[2] for owner in exports.values()})
    if shadowed:
        raise ImportError(f"{module.__name__}: exports {shadowed} share their names with submodules; rename one")

    def __getattr__(name: str) -> Any:
        owner = exports.get(name)
        if owner is None:
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
        if before_first is not None:
            before_first(owner)
        value = getattr(importlib.import_module(f"{package}.{owner}"), name)
        setattr(module, name, value)  # the next lookup does not come here
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(module), *exports})

    return __getattr__, __dir__


# The attribute holding a deferred wrapper's `make`: contract_of builds the real wrapper through it.
ON_FIRST_CALL = "__mc_on_first_call__"


def on_first_call(fn: F, make: Callable[[F], Callable[..., Any]]) -> F:
    """A stand-in for `make(fn)` (e.g. `contract.checked`) that runs `make` at its first call, not now.

    Two threads calling first may both run `make`: each gets an equivalent wrapper, the last one is kept."""
    made: Callable[..., Any] | None = None

    def build() -> Callable[..., Any]:
        nonlocal made
        if made is None:
            made = make(fn)
        return made

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return (made or build())(*args, **kwargs)

    setattr(wrapper, ON_FIRST_CALL, build)
    return wrapper  # type: ignore[return-value]
