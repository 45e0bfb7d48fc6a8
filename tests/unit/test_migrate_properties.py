"""`migrate` invariants on generated modules: call sites of every kind, binding style and use, mixed.

The oracle is independent of the codemod: each generated site knows, from how it was generated, whether it
can be moved (a plain assignment of the old arity) and whether its function threads the KV arguments. Then:
* every site is found once, rewritten exactly when the oracle says it can be, and manual otherwise;
* the output parses, a second run changes nothing, and every moved call names its KV arguments (with None
  where the function has none to thread), so no moved call can be read in the old convention;
* `--to legacy` gives back the original text where nothing was threaded (threaded caches are used, so
  they stay, listed as manual).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import pytest

pytest.importorskip("libcst")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maxtext_compat.migrate.callees import from_matrix
from maxtext_compat.migrate.codemod import migrate_source

pytestmark = pytest.mark.envs("unit")  # the codemod reads the shipped matrix, not the installed release: once per run

CALLEES = from_matrix()
IMPORTS = (
    "from MaxText.layers.attentions import Attention as Attn\n"
    "from MaxText.layers.llama2 import LlamaDecoderLayer\n"
    "from MaxText.layers.decoders import Decoder\n"
)
KINDS = {  # kind: (constructor, old arity, KV argument)
    "attention": ("Attn(config=cfg)", 1, "kv_cache"),
    "decoder_layer": ("LlamaDecoderLayer(config=cfg)", 1, "kv_cache"),
    "decoder": ("Decoder(config=cfg)", 2, "kv_caches"),
}
USES = ("assign", "return", "expression", "argument")


@dataclass(frozen=True)
class Site:
    kind: str
    binding: str  # "inline", "local" or "self"
    use: str
    args: tuple[str, ...]
    threads: bool  # the function takes the KV arguments (and this is its only call of the kind)

    @property
    def movable(self) -> bool:
        return self.use == "assign"


def _call(site: Site, callee: str) -> str:
    return f"{callee}({', '.join(site.args)})"


def _function(index: int, site: Site) -> str:
    ctor, arity, kv = KINDS[site.kind]
    params = ["cfg", "x"] + ([kv, "attention_metadata"] if site.threads else [])
    body = []
    if site.binding == "inline":
        callee = ctor
    elif site.binding == "local":
        body.append(f"layer = {ctor}")
        callee = "layer"
    else:
        callee = "self.layer"
    call = _call(site, callee)
    names = ", ".join(f"r{i}" for i in range(arity))
    if site.use == "assign":
        body += [f"{names} = {call}", "return r0"]
    elif site.use == "return":
        body.append(f"return {call}")
    elif site.use == "expression":
        body.append(f"y = {call} + 1")
        body.append("return y")
    else:
        body.append(f"y = print({call})")
        body.append("return y")
    if site.binding == "self":
        init = f"    def __init__(self, cfg):\n        self.layer = {ctor}\n\n"
        method = f"    def __call__(self, {', '.join(params)}):\n" + "".join(f"        {b}\n" for b in body)
        return f"class Block{index}:\n{init}{method}"
    return f"def f{index}({', '.join(params)}):\n" + "".join(f"    {b}\n" for b in body)


sites = st.builds(
    Site,
    kind=st.sampled_from(sorted(KINDS)),
    binding=st.sampled_from(("inline", "local", "self")),
    use=st.sampled_from(USES),
    args=st.lists(st.sampled_from(("x", "x", "None", "deterministic=True", 'model_mode="train"')), max_size=3).map(
        lambda a: tuple(sorted(a, key=lambda v: "=" in v))  # positional arguments first
    ),
    threads=st.booleans(),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(sites, min_size=1, max_size=5))
def test_generated_modules(generated):
    code = IMPORTS + "\n\n" + "\n\n".join(_function(i, s) for i, s in enumerate(generated))
    new = migrate_source(code, CALLEES, "kv_return")
    ast.parse(new.code)
    assert len(new.sites) == len(generated)
    for want, got in zip(generated, new.sites, strict=True):  # sites come in source order, one per function
        assert got.kind == want.kind
        assert got.change == ("rewritten" if want.movable else "manual"), (want, got)
    for want, line in zip(generated, _moved_lines(new.code), strict=True):
        if want.movable:
            kv = KINDS[want.kind][2]
            given_kv = kv if want.threads else "None"
            given_md = "attention_metadata" if want.threads else "None"
            assert f"{kv}={given_kv}" in line and f"attention_metadata={given_md}" in line, line
    again = migrate_source(new.code, CALLEES, "kv_return")
    assert again.code == new.code and not again.changed
    back = migrate_source(new.code, CALLEES, "legacy")
    if not any(s.movable and s.threads for s in generated):
        assert back.code == code
    else:
        kept = [s for s in back.sites if s.change == "manual" and "KV result is used" in s.detail]
        assert len(kept) == sum(s.movable and s.threads for s in generated)


def _moved_lines(code: str) -> list[str]:
    """Per generated function, its `r0... = call` line ("" where the result is used otherwise)."""
    blocks = code.split("\n\n\n")[1:]
    return [next((ln for ln in b.splitlines() if ln.strip().startswith("r0")), "") for b in blocks]
