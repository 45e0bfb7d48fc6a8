"""Which callables are MaxText's Attention, decoder layers, Decoder and Transformer: from compat_matrix.yaml.

Why from the matrix: it already lists every release's classes (under `MaxText` and `maxtext`); a second
list here would drift. A class's Linen factory (`attention_as_linen` next to `Attention`, `mla_as_linen`
next to `MLA`) builds the same kind of layer, so it is recognised by that naming rule.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["attention", "decoder_layer", "decoder", "transformer"]

# matrix `classes` keys -> the kind of call site they make
CLASS_KEYS: dict[str, Kind] = {
    "attention": "attention",
    "mla": "attention",
    "decoder": "decoder",
    "nnx_decoder": "decoder",
    "transformer": "transformer",
    "transformer_linen": "transformer",
}


@dataclass(frozen=True)
class Callees:
    """Dotted names (module.Class or module.factory) -> kind."""

    kinds: dict[str, Kind]

    def kind_of(self, qualified: str) -> Kind | None:
        return self.kinds.get(qualified)

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

    def add(ref: Any, kind: Kind) -> None:
        module, qualname = ref.module, ref.qualname
        kinds[f"{module}.{qualname}"] = kind
        if "." not in qualname:
            kinds[f"{module}.{_snake(qualname)}_as_linen"] = kind

    for row in m.maxtext:
        for key, kind in CLASS_KEYS.items():
            ref = row.classes.get(key)
            if ref is not None:
                add(ref, kind)
        for ref in row.decoder_layers.values():
            add(ref, "decoder_layer")
    return Callees(kinds)
