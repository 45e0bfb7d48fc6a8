"""benchmarks/bench_tpu_render.py: docs/tpu.md's measured section from bench_tpu.py's JSON. A CPU dry run's figures
are labelled as such (heading and every table) and lose the chip-bandwidth column; dry and TPU runs never share a
section; the page outside the markers is kept byte for byte; the shipped page has the markers."""

from __future__ import annotations

import copy
import importlib.util

import pytest

from helpers.shipped import REPO

_spec = importlib.util.spec_from_file_location("bench_tpu_render", REPO / "benchmarks" / "bench_tpu_render.py")
R = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(R)

RUN = {"mode": "tpu", "date": "2026-12-06 10:00 UTC", "device": "TPU v5 lite", "devices": 1, "python": "3.11.7",
       "versions": {"jax": "0.10.2", "libtpu": "0.0.42.1", "maxtext": "0.2.3", "tpu-inference": "0.25.0"},
       "seconds": 99.0}  # fmt: skip
ROW = {"call": "raw kernel", "us": 200.0, "min_us": 190.0, "max_us": 210.0, "ratio": 1.0, "kv_gbs": 164.0,
       "first_call_s": 9.1, "compile_s": 9.0, "max_abs_diff": 0.0, "caches_equal": True}  # fmt: skip
KERNEL = {"peak_gbs": 819.0, "rounds": "median of 7 runs of 50 calls",
          "shapes": [{"shape": "decode 8 x 1,000", "kv_bytes": 1, "rows": [ROW, {**ROW, "call": "dispatcher inside a "
                      "jitted step", "us": 204.0, "ratio": 1.02}], "hbm_gib": {"peak_bytes_in_use": 1.5}},
                     {"shape": "broken", "error": "RuntimeError: boom"}]}  # fmt: skip
PATH = {"tokens": [[1]], "ttft_ms": 5.0, "decode_step_ms": 2.0, "decode_tokens_per_s": 2000.0, "wall_s": 0.1,
        "end_to_end_tokens_per_s": 640.0, "compile_s": 30.0}  # fmt: skip
MODEL = {"prompts": ["a", "b", "c", "d"], "new_tokens": 16, "runs": 5, "layer": PATH, "native": PATH, "dense": PATH,
         "layer_over_native_tokens_per_s": 0.995, "paged_equals_dense": True, "paged_hbm_gib": None,
         "dense_hbm_gib": {"peak_bytes_in_use": 2.0}}  # fmt: skip


def _dry(result):
    out = copy.deepcopy(result)
    out["run"]["mode"] = "dry"
    out["run"]["device"] = "cpu"
    if "kernel" in out:
        out["kernel"]["peak_gbs"] = None
    return out


def test_tpu_figures_carry_date_device_versions_and_the_fraction_of_peak():
    text = R.render([{"run": RUN, "kernel": KERNEL}, {"run": RUN, "model": MODEL}])
    assert text.startswith("## Measured on the TPU") and R.DRY_LABEL not in text
    assert "2026-12-06 10:00 UTC · TPU v5 lite × 1" in text and "libtpu 0.0.42.1" in text
    assert "| decode 8 x 1,000 | raw kernel | 200 | 1.000 | 164 | 20 % |" in text
    assert "| broken | failed: RuntimeError: boom |" in text
    assert "**0.995** (goal ≥ 0.98)" in text and "HBM peak: 2 GiB." in text


def test_dry_figures_are_labelled_everywhere_and_never_mixed_with_tpu_ones():
    text = R.render([_dry({"run": RUN, "kernel": KERNEL}), _dry({"run": RUN, "model": MODEL})])
    assert text.startswith(f"## {R.DRY_LABEL}") and "Measured on the TPU" not in text
    assert text.count(R.DRY_LABEL) == 3  # the heading and both tables
    assert "of peak" not in text and "| decode 8 x 1,000 | raw kernel | 200 | 1.000 | 164 | 9.1 |" in text
    with pytest.raises(ValueError, match="dry and TPU"):
        R.render([{"run": RUN, "kernel": KERNEL}, _dry({"run": RUN, "model": MODEL})])


def test_render_into_replaces_only_the_marked_section(tmp_path):
    doc = tmp_path / "tpu.md"
    doc.write_text(f"# head\n\ntext before\n{R.BEGIN}\nold figures\n{R.END}\ntext after\n", encoding="utf-8")
    R.render_into(doc, [{"run": RUN, "model": MODEL}])
    text = doc.read_text(encoding="utf-8")
    assert text.startswith("# head\n\ntext before\n") and text.endswith(f"{R.END}\ntext after\n")
    assert "old figures" not in text and "SmolLM2-135M: 4 prompts × 16 greedy tokens" in text
    R.render_into(doc, [{"run": RUN, "model": MODEL}])
    assert doc.read_text(encoding="utf-8") == text  # idempotent
    (tmp_path / "bare.md").write_text("no markers\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no bench-tpu section"):
        R.render_into(tmp_path / "bare.md", [{"run": RUN, "model": MODEL}])


def test_the_shipped_page_has_the_section():
    text = (REPO / "docs" / "tpu.md").read_text(encoding="utf-8")
    assert text.count(R.BEGIN) == 1 and text.count(R.END) == 1
