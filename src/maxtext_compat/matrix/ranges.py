"""tpu-inference version ranges as intervals: each range one interval, no version in two rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from maxtext_compat.matrix.yaml_node import Node

# The operators a tpu_inference range may use: each range is then one interval of versions, and
# the rows can be checked for overlap exactly, by sorting them and sweeping once (n log n).
_RANGE_OPS = (">=", ">", "<=", "<", "==")


@dataclass(frozen=True)
class Interval:
    lo: Version | None  # None: unbounded
    lo_incl: bool
    hi: Version | None
    hi_incl: bool


def interval(versions: SpecifierSet, node: Node) -> Interval:
    """The one interval `versions` spans; a bound other than a plain one, or an empty range, is an error."""
    lo: Version | None = None
    hi: Version | None = None
    lo_incl = hi_incl = False
    for spec in versions:
        if spec.operator not in _RANGE_OPS or spec.version.endswith(".*"):
            raise node.error(
                f"uses {spec}, which is not a plain bound",
                expected=f"bounds with {', '.join(_RANGE_OPS)} (no wildcards, ~=, != or ===), e.g. >=0.31.0,<0.33.0",
                fix="write the range as a lower and an upper bound",
            )
        v = Version(spec.version)
        if spec.operator in (">=", ">", "=="):
            incl = spec.operator != ">"
            if lo is None or v > lo or (v == lo and not incl):
                lo, lo_incl = v, incl
        if spec.operator in ("<=", "<", "=="):
            incl = spec.operator != "<"
            if hi is None or v < hi or (v == hi and not incl):
                hi, hi_incl = v, incl
    if lo is not None and hi is not None and (lo > hi or (lo == hi and not (lo_incl and hi_incl))):
        raise node.error(
            f"the range {versions} contains no version",
            expected="a lower bound below the upper bound",
            fix="correct the bounds",
        )
    return Interval(lo, lo_incl, hi, hi_incl)


def check_disjoint(ranges: Sequence[SpecifierSet], node: Node) -> None:
    """No version may fall in two rows: sort the intervals by lower bound, sweep keeping the highest end."""
    spans = [(interval(r, node.child_at(i, "versions")), i) for i, r in enumerate(ranges)]

    def start(item: tuple[Interval, int]) -> tuple[int, Version, int]:
        iv = item[0]
        return (0, Version("0"), 0) if iv.lo is None else (1, iv.lo, 0 if iv.lo_incl else 1)

    spans.sort(key=start)
    reach: tuple[Interval, int] | None = None  # the interval seen so far that ends highest
    for iv, i in spans:
        if reach is not None:
            end = reach[0]
            overlap = (
                end.hi is None or iv.lo is None or iv.lo < end.hi or (iv.lo == end.hi and iv.lo_incl and end.hi_incl)
            )
            if overlap:
                j = reach[1]
                raise node.error(
                    f"version ranges overlap: tpu_inference[{j}] {ranges[j]} and tpu_inference[{i}] {ranges[i]}",
                    fix="make the tpu_inference `versions` ranges disjoint",
                )
            if iv.hi is None or (iv.hi, iv.hi_incl) > (end.hi, end.hi_incl):
                reach = (iv, i)
        else:
            reach = (iv, i)
