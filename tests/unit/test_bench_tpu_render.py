"""benchmarks/bench_tpu_render.py: docs/accelerators.md's measured section from bench_tpu.py's JSON. A CPU dry run's
figures are labelled as such (heading and every table) and lose the chip-bandwidth column; dry and accelerator runs
never share a section; the page outside the markers is kept byte for byte; the shipped pages have the markers."""

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
    assert text.startswith("## Measured on TPU v5 lite") and R.DRY_LABEL not in text
    assert "2026-12-06 10:00 UTC · TPU v5 lite × 1" in text and "libtpu 0.0.42.1" in text
    assert "| decode 8 x 1,000 | raw kernel | 200 | 1.000 | 164 | 20 % |" in text
    assert "| broken | failed: RuntimeError: boom |" in text
    assert "**0.995**, native / layer TTFT: **1.000** (goal ≥ 0.98 each)" in text and "HBM peak: 2 GiB." in text


def test_dry_figures_are_labelled_everywhere_and_never_mixed_with_tpu_ones():
    text = R.render([_dry({"run": RUN, "kernel": KERNEL}), _dry({"run": RUN, "model": MODEL})])
    assert text.startswith(f"## {R.DRY_LABEL}") and "Measured on" not in text
    assert text.count(R.DRY_LABEL) == 3  # the heading and both tables
    assert "of peak" not in text and "| decode 8 x 1,000 | raw kernel | 200 | 1.000 | 164 | 9.1 |" in text
    with pytest.raises(ValueError, match="dry and accelerator"):
        R.render([{"run": RUN, "kernel": KERNEL}, _dry({"run": RUN, "model": MODEL})])


def test_render_into_replaces_only_the_marked_section(tmp_path):
    doc = tmp_path / "page.md"
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


STEP_ROW = {"route": "native (installed kernel)", "us": 100.0, "ratio_to_native": 1.0, "first_call_s": 4.0,
            "cached": False, "max_abs_diff": 0.0, "caches_equal": True}  # fmt: skip
STEP = {"layer": {"base_emb_dim": 2048, "base_num_query_heads": 16, "base_num_kv_heads": 8, "head_dim": 128,
                  "dtype": "bfloat16", "page": 16}, "rounds": "median of 5 runs of 20 steps",
        "copy": {"bytes": 1 << 30, "copy_gbs": 700.0, "read_gbs": 800.0, "ceiling_gbs": 800.0},
        "shapes": [{"batch": 32, "context": 2048, "kv_bytes": 1, "hbm_gib": {"peak_bytes_in_use": 3.0},
                    "wrap_over_native": 1.004, "wrap_check_off_over_native": 0.998, "rpa_xla_over_dense": 2.5,
                    "kernel_over_dense": 0.5,
                    "rows": [STEP_ROW, {**STEP_ROW, "route": "through wrap(), KV-write check on", "us": 100.4,
                                        "ratio_to_native": 1.004},
                             {"route": "MaxText's dense decode (own KV cache)", "us": 200.0, "ratio_to_native": 2.0,
                              "first_call_s": 3.0, "cached": True}]},
                   {"batch": 1, "context": 512, "error": "RuntimeError: boom"}]}  # fmt: skip
XLA_ROW = {**ROW, "call": "rpa_xla (XLA, no Pallas)", "kv_gbs": 320.0}


def test_step_figures_give_every_route_the_ratios_and_the_bandwidth_against_the_copy_ceiling():
    kernel = {**KERNEL, "shapes": [{"shape": "decode 32 x 2,000, 32q/8kv", "kv_bytes": 1, "rows": [ROW, XLA_ROW]}]}
    text = R.render([{"run": RUN, "kernel": kernel, "step": STEP}])
    assert "| 32 × 2,048 | through wrap(), KV-write check on | 100 | 1.004 | 4 | 0 | yes |" in text
    assert "| 32 × 2,048 | MaxText's dense decode (own KV cache) | 200 | 2.000 | 3 (cached) | — | — |" in text
    assert "| 1 × 512 | failed: RuntimeError: boom |" in text
    assert "Through the layer / native (KV-write check on): 1.004–1.004 over 1 shapes" in text
    assert "x + 1 700 GB/s (read + write), a sum 800 GB/s (read)" in text
    # 320 / 800 = 40 % of the ceiling; 164 / 800 = 20 %; of the chip's 819 GB/s: 39 % and 20 %
    assert "rpa_xla 320 GB/s = **40 %** of the ceiling (goal ≥ 40 %), the Pallas kernel 164 GB/s = 20 %" in text
    assert "of the chip's 819 GB/s: 39 % and 20 %" in text and "HBM peak: 3 GiB." in text


def test_a_kernel_section_skipped_on_the_gpu_route_says_why():
    text = R.render([{"run": {**RUN, "mode": "gpu"}, "kernel": {"skipped": "needs the Pallas TPU kernel"}}])
    assert "Not measured here: needs the Pallas TPU kernel." in text


@pytest.mark.parametrize("page", ["accelerators.md"])
def test_the_shipped_page_has_the_section(page):
    text = (REPO / "docs" / page).read_text(encoding="utf-8")
    assert text.count(R.BEGIN) == 1 and text.count(R.END) == 1
