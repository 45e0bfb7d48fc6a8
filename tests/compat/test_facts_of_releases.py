"""`maxtext-compat facts` on the real releases: each one's code facts, read by ast, are its shipped row's.

In every environment with MaxText, the release is read three ways (installed, as the wheel rebuilt from its
RECORD, as a source tree unpacked from that wheel) and each reading must find the row's code facts exactly: the
import root, the classes, the signatures' optional parameters, the returns, the scanned-layer carry, the vLLM call
(entry point, call form, return order, adapter) and the config files. Dates, pins and prose are the row's own.
"""

from __future__ import annotations

import json

import pytest
import yaml

from helpers.maxtext_trees import source_tree_from_wheel, wheel_from_record
from maxtext_compat import cli
from maxtext_compat.matrix import load_matrix
from maxtext_compat.matrix.facts import differences, read_facts, row_facts
from maxtext_compat.matrix.facts.draft import draft_row

pytestmark = pytest.mark.needs_maxtext


@pytest.fixture(scope="module")
def installed():
    return read_facts("installed")


@pytest.fixture(scope="module")
def shipped(installed):
    return row_facts(load_matrix().row(installed.version))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return wheel_from_record(tmp_path_factory.mktemp("wheel"))


def test_the_installed_release_has_its_rows_code_facts(installed, shipped):
    assert installed.kind == "installed"
    assert differences(installed.row, shipped) == {}


def test_its_wheel_and_a_source_tree_of_it_read_the_same(installed, shipped, wheel, tmp_path):
    from_wheel = read_facts(wheel)
    tree = source_tree_from_wheel(wheel, tmp_path / "maxtext-src")
    from_tree = read_facts(tree)
    for found in (from_wheel, from_tree):
        assert differences(found.row, shipped) == {}, found.kind
        assert found.version == installed.version
        assert found.signatures == installed.signatures
        assert found.github_pins == installed.github_pins
    assert from_wheel.requirements == installed.requirements  # METADATA, read in the zip and in dist-info alike
    assert sorted(from_tree.requirements) == sorted(installed.requirements)  # pyproject.toml written from it


def test_the_printed_draft_row_carries_the_facts_as_yaml(installed, shipped, wheel, capsys):
    """The text a user pastes, read back by a YAML parser: the code facts are the row's."""
    assert cli.main(["facts", str(wheel)]) == 0
    out = capsys.readouterr().out
    assert draft_row(read_facts(wheel)) in out
    (pasted,) = yaml.safe_load("maxtext:\n" + draft_row(installed))["maxtext"]
    assert pasted["release"] == installed.version and pasted["date"] == "TODO"
    keys = set(shipped)
    pasted.setdefault("scan_kv_carry_layers", [])  # left out when empty, as in the file
    if pasted["vllm"] is not None:
        pasted["vllm"].setdefault("per_layer_metadata", False)
    assert differences({k: v for k, v in pasted.items() if k in keys}, shipped) == {}
    assert cli.main(["facts", str(wheel), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["source"]["kind"] == "wheel" and differences(data["row"], shipped) == {}
