"""The contract mechanism (maxtext_compat.contract) and the pure-Python API under it, without jax or numpy.

What is accepted is decided once (docs/api-contract.md): an int is a Python or numpy integer, never a bool
nor a float; a float is any real number, never a bool; NaN and infinity only where no rule says finite.
Every refusal is our typed error naming the argument, the expected and the found value, and the fix, never
beartype's (the fuzz below feeds the allocator, the layout and the metadata builder arbitrary values).
The whole public API's coverage is tests/compat/test_api_contract_coverage.py (it needs numpy and jax).
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import subprocess
import sys
from collections.abc import Hashable, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maxtext_compat import paged
from maxtext_compat.contract import FiniteFloat, IntSequence, PositiveInt, checked, contract_of
from maxtext_compat.errors import CompatError, InvalidArgumentError, InvalidArgumentTypeError


@checked
def sized(n: PositiveInt, scale: FiniteFloat = 1.0, pad: float = 0.0, *, name: str | None = None) -> int:
    return int(n)


@checked
def pages_of(request_id: Hashable, pages: IntSequence) -> tuple[int, ...]:
    return tuple(pages)


@checked
def anything_in(items: Sequence[Any], table: dict[str, Any]) -> int:
    return len(items) + len(table)


class NumpyLikeInt:
    """An integer type registered as numbers.Integral, not an int subclass: numpy's np.int64 in the unit env."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __index__(self) -> int:
        return self.v

    def __int__(self) -> int:
        return self.v

    def __ge__(self, other: int) -> bool:
        return self.v >= other


numbers.Integral.register(NumpyLikeInt)


def _refusal(call, error=InvalidArgumentTypeError):
    with pytest.raises(CompatError) as info:
        call()
    assert type(info.value) is error, f"{type(info.value).__name__}: {info.value}"
    msg = str(info.value)
    assert msg.startswith(f"[{info.value.argument}]") and "Expected:" in msg and "Found:" in msg and "Fix:" in msg
    return info.value


def test_an_int_is_an_integer_of_any_kind_but_never_a_bool_or_a_float():
    assert sized(3) == 3 and sized(NumpyLikeInt(4)) == 4  # numpy integers are registered as numbers.Integral
    assert _refusal(lambda: sized(True)).argument == "n"
    err = _refusal(lambda: sized(16.0))
    assert err.found == "16.0 (float)" and "would be truncated" in err.fix and err.expected == "an int >= 1"
    assert "a str is not converted" in _refusal(lambda: sized("16")).fix
    assert _refusal(lambda: sized(0), InvalidArgumentError).fix == "pass n >= 1"


def test_a_float_is_any_real_number_and_nan_only_where_no_rule_says_finite():
    assert sized(1, scale=2, pad=math.nan) == 1  # an int is a real number; a NaN pad value is legitimate
    for bad in (math.nan, math.inf, -math.inf):
        assert "finite" in _refusal(lambda bad=bad: sized(1, scale=bad), InvalidArgumentError).expected
    assert _refusal(lambda: sized(1, scale=True)).argument == "scale"
    assert _refusal(lambda: sized(1, pad="0")).argument == "pad"


def test_every_item_of_a_page_list_is_checked_not_a_sample():
    assert pages_of("a", [1, 2, 3]) == (1, 2, 3)
    for i in range(50):  # beartype alone checks one random item of a container
        pages = [1] * 50
        pages[i] = 2.5
        assert _refusal(lambda p=pages: pages_of("a", p)).argument == f"pages[{i}]"  # the item, by its index
    assert _refusal(lambda: pages_of(["a"], [1])).argument == "request_id"  # a list is not hashable


def test_a_container_of_any_takes_any_items():
    """Found: on Python 3.11+ typing.Any is a class, and checking each item with isinstance(x, Any) raised."""
    assert anything_in([object(), None, 1.5], {"a": object()}) == 4
    assert _refusal(lambda: anything_in([1], {1: 2})).argument == "table key 1"


def test_a_call_that_does_not_fit_the_signature_is_typed_and_shows_it():
    err = _refusal(lambda: sized())
    assert err.argument == "arguments" and "sized(n, scale=1.0, pad=0.0, *, name=None)" in err.expected
    assert _refusal(lambda: sized(1, nme="x")).argument == "arguments"
    assert _refusal(lambda: paged.PageAllocator(16)).expected.startswith("PageAllocator(num_pages, page_size")


def test_a_typed_error_from_the_body_passes_unchanged():
    a = paged.PageAllocator(2, 4)
    with pytest.raises(InvalidArgumentError, match="unknown request"):
        a.free("nobody")  # the body's own error (a TypeError subclass too) is not taken for an arity error


