"""One test case per MaxText call convention, each with a concrete matrix row (the plugin's `maxtext_convention`).

Why a row per convention: a convention-level test (a fake module through the adapters, serving
code unpacking returns) needs a real row to adapt against. The newest release of a convention is
the one users meet; `releases` names every release the case stands for. Pure python, no jax.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from maxtext_compat.errors import InvalidArgumentError
from maxtext_compat.matrix import CONVENTIONS, CompatMatrix, MaxTextRow


@dataclass(frozen=True)
class ConventionCase:
    """A convention (`legacy`, `kv_return`, `kv_scan_carry`) and the matrix row that represents it."""

    name: str
    row: MaxTextRow
    releases: tuple[str, ...]
    forced: bool = False  # the row came from --maxtext-compat-row

    @property
    def returns(self) -> Mapping[str, str | None]:
        """Return shape per layer kind, as the matrix spells it (e.g. attention: '(out, kv_cache)')."""
        return self.row.returns

    @property
    def is_legacy(self) -> bool:
        """Before MaxText PR #2616: no kv_cache / attention_metadata parameters natively."""
        return self.name == "legacy"

    @property
    def scan_kv_carry(self) -> bool:
        """Scanned decoder layers carry the stacked KV caches (0.2.2+)."""
        return self.row.scan_kv_carry

    def adapted_class(self, cls: type, *, kind: str | None = None) -> type:
        """`cls` (a MaxText class or a fake with a release's signature) adapted as on this row."""
        from maxtext_compat.adapters.wrapper import adapted_class

        return adapted_class(cls, row=self.row, kind=kind)

    def versions(self) -> dict[str, str]:
        """The hypothetical versions this case stands for (for `maxtext_compat.resolve(...)`)."""
        return {"maxtext": self.row.name}

    def __str__(self) -> str:
        return f"{self.name} (MaxText {self.row.name})"


def convention_cases(matrix: CompatMatrix, forced_row: MaxTextRow | None = None) -> dict[str, ConventionCase]:
    """Every convention the matrix lists, in CONVENTIONS order; only the forced row's one when forced."""
    if forced_row is not None:
        same = tuple(r.name for r in matrix.maxtext if r.convention == forced_row.convention)
        return {forced_row.convention: ConventionCase(forced_row.convention, forced_row, same, forced=True)}
    cases: dict[str, ConventionCase] = {}
    for name in CONVENTIONS:
        rows = sorted((r for r in matrix.maxtext if r.convention == name), key=lambda r: r.release)
        if rows:
            cases[name] = ConventionCase(name, rows[-1], tuple(r.name for r in rows))
    return cases


def convention_case(name: Any, matrix: CompatMatrix, forced_row: MaxTextRow | None = None) -> ConventionCase:
    """The case for `name`; a typed error naming the valid choices otherwise."""
    cases = convention_cases(matrix, forced_row)
    if isinstance(name, ConventionCase):
        name = name.name
    if name in cases:
        return cases[name]
    if forced_row is not None and name in CONVENTIONS:
        raise InvalidArgumentError(
            f"convention {name!r} is not the convention of the forced row MaxText {forced_row.name}",
            argument="maxtext_convention",
            expected=repr(forced_row.convention),
            found=repr(name),
            fix="drop --maxtext-compat-row, or force a row of that convention",
        )
    raise InvalidArgumentError(
        "unknown MaxText call convention",
        argument="maxtext_convention",
        expected=f"one of {list(cases)}",
        found=repr(name),
        fix="parametrize maxtext_convention indirectly with names from compat_matrix.yaml",
    )
