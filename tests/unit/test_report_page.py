"""The compat report page, opened in a real browser (Debian's headless Chromium; `make chromium` installs it).

The page is rendered the way `maxtext-compat matrix` renders it, by the dev environment's CLI (`maxtext-compat
report`, the environment that has matplotlib for the plots), from a results file made here out of the current
matrix and the recorded durations, then read back from the DOM after its script ran. The oracle for the grid is
independent of the renderer: the resolver's own answer for each pair, the matrix's pins for where each
environment goes, and the states this test gave the environments.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import warnings
from html.parser import HTMLParser
from pathlib import Path

import pytest

from helpers.shipped import ci_matrix
from maxtext_compat.errors import CompatError
from maxtext_compat.report import browser, evidence, grid
from maxtext_compat.resolution.resolver import resolve
from maxtext_compat.runner import running as env_runner

pytestmark = pytest.mark.envs("unit")

REPO = Path(__file__).resolve().parents[2]
DEV_CLI = REPO / ".envs" / "dev" / "bin" / "maxtext-compat"
MATRIX = ci_matrix()  # the environments `make test` runs (tests/environments.yaml)
DURATIONS = env_runner.expected_durations(REPO / env_runner.DURATIONS_FILE, cold=True)  # seconds, as the site plans
MEMORY = json.loads((REPO / "tests" / "env_memory.json").read_text())
FAILED_ENV = "maxtext-0.2.2"  # the results below fail this one: a failure must show, whatever else passed
MOCKED_ROW = "0.2.0"  # and list this row as mocked: its allowed cells must say so


def _proofs(name: str) -> dict[str, int]:
    spec = MATRIX.environment(name)
    if spec.serving and spec.maxtext in ("0.2.5", "0.2.4", "0.2.1", "0.2.0", "0.1.0"):
        return {"serve": 6, "kernel": 12}
    if spec.tests or spec.pinned("tpu-inference"):
        return {"serve": 0, "kernel": 40}
    return {"serve": 0, "kernel": 0}


def _results() -> dict:
    envs = []
    for name, spec in MATRIX.environments.items():
        failed = 1 if name == FAILED_ENV else 0
        envs.append({
            "name": name, "maxtext": spec.maxtext, "versions": {"jax": spec.pinned("jax") or "-"},
            "passed": 100 + len(name), "failed": failed, "errors": 0, "skipped": 0,
            "duration_s": float(DURATIONS.get(name, 1.0)), "peak_memory_gb": float(MEMORY.get(name, 0.5)),
            "status": "failed" if failed else "ok", "detail": "pytest exit code 1" if failed else "",
            "proofs": _proofs(name),
        })  # fmt: skip
    mocked = [{"maxtext": MOCKED_ROW, "covered_by": "pytest-mock tests against the matrix"}]
    return {"envs": envs, "mocked_rows": mocked, "mocked_tpu_inference_rows": []}


BENCH = {
    "rows": [
        {"figure": "eager overhead · adapter · Attention old call", "env": "maxtext-0.2.5", "value": 21.0,
         "unit": "µs/call", "native": 5000.0, "ratio": 1.004, "how": "median"},
        {"figure": "paged decode · plugin step on 0.2.5", "env": "maxtext-0.2.5", "value": 410.0, "unit": "ms/step",
         "native": 400.0, "ratio": 1.025, "how": "median"},
        {"figure": "memory · KV bytes, 3 ragged requests", "env": "maxtext-0.2.5", "value": 1 << 20, "unit": "B",
         "native": 16 << 20, "ratio": 0.0625, "how": "pages in use"},
    ]
}  # fmt: skip


class _Dom(HTMLParser):
    """The grid cells, env chips, figures and the details panel of a dumped DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[tuple[str, str], dict[str, str]] = {}
        self.chips: dict[str, dict[str, str]] = {}
        self.ready = ""
        self.details_env = ""
        self.svgs = 0
        self.text: list[str] = []
        self._in_details = 0
        self._chip = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "td" and "cell" in a.get("class", ""):
            self.cells[(a["data-maxtext"], a["data-range"])] = a
        if tag == "button" and "env" in a.get("class", "").split():
            self.chips[a["data-env"]] = a
            self._chip = a["data-env"]
        if a.get("id") == "mc-report":
            self.ready = a.get("data-ready", "")
        if a.get("id") == "mc-details":
            self.details_env = a.get("data-env", "")
            self._in_details = 1
        elif self._in_details and tag in ("dl", "dt", "dd", "h3", "p"):
            self._in_details += 1
        if tag == "svg":
            self.svgs += 1

    def handle_data(self, data: str) -> None:
        if self._in_details:
            self.text.append(data)
        if self._chip:
            self.chips[self._chip]["label"] = data
            self._chip = ""

    def cells_state_of(self, name: str) -> str:
        """The state a chip of `name` must have: what its proofs say."""
        p = _proofs(name)
        return "real-serve" if p["serve"] else "real-kernel" if p["kernel"] else "real-install"


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, _Dom]:
    if browser.find() is None:
        pytest.fail("Chromium is not installed: run `make chromium` (make test does)")
    if not DEV_CLI.is_file():
        pytest.fail(f"{DEV_CLI} is missing: run `make setup` (make test does)")
    out = tmp_path_factory.mktemp("report")
    (out / "compat-report.json").write_text(json.dumps(_results()))
    (out / "bench.json").write_text(json.dumps(BENCH))
    env = {k: v for k, v in os.environ.items() if k not in ("MAXTEXT_COMPAT_ENV", "VIRTUAL_ENV")}
    subprocess.run([str(DEV_CLI), "report", "--results", str(out / "compat-report.json")], check=True, env=env,
                   timeout=180, capture_output=True)  # fmt: skip
    html = out / "compat-report.html"
    dom = _Dom()
    dom.feed(browser.dump_dom(html.resolve().as_uri() + "#env=maxtext-0.2.5"))
    return out, dom


