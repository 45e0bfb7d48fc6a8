"""Known defects with conditions: the schema, when a defect applies, and the refusal it gives.

The expected values are the facts the issue states (which releases, which tpu-inference range, which
configs), not values computed by the code under test.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from packaging.version import Version

from helpers.shipped import MATRIX_FILE
from maxtext_compat.errors import MatrixError, ShimRefusedError
from maxtext_compat.matrix import load_matrix, parse_matrix
from maxtext_compat.resolution import defects

SLOTS, GDN, BATCHED = "kv-slots-out-of-layer-order", "gdn-config-import-gone", "batched-rpa-kernel-bound-at-import"


@pytest.fixture(scope="module")
def matrix():
    return load_matrix(MATRIX_FILE)


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return yaml.safe_load(MATRIX_FILE.read_text())


def _defect(matrix, release, defect_id):
    return next(d for d in matrix.row(release).known_defects if d.id == defect_id)


def test_the_rows_carry_the_defects_the_issue_lists(matrix):
    ids = {r.name: {d.id for d in r.known_defects} for r in matrix.maxtext}
    assert all(SLOTS in ids[r] for r in ("0.2.0", "0.2.1", "0.2.2", "0.2.3", "0.2.4"))  # #3481, fixed in 0.2.5
    assert SLOTS not in ids["0.2.5"] and SLOTS not in ids["0.1.0"]
    assert {r for r, found in ids.items() if GDN in found} == {"0.2.3"}  # #3016
    assert {r for r, found in ids.items() if BATCHED in found} == {"0.2.4", "0.2.5"}  # the variable came in 0.2.4


@pytest.mark.parametrize(
    ("release", "defect_id", "tpu_inference", "expected"),
    [
        ("0.2.4", SLOTS, "0.28.0", "no"),
        ("0.2.4", SLOTS, "0.29.0", "with-config"),
        ("0.2.0", SLOTS, "0.32.0", "with-config"),
        ("0.2.3", GDN, "0.23.0", "no"),
        ("0.2.3", GDN, "0.24.0", "with-config"),
        ("0.2.5", BATCHED, "0.32.0", "with-config"),
        ("0.2.5", BATCHED, "0.33.0", "no"),
        ("0.2.4", BATCHED, None, "no"),  # no tpu-inference: no vLLM server to hit it
    ],
)
def test_version_conditions(matrix, release, defect_id, tpu_inference, expected):
    version = None if tpu_inference is None else Version(tpu_inference)
    applies, reason = defects.version_status(_defect(matrix, release, defect_id), version)
    assert applies == expected
    assert reason


def test_a_nightly_counts_as_the_release_it_is_named_for(matrix):
    """0.29.0.dev20260915 was built after 0.29.0 (after_release): it has #3481's change."""
    slots = _defect(matrix, "0.2.4", SLOTS)
    nightly = matrix.comparable("tpu_inference", "0.29.0.dev20260915")
    assert defects.version_status(slots, nightly)[0] == "with-config"
    batched = _defect(matrix, "0.2.5", BATCHED)
    assert defects.version_status(batched, matrix.comparable("tpu_inference", "0.33.0.dev20261201"))[0] == "no"


@pytest.mark.parametrize(
    ("model_name", "attention", "refused"),
    [
        ("gemma4-e2b", "vllm_rpa", True),
        ("gemma4-e4b-it", "vllm_batched_rpa", True),
        ("qwen3-next-80b-a3b", "vllm_rpa", True),
        ("gemma4-26b", "vllm_rpa", False),  # not a KV-sharing model
        ("gemma4-e2b", "dot_product", False),  # training: tpu-inference's caches are not involved
        ("llama2-7b", "vllm_rpa", False),
    ],
)
def test_config_conditions_match_model_and_attention(matrix, model_name, attention, refused):
    config = SimpleNamespace(model_name=model_name, attention=attention)
    row = matrix.row("0.2.4")
    if refused:
        with pytest.raises(ShimRefusedError) as e:
            defects.check_config(row, Version("0.32.0"), config)
        assert SLOTS in str(e.value) and model_name in str(e.value) and "0.2.5" in str(e.value)
        assert e.value.argument == "model_name, attention"
    else:
        defects.check_config(row, Version("0.32.0"), config)
    if attention == "vllm_rpa":
        defects.check_config(row, Version("0.28.0"), config)  # before #3481: not refused


def test_a_config_missing_a_key_does_not_match(matrix):
    defects.check_config(matrix.row("0.2.4"), Version("0.32.0"), SimpleNamespace(attention="vllm_rpa"))


