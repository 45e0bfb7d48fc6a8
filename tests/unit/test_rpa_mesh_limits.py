"""Which meshes the RPA kernel is refused on, per jax: the measured outcomes, written out by hand.

The table below is what was measured on the kernel tests' installs (tests/compat/test_paged_rpa.py
runs each against the real kernel): "cache" = TP=2 lost a device's KV cache rows (2/30 runs on jax
0.7.2, 3/30 on 0.8.0; 0.8.1 refused with them, same interpreter), "indivisible" = the sharding
conversion fails, "deadlock" = the interpreter hangs, None = runs.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from maxtext_compat.errors import KernelUnavailableError
from maxtext_compat.kernel.mesh_limits import check_mesh

WORDS = {"cache": "loses KV cache writes", "indivisible": "IndivisibleError", "deadlock": "deadlocks"}

# (jax, interpret, tp, kv_heads) -> the refusal (WORDS key) or None
MEASURED = [
    ("0.7.2", True, 2, 2, "cache"),
    ("0.8.0", True, 2, 2, "cache"),
    ("0.8.1", True, 2, 2, "cache"),
    ("0.9.2", True, 2, 2, None),
    ("0.7.2", True, 1, 2, None),
    ("0.7.2", False, 2, 2, None),  # on TPU the interpreter is not involved
    ("0.9.2", True, 4, 2, "indivisible"),
    ("0.9.2", False, 4, 2, "indivisible"),
    ("0.10.0", True, 4, 2, "deadlock"),
    ("0.10.2", True, 4, 2, "deadlock"),
    ("0.11.0", True, 4, 2, "deadlock"),
    ("0.10.0", False, 4, 2, None),
    ("0.11.2", True, 4, 2, None),
    ("0.12.0.1", True, 4, 2, None),
]


@pytest.mark.parametrize(("jax_version", "interpret", "tp", "kv_heads", "refusal"), MEASURED)
def test_measured_outcomes(jax_version, interpret, tp, kv_heads, refusal) -> None:
    if refusal is None:
        check_mesh(tp, interpret=interpret, jax_version=jax_version, num_kv_heads=kv_heads)
        return
    with pytest.raises(KernelUnavailableError, match=WORDS[refusal]) as e:
        check_mesh(tp, interpret=interpret, jax_version=jax_version, num_kv_heads=kv_heads)
    assert e.value.argument == "mesh"
    assert f"'model' axis {tp}" in str(e.value) and jax_version in str(e.value)
    assert e.value.fix.startswith("use tensor parallelism")


def test_a_server_mesh_without_the_model_checks_what_needs_no_heads() -> None:
    """num_kv_heads=None (vLLM's mesh, built before the model): TP is checked, replicated heads cannot be."""
    with pytest.raises(KernelUnavailableError, match="loses KV cache writes"):
        check_mesh(2, interpret=True, jax_version="0.8.0")
    check_mesh(4, interpret=True, jax_version="0.10.2")


def test_the_fix_names_a_jax_that_passes_every_limit_of_the_case() -> None:
    with pytest.raises(KernelUnavailableError) as interpreted:
        check_mesh(4, interpret=True, jax_version="0.9.2", num_kv_heads=2)
    assert interpreted.value.fix.endswith("jax >= 0.11.2")  # 0.10 still deadlocks interpreted
    with pytest.raises(KernelUnavailableError) as compiled:
        check_mesh(4, interpret=False, jax_version="0.9.2", num_kv_heads=2)
    assert compiled.value.fix.endswith("jax >= 0.10")
    check_mesh(4, interpret=True, jax_version="0.11.2", num_kv_heads=2)  # and that jax passes


versions = st.tuples(st.integers(0, 1), st.integers(0, 13), st.integers(0, 3)).map(lambda v: ".".join(map(str, v)))


def _refused(tp: int, interpret: bool, jax_version: str, heads: int | None) -> bool:
    try:
        check_mesh(tp, interpret=interpret, jax_version=jax_version, num_kv_heads=heads)
    except KernelUnavailableError:
        return True
    return False


@given(versions, versions, st.integers(1, 8), st.sampled_from([None, 1, 2, 4, 8]), st.booleans())
def test_limits_only_lift_as_jax_grows_and_never_touch_one_device(a, b, tp, heads, interpret) -> None:
    from packaging.version import Version

    old, new = sorted((a, b), key=Version)
    assert not _refused(1, interpret, old, heads)
    if _refused(tp, interpret, new, heads):
        assert _refused(tp, interpret, old, heads)
    if _refused(tp, False, old, heads):  # what fails compiled fails interpreted too
        assert _refused(tp, True, old, heads)