def test_the_script_ran_and_the_details_panel_shows_the_linked_environment(page):
    _, dom = page
    assert dom.ready == "yes", "the page's script did not run to its end"
    assert dom.details_env == "maxtext-0.2.5"
    text = " ".join(dom.text)
    assert "maxtext-0.2.5" in text and f"{100 + len('maxtext-0.2.5')} passed, 0 failed, 0 skipped" in text
    assert f"{round(DURATIONS['maxtext-0.2.5'])} s" in text and "real vllm serve" in text


def test_every_cell_of_the_matrix_is_there_with_the_state_the_oracle_gives(page):
    _, dom = page
    rows = [*(r.name for r in MATRIX.maxtext), grid.KERNEL_ONLY]
    columns = [grid.NO_TPU_INFERENCE, *(t.label for t in MATRIX.tpu_inference)]
    assert set(dom.cells) == {(r, c) for r in rows for c in columns}
    placed: dict[tuple[str, str], list[str]] = {}
    for name, spec in MATRIX.environments.items():
        tpi = spec.pinned("tpu-inference")
        if spec.maxtext is None and tpi is None:
            continue
        column = next((t.label for t in MATRIX.tpu_inference if tpi and t.contains(tpi)), grid.NO_TPU_INFERENCE)
        placed.setdefault((spec.maxtext or grid.KERNEL_ONLY, column), []).append(name)
    for (row, column), cell in dom.cells.items():
        names = placed.get((row, column), [])
        if names:
            states = {"real-serve" if _proofs(n)["serve"] else "real-kernel" if _proofs(n)["kernel"] else
                      "real-install" for n in names}  # fmt: skip
            want = "failed" if FAILED_ENV in names else min(states, key=list(grid.STATES).index)
            assert cell["data-state"] == want, (row, column, names)
            continue
        if row == grid.KERNEL_ONLY or column == grid.NO_TPU_INFERENCE:
            assert cell["data-state"] == "none", (row, column)
            continue
        first = next(iter(next(t for t in MATRIX.tpu_inference if t.label == column).releases))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                resolve({"maxtext": row, "tpu-inference": first}, probe=False)
                refused = ""
            except CompatError as exc:
                refused = str(exc)
        if refused:
            assert cell["data-state"] == "refused" and cell["title"] == refused, (row, column)
        else:
            assert cell["data-state"] == ("mocked" if row == MOCKED_ROW else "allowed"), (row, column)


def test_every_environment_is_a_chip_with_its_counts_on_hover(page):
    _, dom = page
    expected = {n for n, s in MATRIX.environments.items() if s.maxtext or s.pinned("tpu-inference")}
    assert set(dom.chips) == expected
    for name, chip in dom.chips.items():
        assert chip["title"].startswith(f"{name}: ") and f"{100 + len(name)} passed" in chip["title"], chip
        assert f"{DURATIONS.get(name, 1.0):.0f} s" in chip["title"]
        assert chip["label"] == f"jax {MATRIX.environment(name).pinned('jax')}", chip
        assert chip["data-state"] == ("failed" if name == FAILED_ENV else dom.cells_state_of(name)), chip


