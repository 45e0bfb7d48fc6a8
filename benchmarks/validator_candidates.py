"""Which library validates the public API's arguments: per-call and import cost of the candidates.

    python benchmarks/validator_candidates.py      # in a venv with beartype, typeguard, pydantic, msgspec, numpy

Not part of `make bench`: the project installs only the one it chose (beartype), so this runs in a scratch
venv (docs/api-contract.md holds the numbers and the choice). Each candidate guards the same two functions:
`append(request_id: Hashable, q_len: PositiveInt)` (an allocator step: the cheapest public call) and
`build(seqs: Sequence[Slice], layout: Layout, *, max_num_tokens: PositiveInt | None, sm_scale: FiniteFloat)`
(five arguments, a container, a class, a union, a value rule). Per call: median of 15 rounds of 20,000 calls,
minus the bare function. Import: fresh processes, median of 15, minus `python -c pass`.
"""

from __future__ import annotations

import functools
import math
import numbers
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Annotated, Any

ROUNDS, CALLS, IMPORT_ROUNDS = 15, 20_000, 15
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the project's own row, from the checkout


class Slice:
    pass


class Layout:
    pass


def bare_append(request_id: Any, q_len: Any) -> None:
    return None


def bare_build(seqs: Any, layout: Any, *, max_num_tokens: Any = None, sm_scale: Any = 1.0) -> None:
    return None


def by_hand() -> tuple[Callable[..., None], Callable[..., None]]:
    """The reference: isinstance checks written out (what the code did case by case)."""

    def append(request_id: Any, q_len: Any) -> None:
        if not isinstance(request_id, Hashable):
            raise TypeError("request_id")
        if isinstance(q_len, bool) or not isinstance(q_len, numbers.Integral) or q_len < 1:
            raise TypeError("q_len")

    def build(seqs: Any, layout: Any, *, max_num_tokens: Any = None, sm_scale: Any = 1.0) -> None:
        if not isinstance(seqs, Sequence) or not all(isinstance(s, Slice) for s in seqs):
            raise TypeError("seqs")
        if not isinstance(layout, Layout):
            raise TypeError("layout")
        if max_num_tokens is not None and (
            isinstance(max_num_tokens, bool) or not isinstance(max_num_tokens, numbers.Integral) or max_num_tokens < 1
        ):
            raise TypeError("max_num_tokens")
        if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real) or not math.isfinite(sm_scale):
            raise TypeError("sm_scale")

    return append, build


def with_beartype() -> tuple[Callable[..., None], Callable[..., None]]:
    from beartype import beartype
    from beartype.vale import Is

    not_bool = Is[lambda x: not isinstance(x, bool)]
    positive = Annotated[numbers.Integral, not_bool, Is[lambda x: x >= 1]]
    finite = Annotated[numbers.Real, not_bool, Is[lambda x: math.isfinite(x)]]

    @beartype
    def append(request_id: Hashable, q_len: positive) -> None:  # type: ignore[valid-type]
        return None

    @beartype
    def build(seqs: Sequence[Slice], layout: Layout, *, max_num_tokens: positive | None = None,  # type: ignore[valid-type]
              sm_scale: finite = 1.0) -> None:  # type: ignore[valid-type]  # fmt: skip
        return None

    return append, build


def with_typeguard() -> tuple[Callable[..., None], Callable[..., None]]:
    """typeguard checks types only (it ignores Annotated metadata): the value rules are written by hand.

    Its decorator re-compiles the function from source, so the guarded functions are module-level (exec'd)."""
    import textwrap
    import types

    from typeguard import CollectionCheckStrategy, typechecked

    source = textwrap.dedent(
        """
        from collections.abc import Hashable, Sequence
        import math

        def append(request_id: Hashable, q_len: int) -> None:
            if q_len < 1:
                raise ValueError("q_len")

        def build(seqs: Sequence[Slice], layout: Layout, *, max_num_tokens: int | None = None,
                  sm_scale: float = 1.0) -> None:
            if max_num_tokens is not None and max_num_tokens < 1:
                raise ValueError("max_num_tokens")
            if not math.isfinite(sm_scale):
                raise ValueError("sm_scale")
        """
    )
    path = Path(tempfile.mkdtemp()) / "typeguard_candidates.py"
    path.write_text(source)
    module = types.ModuleType("typeguard_candidates")
    module.__file__ = str(path)
    module.Slice, module.Layout = Slice, Layout  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    exec(compile(source, str(path), "exec"), module.__dict__)
    guard = typechecked(collection_check_strategy=CollectionCheckStrategy.ALL_ITEMS)
    return guard(module.append), guard(module.build)  # type: ignore[attr-defined]


