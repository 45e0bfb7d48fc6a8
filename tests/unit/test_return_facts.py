"""Each release's returns are written once, in compat_matrix.yaml's `returns:`; the call rule, `migrate` and the
docs' table all read them.

The proof is a change: a matrix whose rows spell a different return order for the Decoder changes what the call
rule hands a caller, where `migrate` puts the KV result, and the conventions page, together. The expected values
are written out here by name; nothing is computed by the code under test. A spelling that breaks its release's
convention is refused when the matrix is read, and a release result that does not have its row's shape is refused
when it is reshaped, never sliced.
"""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from maxtext_compat.convention.kinds import KINDS
from maxtext_compat.errors import MatrixError, ProbeMismatchError
from maxtext_compat.matrix import load_matrix, parse_matrix
from maxtext_compat.matrix.returns import ReturnShape

libcst = pytest.importorskip("libcst")

from maxtext_compat.migrate.callees import from_matrix  # noqa: E402
from maxtext_compat.migrate.codemod import migrate_source  # noqa: E402

pytestmark = pytest.mark.envs("unit")  # the shipped matrix and fake results: no MaxText needed

REPO = Path(__file__).resolve().parents[2]
SHIPPED = (REPO / "compat_matrix.yaml").read_text(encoding="utf-8")
NEW_DECODER = "decoder: (logits, hidden, kv_caches)"
KV_FIRST = "decoder: (kv_caches, logits, hidden)"
CALLER = textwrap.dedent(
    """\
    from maxtext.layers.decoders import Decoder


    def run(tokens, pos):
        logits, hidden = Decoder()(None, tokens, pos)
        return logits
    """
)


def _with(old: str, new: str, *, only: str | None = None) -> str:
    """The shipped matrix text with `old` replaced by `new` in every row's `returns:`, or in release `only`'s."""
    if only is None:
        assert SHIPPED.count(old) >= 2
        return SHIPPED.replace(old, new)
    head, _, rest = SHIPPED.partition(f'  - release: "{only}"')
    assert old in rest.split("  - release:", 1)[0], f"{old!r} is not in row {only}"
    return head + f'  - release: "{only}"' + rest.replace(old, new, 1)


def _conventions_page(m) -> str:
    spec = importlib.util.spec_from_file_location("_docs_reference", REPO / "tools" / "docs_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.conventions_page(m)


def _table_row(page: str, release: str) -> str:
    section = page.split("### What each layer returns", 1)[1]
    return next(line for line in section.splitlines() if line.startswith(f"| {release} |"))


def test_one_spelling_changes_the_rule_the_codemod_and_the_docs_together():
    shipped, changed = load_matrix(), parse_matrix(_with(NEW_DECODER, KV_FIRST))
    decoder = KINDS["decoder"]
    # the call rule: what a 0.2.1 Decoder returned, handed to an old and to a new caller
    row, row2 = shipped.row("0.2.1"), changed.row("0.2.1")
    assert decoder.old_return(row, None, ("L", "H", "K"), "Decoder.__call__") == ("L", "H")
    assert decoder.old_return(row2, None, ("K", "L", "H"), "Decoder.__call__") == ("L", "H")
    assert decoder.new_return(row, ("L", "H", "K"), "Decoder.__call__") == ("L", "H", "K")
    assert decoder.new_return(row2, ("K", "L", "H"), "Decoder.__call__") == ("K", "L", "H")
    # migrate: where the KV result goes in the caller's unpacking
    before = migrate_source(CALLER, from_matrix(shipped), "kv_return")
    after = migrate_source(CALLER, from_matrix(changed), "kv_return")
    call = "Decoder()(None, tokens, pos, kv_caches=None, attention_metadata=None)\n"
    assert f"    logits, hidden, _ = {call}" in before.code
    assert f"    _, logits, hidden = {call}" in after.code
    assert migrate_source(after.code, from_matrix(changed), "legacy").code == CALLER  # and back, by the same facts
    # the docs' table
    assert "`(logits, hidden, kv_caches)`" in _table_row(_conventions_page(shipped), "0.2.1")
    assert "`(kv_caches, logits, hidden)`" in _table_row(_conventions_page(changed), "0.2.1")


def test_releases_that_disagree_on_a_classs_return_leave_its_call_sites_to_a_human():
    changed = parse_matrix(_with(NEW_DECODER, KV_FIRST, only="0.2.1"))
    result = migrate_source(CALLER, from_matrix(changed), "kv_return")
    [site] = result.sites
    assert (site.kind, site.change) == ("decoder", "manual") and result.code == CALLER
    assert "0.2.1: (kv_caches, logits, hidden)" in site.detail and "0.2.4: (logits, hidden, kv_caches)" in site.detail


@pytest.mark.parametrize(
    ("release", "old", "new", "says"),
    [
        ("0.2.1", "attention: (out, kv_cache)", "attention: out", "no KV result"),
        ("0.1.0", "attention: out", "attention: (out, kv_cache)", "KV result on a release without"),
        ("0.2.4", NEW_DECODER, "decoder: (logits, kv_caches)", "where an old caller's values are"),
        ("0.2.4", NEW_DECODER, "decoder: (logits, logits, kv_caches)", "a name appears twice"),
        ("0.2.4", NEW_DECODER, "decoder: (logits, hidden, kv_caches", "unbalanced parentheses"),
        ("0.2.2", "transformer_vllm: (hidden, kv_caches)", "transformer_vllm: (hidden, 3)", "'3' is not a name"),
    ],
)
def test_a_spelling_that_breaks_its_release_is_refused_naming_the_key(release, old, new, says):
    with pytest.raises(MatrixError) as info:
        parse_matrix(_with(old, new, only=release))
    key = old.split(":")[0]
    assert info.value.key.endswith(f"returns.{key}"), info.value.key
    assert says in str(info.value)


@pytest.mark.parametrize("result", [object(), ("out",), ("out", "kv", "extra"), ["out"]])
def test_a_result_that_is_not_its_rows_shape_is_refused_never_sliced(result):
    with pytest.raises(ProbeMismatchError) as info:
        KINDS["attention"].old_return(load_matrix().row("0.2.5"), None, result, "Attention.__call__")
    assert info.value.expected == "(out, kv_cache)" and "Attention.__call__" in str(info.value)


NAMES = st.lists(st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True), min_size=1, max_size=5, unique=True)


@given(names=NAMES, data=st.data())
def test_reshaping_moves_every_value_by_its_name(names, data):
    """Oracle: a dict from names to values, built here; any order of the names gets its values by name."""
    values = {n: object() for n in names}
    source = ReturnShape(tuple(names), bare=len(names) == 1 and data.draw(st.booleans()))
    target = ReturnShape(tuple(data.draw(st.permutations(names))), bare=False)
    result = values[names[0]] if source.bare else tuple(values[n] for n in names)
    moved = source.reshape(result, target, "L.__call__")
    assert [id(v) for v in moved] == [id(values[n]) for n in target.names]
    assert ReturnShape.parse(source.spelling) == source