def test_batched_refusal_unless_the_batched_kernel_is_bound(matrix, monkeypatch):
    row = matrix.row("0.2.5")
    config = SimpleNamespace(model_name="default", attention="vllm_batched_rpa")
    monkeypatch.delitem(__import__("sys").modules, "tpu_inference.layers.common.attention_interface", raising=False)
    monkeypatch.delenv("USE_BATCHED_RPA_KERNEL", raising=False)
    with pytest.raises(ShimRefusedError, match="USE_BATCHED_RPA_KERNEL=1"):
        defects.check_config(row, Version("0.32.0"), config)
    monkeypatch.setenv("USE_BATCHED_RPA_KERNEL", "1")  # set before tpu-inference's import: it binds the batched one
    defects.check_config(row, Version("0.32.0"), config)


def test_describe_says_what_applies_and_the_remedy(matrix):
    lines = defects.describe(defects.statuses(matrix.row("0.2.3"), Version("0.32.0")))
    assert lines[0].startswith("scan-kv-carry-missing: applies") and "fixed by the known-defects shim" in lines[0]
    assert lines[2] == (
        f"{GDN}: may apply - tpu-inference 0.32.0; applies when model_name in ['qwen3-next*'], attention in "
        "['vllm_rpa'] (refused with a typed error)"
    )
    lines = defects.describe(defects.statuses(matrix.row("0.2.3"), None))
    assert lines[2] == f"{GDN}: does not apply - needs tpu-inference >=0.24.0; none is installed"


# ----------------------------------------------------------------------------------------------
# Schema
# ----------------------------------------------------------------------------------------------


def _with_defect(doc, defect: dict) -> str:
    d = copy.deepcopy(doc)
    d["maxtext"][-1]["known_defects"] = [defect]
    return yaml.safe_dump(d, sort_keys=False)


BASE = {"id": "x", "summary": "s", "affects": ["attention"], "why": "w", "how": "h"}


@pytest.mark.parametrize(
    ("defect", "message"),
    [
        (BASE, "must say how the fix is undone"),  # remedy fix (the default) without undo
        ({**BASE, "remedy": "refuse", "undo": "u"}, "nothing to undo"),
        ({**BASE, "remedy": "ignore"}, "unknown value"),
        ({**BASE, "remedy": "refuse", "when": {"tpu_inference": "not a spec"}}, "version specifier"),
        ({**BASE, "remedy": "refuse", "when": {"config": {"attention": []}}}, "matches no config"),
        ({**BASE, "remedy": "refuse", "when": {"tpu": ">=1"}}, "unknown key"),
        ({**BASE, "remedy": "refuse", "when": {"config": {"attention": "vllm_rpa"}}}, "must be a list"),
    ],
)
def test_broken_defect_entries_are_typed_errors(doc, defect, message):
    with pytest.raises(MatrixError, match=message):
        parse_matrix(_with_defect(doc, defect), "test.yaml")


def test_a_refused_defect_parses_with_its_condition(doc):
    text = _with_defect(
        doc,
        {**BASE, "remedy": "refuse", "when": {"tpu_inference": ">=0.29.0", "config": {"model_name": ["g*"]}},
         "upstream_fix": "MaxText 9"},
    )  # fmt: skip
    d = parse_matrix(text, "test.yaml").maxtext[-1].known_defects[0]
    assert (d.remedy, d.undo, str(d.when.tpu_inference), dict(d.when.config), d.upstream_fix) == (
        "refuse", None, ">=0.29.0", {"model_name": ("g*",)}, "MaxText 9",
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Per-layer attention_metadata dicts (convention.translate)
# ----------------------------------------------------------------------------------------------


def test_per_layer_metadata_dicts(matrix):
    from maxtext_compat.backport.write_path import same_metadata
    from maxtext_compat.convention.translate import per_layer_metadata as read
    from maxtext_compat.errors import InvalidArgumentError

    def per_layer_metadata(*args):  # the rule's translator is built with the kernel side's comparison
        return read(*args, same=same_metadata)

    a, b = object(), object()
    caches = [0, 0, 0]
    full = {f"layer.{i}": a for i in range(3)}
    assert per_layer_metadata("decoder", matrix.row("0.2.5"), full, caches, "D") is full  # 0.2.5 reads it per layer
    assert per_layer_metadata("transformer", matrix.row("0.2.3"), full, caches, "T") is a  # one group: one object
    assert per_layer_metadata("decoder", matrix.row("0.1.0"), dict(enumerate([a] * 3)), caches, "D") is a
    cases = [
        ("attention", "0.2.5", full, caches, "one layer's attention metadata"),
        ("decoder_layer", "0.2.3", full, caches, "one layer's attention metadata"),
        ("decoder", "0.2.5", full, None, "without kv_caches"),
        ("decoder", "0.2.5", {"layer.0": a, "layer.2": a}, caches, r"layer\(s\) \[1\] of 3"),
        ("decoder", "0.2.3", {"layer.0": a, "layer.1": b, "layer.2": a}, caches, "holds several"),
    ]
    for kind, release, md, kv, message in cases:
        with pytest.raises(InvalidArgumentError, match=message) as e:
            per_layer_metadata(kind, matrix.row(release), md, kv, "X")
        assert e.value.argument == "attention_metadata"
