"""Which callables are MaxText's Attention, decoder layers, Decoder and Transformer, and what a new call of
each returns: from compat_matrix.yaml.

Why from the matrix: it already lists every release's classes (under `MaxText` and `maxtext`) and their returns;
a second list here would drift. A class's Linen factory (`attention_as_linen` next to `Attention`, `mla_as_linen`
next to `MLA`) builds the same kind of layer, so it is recognised by that naming rule.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from maxtext_compat.convention.kinds import CLASS_KINDS, KindName
from maxtext_compat.matrix.returns import ReturnShape, caller_shape, one_shape

Kind = KindName
CLASS_KEYS: dict[str, Kind] = dict(CLASS_KINDS)  # the matrix's class keys -> the kind of call site they make


@dataclass(frozen=True)
class Callees:
    """Dotted names (module.Class or module.factory) -> kind."""

    kinds: dict[str, Kind]
    # name -> {release: its `returns:` spelling} for the releases that take KV arguments and list the class
    returns: dict[str, dict[str, str]] = field(default_factory=dict)

    def kind_of(self, qualified: str) -> Kind | None:
        return self.kinds.get(qualified)

    def new_return(self, qualified: str) -> ReturnShape | None:
        """What a new call of `qualified` returns: the one spelling every release listing it gives (the new
        convention's, as the backport gives it, when none takes KV arguments); None when releases differ."""
        spellings = self.returns.get(qualified)
        if not spellings:
            return caller_shape(self.kinds[qualified], new=True)
        return one_shape(list(spellings.values()))

    def returns_by_release(self, qualified: str) -> str:
        """`release: spelling` for each release listing `qualified` (what a refusal shows)."""
        return ", ".join(f"{r}: {s}" for r, s in sorted(self.returns.get(qualified, {}).items()))

    @property
    def short_names(self) -> frozenset[str]:
        """The last part of every name: a file that contains none of them cannot name a MaxText layer."""
        return frozenset(name.rsplit(".", 1)[-1] for name in self.kinds)

    @functools.cached_property
    def prefixes(self) -> frozenset[str]:
        """Every dotted prefix of every name (`MaxText`, `MaxText.layers`, ... the name itself)."""
        parts = (name.split(".") for name in self.kinds)
        return frozenset(".".join(p[:i]) for p in parts for i in range(1, len(p) + 1))

    def defined_in(self, module: str | None) -> bool:
        """Whether module `module` (a dotted name, None outside a package) defines one of the classes."""
        return module is not None and any(name.startswith(f"{module}.") for name in self.kinds)

    def may_lead_to(self, qualified: str) -> bool:
        """Whether a name bound to `qualified` (an imported module or object) can reach one of the classes."""
        return qualified in self.prefixes or any(qualified.startswith(f"{name}.") for name in self.kinds)


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def from_matrix(matrix: Any = None) -> Callees:
    from maxtext_compat.matrix import load_matrix

    m = matrix if matrix is not None else load_matrix()
    kinds: dict[str, Kind] = {}
    returns: dict[str, dict[str, str]] = {}

    def add(ref: Any, kind: Kind, row: Any) -> None:
        module, qualname = ref.module, ref.qualname
        names = [f"{module}.{qualname}"]
        if "." not in qualname:
            names.append(f"{module}.{_snake(qualname)}_as_linen")
        spelling = row.returns.get(kind) if row.has_kv_params and kind != "transformer" else None
        for name in names:
            kinds[name] = kind
            if spelling is not None:
                returns.setdefault(name, {})[row.name] = spelling

    for row in m.maxtext:
        for key, kind in CLASS_KEYS.items():
            ref = row.classes.get(key)
            if ref is not None:
                add(ref, kind, row)
        for ref in row.decoder_layers.values():
            add(ref, "decoder_layer", row)
    return Callees(kinds, returns)
