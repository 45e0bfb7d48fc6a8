"""Nothing of ours stays in $TMPDIR: the tiny models, the pytest plugin's fixtures and a served model's config each
get a temporary `base_output_directory` that goes with its config (issue 39: one make demo + make test + make
bench left 726 `maxtext_compat_*` directories).

A pytest run of the plugin's fixtures in a fresh process, with TMPDIR pointed at an empty folder: while it runs,
each live config's directory is there and a dropped config's is already gone; after it exits, the folder holds
nothing of ours. (`maxtext-compat serve --tiny`'s model directory: tests/unit/test_tempdirs.py.)
"""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.envs("maxtext-0.2.5", "maxtext-0.1.0")]

# Left by others, on purpose: torch's per-user compile cache (one fixed name every run reuses), made when MaxText
# 0.2.x's imports load torch._inductor.
OTHERS = {f"torchinductor_{getpass.getuser()}"}

INNER = textwrap.dedent(
    """
    import gc
    import os

    from maxtext_compat.serving.backend import backend_for
    from maxtext_compat.testing import tiny

    TMP = os.environ["TMPDIR"]


    def ours():
        return sorted(name for name in os.listdir(TMP) if name.startswith("maxtext_compat"))


    def test_the_plugins_config_fixture_gets_a_directory_under_tmpdir(tiny_maxtext_config):
        path = tiny_maxtext_config.base_output_directory
        assert os.path.dirname(path) == TMP and os.path.isdir(path)


    def test_a_dropped_config_takes_its_directory_at_once():
        cfg = tiny.tiny_config("qwen3")
        path = cfg.base_output_directory
        assert os.path.isdir(path)
        del cfg
        gc.collect()
        assert not os.path.exists(path)


    def test_a_given_directory_is_the_callers_and_none_is_made_beside_it():
        before = ours()
        cfg = tiny.tiny_config(base_output_directory=os.environ["GIVEN_DIR"])
        assert cfg.base_output_directory == os.environ["GIVEN_DIR"] and ours() == before


    def test_a_served_models_base_config_gets_one_too():
        cfg = backend_for(tiny.installed_row()).base_config(dict(tiny.TINY))
        assert os.path.dirname(cfg.base_output_directory) == TMP and os.path.isdir(cfg.base_output_directory)
        print("live:", ours())
    """
)


def test_tiny_fixtures_and_a_served_config_leave_tmpdir_empty(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {**os.environ, "TMPDIR": str(tmp), "GIVEN_DIR": str(tmp_path / "given")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
         "--basetemp", str(tmp_path / "basetemp"), "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and "4 passed" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-4000:]
    live = next(line for line in proc.stdout.splitlines() if "live:" in line)
    assert "maxtext_compat_" in live  # the configs alive at that point had their directories
    assert set(os.listdir(tmp)) <= OTHERS, sorted(os.listdir(tmp))
