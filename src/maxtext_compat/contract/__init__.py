"""The public API's contract: every argument checked against its type hint and value rules at the boundary.

    from maxtext_compat.contract import checked, PositiveInt

    @checked
    def allocate(request_id: Hashable, num_tokens: NonNegativeInt) -> tuple[int, ...]: ...

Importing this package imports no validation library; the first call of a checked callable does
(see contract.check). docs/api-contract.md says what is accepted and why.
"""

from __future__ import annotations

from maxtext_compat.contract.check import checked, contract_of, takes_arguments
from maxtext_compat.contract.rules import (
    Array,
    FiniteFloat,
    IntSequence,
    LazyType,
    NonNegativeInt,
    PositiveInt,
    Rule,
    is_int,
    is_number,
)

__all__ = [
    "Array",
    "FiniteFloat",
    "IntSequence",
    "LazyType",
    "NonNegativeInt",
    "PositiveInt",
    "Rule",
    "checked",
    "contract_of",
    "is_int",
    "is_number",
    "takes_arguments",
]
