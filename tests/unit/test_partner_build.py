"""A test that needs a partner environment builds it under the matrix runner, which builds each environment only
as it starts it (make test): the partner may be wanted before its own turn. Outside the runner it is reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import crossrun
from maxtext_compat.runner import envs

PARTNER = "tpu-inference-0.26.0"  # the smallest environment: a real build of it takes seconds


@pytest.fixture
def envs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MAXTEXT_COMPAT_ENVS_DIR", str(tmp_path / "envs"))
    return tmp_path / "envs"


def test_under_the_matrix_runner_a_missing_partner_is_built_once(envs_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("MAXTEXT_COMPAT_ENV", "unit")
    assert not envs.env_python(PARTNER).exists()
    assert crossrun.missing_env(PARTNER) is None  # built here, for real, in the folder the runner would use
    python = envs.env_python(PARTNER)
    assert python.is_file() and python.is_relative_to(envs_dir)
    built = python.stat().st_mtime_ns
    assert crossrun.missing_env(PARTNER) is None and python.stat().st_mtime_ns == built  # up to date: not rebuilt


def test_outside_the_runner_a_missing_partner_is_named_and_nothing_is_built(envs_dir: Path, monkeypatch) -> None:
    monkeypatch.delenv("MAXTEXT_COMPAT_ENV", raising=False)
    reason = crossrun.missing_env(PARTNER)
    assert reason is not None and f"matrix environment {PARTNER} is not built" in reason
    assert not envs_dir.exists() or not any(envs_dir.iterdir())
    with pytest.raises(crossrun.CrossRunError, match=f"matrix environment {PARTNER} is not built"):
        crossrun.start_in_env(PARTNER, [])
