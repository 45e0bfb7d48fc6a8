"""A MaxText release's facts read from its code (a wheel, a source tree, the installed one): `maxtext-compat facts`.

Why: a new release, a checkout of main or a fork is supported by reading what its code says (signatures, returns,
the vLLM call) the way the shipped rows were read, never by importing it; the result is a draft matrix row.
"""

from maxtext_compat.matrix.facts.compare import differences, flat, row_facts
from maxtext_compat.matrix.facts.derive import ReleaseFacts, facts_of, read_facts
from maxtext_compat.matrix.facts.sources import ReleaseFiles, open_source

__all__ = [
    "ReleaseFacts",
    "ReleaseFiles",
    "differences",
    "facts_of",
    "flat",
    "open_source",
    "read_facts",
    "row_facts",
]