def with_pydantic() -> tuple[Callable[..., None], Callable[..., None]]:
    """pydantic's validate_call in strict mode (lax mode turns "16" into 16 and 16.0 into 16)."""
    from pydantic import ConfigDict, Field, validate_call

    config = ConfigDict(strict=True, arbitrary_types_allowed=True)

    @validate_call(config=config)
    def append(request_id: Hashable, q_len: Annotated[int, Field(ge=1)]) -> None:
        return None

    @validate_call(config=config)
    def build(seqs: Sequence[Slice], layout: Layout, *, max_num_tokens: Annotated[int, Field(ge=1)] | None = None,
              sm_scale: Annotated[float, Field(allow_inf_nan=False)] = 1.0) -> None:  # fmt: skip
        return None

    return append, build


def with_contract() -> tuple[Callable[..., None], Callable[..., None]]:
    """What the project uses: maxtext_compat.contract.checked (beartype, and errors turned into ours)."""
    from maxtext_compat.contract import FiniteFloat, PositiveInt, checked

    names = {"PositiveInt": PositiveInt, "FiniteFloat": FiniteFloat}
    globals().update(names)  # the annotations are strings, read in this module's namespace

    @checked
    def append(request_id: Hashable, q_len: PositiveInt) -> None:
        return None

    @checked
    def build(seqs: Sequence[Slice], layout: Layout, *, max_num_tokens: PositiveInt | None = None,
              sm_scale: FiniteFloat = 1.0) -> None:  # fmt: skip
        return None

    return append, build


def per_call(fn: Callable[[], Any]) -> float:
    """Median seconds per call over ROUNDS rounds of CALLS calls."""
    fn()
    samples = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        samples.append((time.perf_counter() - start) / CALLS)
    return statistics.median(samples)


def import_ms(code: str) -> float:
    def run(c: str) -> float:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", c], check=True, capture_output=True)
        return time.perf_counter() - start

    run(code)
    return statistics.median(run(code) - run("pass") for _ in range(IMPORT_ROUNDS)) * 1e3


SRC = str(Path(__file__).resolve().parents[1] / "src")
IMPORTS = {
    "by hand": "import numbers",
    "beartype": "from beartype import beartype; from beartype.vale import Is; from beartype.door import is_bearable",
    "typeguard": "from typeguard import typechecked",
    "pydantic validate_call": "from pydantic import validate_call, ConfigDict, Field",
    "msgspec": "import msgspec",
    "maxtext_compat.contract (beartype)": f"import sys; sys.path.insert(0, {SRC!r}); import maxtext_compat.contract",
}
# What the project's first checked call costs in a fresh process (beartype imported, the checker compiled).
FIRST_CALL = (
    IMPORTS["maxtext_compat.contract (beartype)"] + "; from maxtext_compat import paged; paged.PageAllocator(4, 4)"
)
FIRST_BASE = IMPORTS["maxtext_compat.contract (beartype)"] + "; from maxtext_compat import paged"


def msgspec_row() -> tuple[float, float]:
    """msgspec validates a Struct only when converting into it (construction checks nothing)."""
    import msgspec

    positive = Annotated[int, msgspec.Meta(ge=1)]
    Layout = msgspec.defstruct("Layout", [("num_pages", positive), ("page_size", positive)], frozen=True)

    raw = {"num_pages": 16, "page_size": 16}
    construct = per_call(lambda: Layout(16, 16))
    convert = per_call(lambda: msgspec.convert(raw, Layout))
    return construct, convert


def main() -> int:
    slices, layout = [Slice(), Slice()], Layout()
    base_append = per_call(lambda: bare_append("a", 3))
    base_build = per_call(lambda: bare_build(slices, layout, max_num_tokens=8, sm_scale=0.5))
    print("| candidate | append extra µs/call | build extra µs/call | import ms | refuses 16.0 / True / NaN |")
    print("|---|---|---|---|---|")
    for name, make in (("by hand", by_hand), ("beartype", with_beartype), ("typeguard", with_typeguard),
                       ("pydantic validate_call", with_pydantic),
                       ("maxtext_compat.contract (beartype)", with_contract)):  # fmt: skip
        append, build = make()
        a = (per_call(lambda append=append: append("a", 3)) - base_append) * 1e6
        b = (per_call(lambda build=build: build(slices, layout, max_num_tokens=8, sm_scale=0.5)) - base_build) * 1e6
        refused = []
        bads = (
            functools.partial(append, "a", 16.0),
            functools.partial(append, "a", True),
            functools.partial(build, slices, layout, sm_scale=math.nan),
        )
        for bad in bads:
            try:
                bad()
                refused.append("no")
            except Exception:
                refused.append("yes")
        print(f"| {name} | {a:.2f} | {b:.2f} | {import_ms(IMPORTS[name]):.1f} | {' / '.join(refused)} |", flush=True)
    first = import_ms(FIRST_CALL) - import_ms(FIRST_BASE)
    print(f"|  | the project's first checked call in a process: {first:.0f} ms (beartype imported, checker built) |")
    construct, convert = msgspec_row()
    print(
        f"| msgspec (Struct) | construct {construct * 1e6:.2f} µs, checks nothing | convert {convert * 1e6:.2f} µs"
        f" | {import_ms(IMPORTS['msgspec']):.1f} | only through msgspec.convert |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
