"""compat_matrix.yaml's dates and pins are PyPI's: read back live, and a wrong fact is named.

The live test needs pypi.org (a package registry, reachable wherever `make test` can install).
"""

from __future__ import annotations

import dataclasses
import importlib.util

from packaging.version import Version

from helpers.shipped import REPO, shipped_matrix

_spec = importlib.util.spec_from_file_location("_check_matrix_facts", REPO / "tools" / "check_matrix_facts.py")
facts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(facts)
MATRIX = shipped_matrix()


def test_every_date_and_jax_pin_in_the_matrix_is_pypis(capsys):
    assert facts.main(["--matrix", str(REPO / "compat_matrix.yaml"), "--pins"]) == 0, capsys.readouterr().out


def _days_as_listed(m):
    mt = {row.release: row.date for row in m.maxtext}
    tpi = {Version(r.version): r.date for row in m.tpu_inference for r in row.releases.values()}
    return mt, tpi


def test_a_wrong_date_and_an_unpublished_release_are_each_named():
    mt, tpi = _days_as_listed(MATRIX)
    assert facts.date_mismatches(MATRIX, mt, tpi) == []
    mt[Version("0.2.5")] = "2026-11-01"  # the date the matrix carried before it was checked
    del tpi[Version("0.22.0")]
    assert facts.date_mismatches(MATRIX, mt, tpi) == [
        "maxtext 0.2.5: matrix says 2026-10-02, PyPI says 2026-11-01",
        "tpu-inference 0.22.0: listed in the matrix, not on PyPI",
    ]


def test_a_wrong_jax_pin_is_named():
    row = MATRIX.tpu_inference[-1]
    rel = row.releases["0.32.0"]
    m = dataclasses.replace(MATRIX, tpu_inference=(dataclasses.replace(row, releases={"0.32.0": rel}),))
    metadata = "Metadata-Version: 2.1\nName: tpu-inference\nRequires-Dist: jax==0.11.0\nRequires-Dist: jaxtyping\n"
    assert facts.pin_mismatches(m, lambda v: metadata) == [
        "tpu-inference 0.32.0: matrix says jax 0.11.2, the wheel pins 0.11.0"
    ]
    assert facts.pinned(metadata.replace("==0.11.0", ">=0.11"), "jax") is None