def test_a_contextmanager_refuses_before_its_body_runs():
    ran = []

    @contextmanager
    @checked
    def block(value: str):
        ran.append(value)
        yield value

    assert _refusal(lambda: block(3)).argument == "value" and not ran
    with block("ok") as v:
        assert v == "ok"


def test_each_checked_callable_carries_its_contract():
    assert contract_of(paged.PageAllocator.append).where == "PageAllocator.append"
    assert contract_of(paged.KVCacheLayout.__init__).where == "KVCacheLayout"
    assert contract_of(paged.build_metadata).hints()["max_num_seqs"] is not None


def test_a_lazy_face_cannot_export_a_name_its_submodule_shadows():
    """Found: after `from maxtext_compat.decode import ComparisonRow`, `decode.compare` was the submodule
    decode/compare.py, not the function (the import system sets the attribute)."""
    from maxtext_compat._lazy import lazy_face

    with pytest.raises(ImportError, match=r"\['compare'\] share their names with submodules"):
        lazy_face("maxtext_compat", {"compare": "decode.compare"}, face="maxtext_compat.decode")


def test_importing_the_checked_api_imports_no_validation_library():
    code = (
        "import maxtext_compat, maxtext_compat.paged, maxtext_compat.kernel.rpa, maxtext_compat.adapters, "
        "maxtext_compat.shims, json, sys; print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert not [m for m in json.loads(out.splitlines()[-1]) if m.split(".")[0] == "beartype"]


# ----------------------------------------------------------------------------------------------
# Fuzz: arbitrary values into the pure-Python paged API are typed errors or right answers
# ----------------------------------------------------------------------------------------------

ANYTHING = st.one_of(
    st.integers(-3, 40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
    st.lists(st.one_of(st.integers(-2, 20), st.floats(0, 3), st.text(max_size=1)), max_size=4),
    st.tuples(st.integers(0, 20)),
    st.dictionaries(st.text(max_size=1), st.integers(), max_size=2),
)
FUZZ = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def _only_typed(call) -> None:
    with contextlib.suppress(CompatError):  # anything else (TypeError, AttributeError, beartype's) fails the test
        call()


@FUZZ
@given(a=ANYTHING, b=ANYTHING, c=ANYTHING, d=ANYTHING)
def test_the_allocator_takes_any_value_as_a_typed_error_or_a_right_answer(a, b, c, d):
    _only_typed(lambda: paged.PageAllocator(a, b))
    _only_typed(lambda: paged.PageAllocator(4, 4, seed=a, reserved=b if isinstance(b, (list, tuple)) else (b,)))
    alloc = paged.PageAllocator(8, 4)
    alloc.append("live", 3)
    _only_typed(lambda: alloc.append(a, b))
    _only_typed(lambda: alloc.allocate(c, d))
    _only_typed(lambda: alloc.block_table(a if isinstance(a, list) else ["live"], b, pad=c))
    _only_typed(lambda: alloc.free(a))


@FUZZ
@given(a=ANYTHING, b=ANYTHING, c=ANYTHING, d=ANYTHING)
def test_the_layout_and_the_metadata_builder_take_any_value_as_a_typed_error(a, b, c, d):
    _only_typed(lambda: paged.KVCacheLayout(a, b, 2, 128))
    _only_typed(lambda: paged.KVCacheLayout(4, 16, c, d, dtype=a))
    layout = paged.KVCacheLayout(16, 4, 2, 128)
    _only_typed(lambda: paged.SequenceSlice(a, b, c if isinstance(c, (list, tuple)) else (0,)))
    _only_typed(lambda: paged.build_metadata([paged.SequenceSlice(1, 1, (0,))], layout, max_num_tokens=a,
                                             max_num_seqs=b, pages_per_seq=c))  # fmt: skip
    _only_typed(lambda: paged.build_metadata(a, layout))
    _only_typed(lambda: paged.check_metadata(a, b, c, d, num_pages=16, page_size=4, max_num_tokens=8))


def test_the_issue_cases_are_typed_errors_naming_the_argument():
    """The raw errors the outside probing found (each was a bare TypeError from deep inside)."""
    alloc = paged.PageAllocator(16, 16)
    layout = paged.KVCacheLayout(16, 16, 2, 128)
    cases = {
        "num_pages": lambda: paged.PageAllocator(16.0, 16),
        "num_pages ": lambda: paged.PageAllocator("16", 16),
        "page_size": lambda: paged.PageAllocator(16, 16.5).append("a", 1),
        "q_len": lambda: alloc.append("a", q_len=2.5),
        "request_id": lambda: alloc.append(["a"], 3),
        "max_num_seqs": lambda: paged.build_metadata([alloc.append("b", 3)], layout, max_num_seqs=2.0),
    }
    for argument, call in cases.items():
        assert _refusal(call).argument == argument.strip()
