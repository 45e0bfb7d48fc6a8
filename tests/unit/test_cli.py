"""The `maxtext-compat` CLI: doctor, resolve, envs — output and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from importlib.metadata import entry_points, version

import pytest

from helpers.fake_modules import make_module
from maxtext_compat import shims
from maxtext_compat.cli import main
from maxtext_compat.patching import PatchSpec, shim


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_resolve_json_has_the_documented_keys(capsys):
    code, out, _ = run(capsys, "resolve", "--maxtext", "0.2.3", "--tpu-inference", "0.25.0", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["maxtext"] == "0.2.3"
    assert d["import_root"] == "maxtext"
    assert d["convention"] == "kv_scan_carry"
    form = d["rpa_call_form"]
    assert form["form"] == "flat"
    assert form["module"] == "tpu_inference.layers.common.attention_interface"
    assert form["kwargs"] == ["update_kv_cache", "use_causal_mask"]


def test_resolve_curried_form_for_tpu_inference_0_11(capsys):
    code, out, _ = run(capsys, "resolve", "--maxtext", "0.1.0", "--tpu-inference", "0.11.1", "--json")
    assert code == 0
    form = json.loads(out)["rpa_call_form"]
    assert form["form"] == "curried"
    assert form["factory_params"][:2] == ["sm_scale", "mesh"]


def test_resolve_text_output(capsys):
    code, out, _ = run(capsys, "resolve", "--maxtext", "0.1.0")
    assert code == 0
    assert "convention legacy" in out and "import root MaxText" in out


def test_resolve_unknown_release_prints_the_warning(capsys):
    code, out, _ = run(capsys, "resolve", "--maxtext", "0.3.0", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["maxtext_match"] == "nearest"
    assert any("0.3.0 is not in" in w for w in d["warnings"])


def test_incompatible_combination_exits_2_with_a_readable_error(capsys):
    code, _, err = run(capsys, "resolve", "--maxtext", "0.2.0", "--tpu-inference", "0.32.0")
    assert code == 2
    assert "IncompatibleVersionsError" in err and "maxtext 0.2.0" in err and "tpu-inference 0.32.0" in err
    assert "Fix:" in err


def test_doctor_json_reports_versions_row_probe_patches_and_skips(capsys):
    code, out, _ = run(capsys, "doctor", "--json")
    d = json.loads(out)
    assert code == 0
    assert {"matrix", "resolution", "active_patches", "side_effects", "skipped", "warnings"} <= set(d)
    assert isinstance(d["active_patches"], list)
    res = d["resolution"]
    if res["maxtext"] is None:
        assert any(s["feature"] == "adapters and shims" for s in d["skipped"])
    else:
        assert res["probe"]["ok"] is True


def test_doctor_text(capsys):
    code, out, _ = run(capsys, "doctor")
    assert code == 0
    assert "matrix:" in out and "active patches:" in out


# MaxText's shims, which docs/architecture.md and docs/shims.md say doctor lists in any process (registered, not
# installed where MaxText is not).
MAXTEXT_SHIMS = {"vllm-backport", "known-defects", "call-rule"}


def test_doctor_in_a_fresh_process_lists_maxtexts_shims_each_with_its_state_and_verified_range():
    script = "from maxtext_compat.cli import main; raise SystemExit(main(['doctor', '--json']))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    listed = {s["name"]: s for s in json.loads(out)["shims"]}
    assert set(listed) >= MAXTEXT_SHIMS
    for name in MAXTEXT_SHIMS:
        s = listed[name]
        assert set(s) >= {"active", "reason", "targets", "verified_for"} and s["verified_for"] and s["reason"], s
        # installed with its targets, or why not (and then no target)
        assert bool(s["targets"]) == s["active"], s


class _Upper(shim.Shim):
    """Uppercases a throwaway module's `greet`."""

    name = "doctor-test-upper"
    verified_for = ("pytest>=7",)  # installed wherever the test runs: the range check passes

    def __init__(self, module: str) -> None:
        self.module = module

    def specs(self) -> list[PatchSpec]:
        return [PatchSpec(f"{self.module}:greet", _upper)]


def _upper(original: object) -> object:
    return lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs).upper()


