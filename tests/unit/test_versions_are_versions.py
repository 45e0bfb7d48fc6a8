"""Issue-11 §5 findings: versions compared as versions, strict switches, a matrix path that cannot hang.

Each test names what it found (each failed before the fix).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import yaml

from helpers.shipped import REPO, shipped_matrix
from maxtext_compat import resolve
from maxtext_compat.cli import main as cli_main
from maxtext_compat.errors import IncompatibleVersionsError, InvalidArgumentError, MatrixError
from maxtext_compat.matrix import MAX_MATRIX_BYTES, load_matrix, parse_matrix
from maxtext_compat.switches import env_count, parse_flag

TEXT = (REPO / "compat_matrix.yaml").read_text()
MATRIX = shipped_matrix()


def test_tpu_inference_0_32_is_release_0_32_0_for_the_jax_check():
    """Found: `--tpu-inference 0.32 --jax 0.7.0` was accepted while `0.32.0` was refused."""
    for spelled in ("0.32", "0.32.0", "0.32.0.0"):
        with pytest.raises(IncompatibleVersionsError, match=r"jax==0\.11\.2"):
            resolve({"tpu-inference": spelled, "jax": "0.7.0"}, matrix=MATRIX)


def test_empty_version_is_refused_by_resolve_and_the_cli(capsys):
    """Found: `maxtext-compat resolve --maxtext ""` exited 0."""
    with pytest.raises(InvalidArgumentError, match="not a PEP 440 version"):
        resolve({"maxtext": ""}, matrix=MATRIX)
    assert cli_main(["resolve", "--maxtext", ""]) != 0
    assert "PEP 440" in capsys.readouterr().err


def _doc():
    return yaml.safe_load(TEXT)


def test_two_rows_equal_as_versions_are_refused():
    """Found: rows `0.2.5` and `0.2.5.0` were both accepted."""
    d = _doc()
    twin = dict(d["maxtext"][-1], release="0.2.5.0")
    d["maxtext"].append(twin)
    with pytest.raises(MatrixError, match="twice"):
        parse_matrix(yaml.safe_dump(d), "m.yaml")


def test_identical_tpu_inference_ranges_overlap():
    """Found: two identical tpu-inference ranges passed the overlap check."""
    d = _doc()
    d["tpu_inference"].append(dict(d["tpu_inference"][-1], releases={}))
    d["tpu_inference"][-1]["releases"] = dict(d["tpu_inference"][-2]["releases"])
    with pytest.raises(MatrixError, match="overlap"):
        parse_matrix(yaml.safe_dump(d), "m.yaml")


def test_overlap_check_is_not_quadratic(monkeypatch):
    """5,000 disjoint ranges are checked with a sort and one sweep: the version comparisons it makes are
    counted (at most about n log n; a pairwise check would make 12.5 million)."""
    base = _doc()["tpu_inference"][-1]
    rows = []
    for i in range(5000):
        lo, hi = f"1000.{i}.0", f"1000.{i}.1"
        release = dict(next(iter(base["releases"].values())))  # the shipped file's keys, whatever they are
        rows.append(dict(base, versions=f">={lo},<{hi}", releases={lo: release}))
    from maxtext_compat.matrix import TpuInferenceRow
    from maxtext_compat.matrix.ranges import check_disjoint
    from maxtext_compat.matrix.schema import read_struct
    from maxtext_compat.matrix.yaml_node import Node

    nodes = [Node(r, f"tpu_inference[{i}]", "m.yaml") for i, r in enumerate(rows)]
    parsed = [read_struct(TpuInferenceRow, node).versions for node in nodes]
    from packaging.version import Version

    calls = {"n": 0}

    def counting(name):
        original = getattr(Version, name)

        def compare(self, other):
            calls["n"] += 1
            return original(self, other)

        return compare

    for name in ("__lt__", "__le__", "__eq__", "__gt__", "__ge__", "__ne__"):
        monkeypatch.setattr(Version, name, counting(name))
    check_disjoint(parsed, Node(rows, "tpu_inference", "m.yaml"))
    n = len(rows)
    assert n <= calls["n"] < 40 * n  # measured: 8 n (n log2 n is ~12 n)


@pytest.mark.parametrize("raw", [" 1", "y", "2", "enabled", "1 "])
def test_switch_values_that_are_not_on_or_off_are_refused(raw, monkeypatch):
    """Found: MAXTEXT_COMPAT_STRICT=" 1", "y" or "2" silently turned strict mode off."""
    from maxtext_compat.convention import policy

    with pytest.raises(InvalidArgumentError) as e:
        parse_flag("MAXTEXT_COMPAT_STRICT", raw)
    assert e.value.argument == "MAXTEXT_COMPAT_STRICT" and repr(raw) in str(e.value)
    monkeypatch.setenv("MAXTEXT_COMPAT_STRICT", raw)
    with pytest.raises(InvalidArgumentError):
        policy.effective_strict(None)


@pytest.mark.parametrize(("raw", "on"), [("1", True), ("TRUE", True), ("on", True), ("0", False), ("Off", False),
                                         ("", False), (None, False)])  # fmt: skip
def test_switch_values_that_are_on_or_off(raw, on):
    assert parse_flag("X", raw) is on


@pytest.mark.parametrize("raw", ["2,000", "1e4", "0", "-5", " 20", "2.5", "nan", "\u0662", "1000001"])
def test_counts_that_are_not_whole_numbers_in_range_are_refused(raw):
    """Found: MAXTEXT_COMPAT_FUZZ_EXAMPLES=2,000 was a bare ValueError naming no variable; 0 ran no example."""
    with pytest.raises(InvalidArgumentError) as e:
        env_count(
            "MAXTEXT_COMPAT_FUZZ_EXAMPLES",
            default=2_500,
            maximum=1_000_000,
            environ={"MAXTEXT_COMPAT_FUZZ_EXAMPLES": raw},
        )
    assert e.value.argument == "MAXTEXT_COMPAT_FUZZ_EXAMPLES" and repr(raw) in str(e.value)
    assert "MAXTEXT_COMPAT_FUZZ_EXAMPLES=2500" in e.value.fix


@pytest.mark.parametrize(("raw", "count"), [("1", 1), ("10000", 10_000), ("1000000", 1_000_000), ("", 7)])
def test_counts_in_range(raw, count):
    assert env_count("N", default=7, maximum=1_000_000, environ={"N": raw}) == count
    assert env_count("N", default=7, maximum=10, environ={}) == 7


def test_a_fifo_as_the_matrix_is_refused_without_hanging(tmp_path):
    """Found: a matrix path that is a FIFO (or /dev/zero) hung every command."""
    fifo = tmp_path / "matrix.yaml"
    os.mkfifo(fifo)
    result: list[BaseException] = []
    t = threading.Thread(target=lambda: _capture(result, fifo), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "load_matrix blocked on a FIFO"
    assert isinstance(result[0], MatrixError) and "a FIFO" in str(result[0])


def _capture(out: list[BaseException], path: Path) -> None:
    try:
        load_matrix(path)
    except BaseException as exc:  # the test inspects it
        out.append(exc)


def test_dev_zero_and_an_oversized_file_are_refused(tmp_path):
    with pytest.raises(MatrixError, match="a device"):
        load_matrix("/dev/zero")
    big = tmp_path / "big.yaml"
    big.write_text(TEXT + "#" * MAX_MATRIX_BYTES)
    with pytest.raises(MatrixError, match=str(MAX_MATRIX_BYTES)):
        load_matrix(big)