def test_the_benchmark_figures_are_plotted_and_a_screenshot_is_written_beside_the_report(page):
    out, dom = page
    assert dom.svgs == 3, "one plot per benchmark section (eager, decode, memory)"
    png = out / "compat-report.png"
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert (width, height) == (1500, 1100)


def test_proofs_are_read_from_the_junit_file(tmp_path):
    """Only passing tests of the proof files count; a skipped server test proves nothing."""
    junit = tmp_path / "env.xml"
    junit.write_text(
        '<testsuite tests="5">'
        '<testcase classname="tests.compat.test_serving_vllm.TestCompatModelTP1" name="a"/>'
        '<testcase classname="tests.compat.test_serving_vllm.TestCompatModelTP2" name="b"><skipped/></testcase>'
        '<testcase classname="tests.compat.test_paged_rpa" name="c"/>'
        '<testcase classname="tests.compat.test_paged_rpa" name="d"><failure/></testcase>'
        '<testcase classname="tests.compat.test_paged_rpa_other" name="e"/>'
        "</testsuite>"
    )
    assert evidence.proofs(junit) == {"serve": 1, "kernel": 1}
    assert evidence.proofs(tmp_path / "missing.xml") == {}
    for files in evidence.PROOF_FILES.values():
        for f in files:
            assert (REPO / f).is_file(), f"{f} is a proof file of the report and must exist"


def test_the_report_says_which_families_each_environment_proved_with_real_weights(tmp_path):
    """Counted from the junit file like the other proofs: a failed or skipped test of a family proves nothing."""
    from maxtext_compat.report import results

    (tmp_path / "junit").mkdir()
    (tmp_path / "junit" / "maxtext-0.2.5.xml").write_text(
        '<testsuite tests="4">'
        '<testcase classname="tests.compat.test_real_gemma3" name="a"/>'
        '<testcase classname="tests.compat.test_serving_real_gemma3" name="b"/>'
        '<testcase classname="tests.compat.test_serving_real_model.TestX" name="c"><skipped/></testcase>'
        '<testcase classname="tests.compat.test_real_model" name="d"><failure/></testcase>'
        "</testsuite>"
    )
    (tmp_path / "junit" / "maxtext-0.1.0.xml").write_text(
        '<testsuite tests="1"><testcase classname="tests.compat.test_real_model" name="a"/></testsuite>'
    )
    assert evidence.real_weights(tmp_path / "junit" / "maxtext-0.2.5.xml") == {"Gemma 3 270M": 2}
    assert evidence.real_weights(tmp_path / "missing.xml") == {}
    runs = [results.EnvResult(name=n, maxtext=n.split("-")[1], passed=1) for n in ("maxtext-0.2.5", "maxtext-0.1.0")]
    results.write_reports(runs, MATRIX, tmp_path, screenshot=False)
    data = json.loads((tmp_path / "compat-report.json").read_text())
    assert {e["name"]: e["real_weights"] for e in data["envs"]} == {
        "maxtext-0.2.5": {"Gemma 3 270M": 2},
        "maxtext-0.1.0": {"SmolLM2-135M (Llama)": 1},
    }
    text = (tmp_path / "compat-report.md").read_text()
    section = text.split("## Model families proven with real weights", 1)[1].split("##", 1)[0]
    assert "- maxtext-0.2.5: Gemma 3 270M (2 tests passed)" in section
    assert "- maxtext-0.1.0: SmolLM2-135M (Llama) (1 tests passed)" in section
    for files in evidence.REAL_WEIGHT_FILES.values():
        for f in files:
            assert (REPO / f).is_file(), f"{f} is a real-weights file of the report and must exist"


def test_an_environment_with_no_result_is_not_run_and_a_planned_page_says_so():
    data = grid.planned_results(MATRIX, DURATIONS)
    g = grid.build_grid(data, MATRIX)
    chips = [c for cell in g.cells.values() for c in cell.envs]
    assert chips and {c.state for c in chips} == {"not-run"}
    from maxtext_compat.report import html

    assert "No test run behind this page" in html.render(g, data, standalone=False)