def test_doctor_lists_every_shim_and_every_active_patch_with_its_target_and_origin(capsys):
    """The promise of docs/shims.md: every shim (installed with its targets, or why it did not apply here) and every
    active patch with its target and origin, in the JSON and one line each in the text."""
    module = make_module(f"doctor_{uuid.uuid4().hex[:8]}", "def greet(name):\n    return 'hello ' + name\n")
    target = f"{module.__name__}:greet"
    s = _Upper(module.__name__)
    s.install()
    try:
        assert module.greet("x") == "HELLO X"
        code, out, _ = run(capsys, "doctor", "--json")
        d = json.loads(out)
        listed = {entry["name"]: entry for entry in d["shims"]}
        # this process's shims and those installed distributions declare (every one of ours where the package's
        # metadata holds its entry points: a built environment; an editable install from before they existed, not)
        declared = {ep.name for ep in entry_points(group=shim.ENTRY_POINTS)}
        assert code == 0 and set(listed) == {st.name for st in shim.statuses()} | declared
        assert set(listed) >= MAXTEXT_SHIMS
        assert listed[s.name] == {
            "name": s.name, "active": True, "reason": "installed", "targets": [target],
            "verified_for": ["pytest>=7"],
        }  # fmt: skip
        [patch] = [p for p in d["active_patches"] if p["target"] == target]
        assert patch["profile"] == s.name and patch["origin"].endswith("_upper")
        code, text, _ = run(capsys, "doctor")
        assert f"shim {s.name}: installed, 1 target(s) (verified for pytest>=7)" in text.splitlines()
        assert f"  {target} <- {patch['origin']} ({s.name})" in text.splitlines()
        for entry in listed.values():  # one line per shim: installed, or why not
            assert any(line.startswith(f"shim {entry['name']}: ") for line in text.splitlines()), entry
    finally:
        s.uninstall()
        shims.unregister_profile(s.name)
        del sys.modules[module.__name__]


def test_envs_lists_every_matrix_environment(capsys):
    code, out, _ = run(capsys, "envs", "--json")
    assert code == 0
    names = {e["name"] for e in json.loads(out)}
    assert {"unit", "maxtext-0.2.5", "maxtext-0.1.0", "maxtext-0.1.0-jax011"} <= names


def test_envs_list_shows_the_named_environments_and_refuses_an_unknown_one(capsys):
    """Found: `envs list NAME` ignored NAME, listed every environment and exited 0 for a typo."""
    code, out, _ = run(capsys, "envs", "list", "unit", "maxtext-0.2.5", "--json")
    assert code == 0 and [e["name"] for e in json.loads(out)] == ["unit", "maxtext-0.2.5"]
    code, out, err = run(capsys, "envs", "list", "unit", "no-such-env")
    assert code == 2 and "MatrixError" in err and "no environment named 'no-such-env'" in err and not out


def test_envs_python_needs_exactly_one_known_name(capsys):
    code, _, err = run(capsys, "envs", "python")
    assert code == 2 and "exactly one" in err
    code, _, err = run(capsys, "envs", "python", "no-such-env")
    assert code == 2 and "no environment named" in err


def test_bad_matrix_file_is_reported_not_a_traceback(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "m.yaml"
    bad.write_text("schema_version: 1\nmaxtext: 3\n")
    monkeypatch.setenv("MAXTEXT_COMPAT_MATRIX", str(bad))
    code, _, err = run(capsys, "resolve", "--maxtext", "0.2.5")
    assert code == 2
    assert "MatrixError" in err and "m.yaml" in err


@pytest.mark.parametrize("argv", [["--help"], ["doctor", "--help"]])
def test_console_script_runs(argv):
    proc = subprocess.run(
        [sys.executable, "-m", "maxtext_compat.cli", *argv], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and "usage:" in proc.stdout


def test_version_prints_the_installed_distributions_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"maxtext-compat {version('maxtext-compat')}\n"


def test_version_from_a_fresh_process_loads_nothing_heavy():
    """`maxtext-compat --version` answers from argparse: no matrix, no contract, no jax or numpy imported."""
    script = (
        "import json, sys\nfrom maxtext_compat.cli import main\n"
        "try:\n    main(['--version'])\nfinally:\n    print(json.dumps(sorted(sys.modules)), file=sys.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and proc.stdout == f"maxtext-compat {version('maxtext-compat')}\n"
    loaded = json.loads(proc.stderr.strip().splitlines()[-1])
    heavy = (
        "jax",
        "numpy",
        "yaml",
        "maxtext_compat.contract",
        "maxtext_compat.matrix",
        "maxtext_compat.resolution.resolver",
    )
    assert not [m for m in loaded if m.startswith(heavy)]


def test_reader_closing_the_pipe_ends_quietly():
    """`maxtext-compat resolve --json | head -1`: no BrokenPipeError traceback, exit 141 like Unix tools."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "maxtext_compat.cli", "resolve", "--maxtext", "0.2.5", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first write
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert err == ""
