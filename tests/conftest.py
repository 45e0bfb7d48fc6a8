"""Suite-wide set-up: pick the tests that apply to the environment the suite runs in.

The same suite runs in every matrix environment (`make test`). A test marked
`@pytest.mark.envs("maxtext-0.2.5")` runs only there and is *deselected* elsewhere (not
skipped: a skip would read as "could not check"); tests that need MaxText are
deselected in the `unit` environment, tests that need tpu-inference where it is not installed,
and tests that churn the release's shim profile where the release needs none. tests/unit runs
in the `unit` environment only: its results do not depend on what is installed, except in the
files marked `every_env` (import lightness, the pytest plugin against an installed MaxText).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path

# Virtual CPU devices for tensor-parallel tests; must be set before jax is imported.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest

from maxtext_compat.resolution.probes import detect_import_root

# tests/helpers (fakes shared by several test files) is imported as `helpers`, under any import mode.
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

ENV_NAME = os.environ.get("MAXTEXT_COMPAT_ENV", "")
UNIT_TESTS = Path(_TESTS_DIR) / "unit"
UNIT_ENV = "unit"
HAS_MAXTEXT = detect_import_root() is not None
HAS_TPU_INFERENCE = importlib.util.find_spec("tpu_inference") is not None
# Tests marked `extended` (real-model serving beyond make test's set) run only with this set to 1.
EXTENDED_ENV = "MAXTEXT_COMPAT_EXTENDED"
# Tests marked `tpu` (the accelerator tier, tests/tpu) run only with MAXTEXT_COMPAT_ACCEL (or its older name
# MAXTEXT_COMPAT_TPU) set to 1 (on a TPU or GPU), dry or dry-gpu (its CPU rehearsals). Read here as
# tests/helpers/accel_mode.py reads it: test_suite_selection copies this file alone, without helpers/.
ACCEL_ENV, ACCEL_OLD_ENV, ACCEL_MODES = "MAXTEXT_COMPAT_ACCEL", "MAXTEXT_COMPAT_TPU", ("1", "dry", "dry-gpu")


@functools.cache  # one resolve per session, not one per marked test
def _release_has_a_shim_profile() -> bool:
    """Whether the installed MaxText gets a shim profile by default (0.2.0/0.2.1 need none)."""
    from maxtext_compat.resolution.installed import installed_resolution
    from maxtext_compat.shims import maxtext_profiles

    return HAS_MAXTEXT and maxtext_profiles.choose(installed_resolution().resolution) is not None


@functools.cache
def _matrix_env_names() -> frozenset[str]:
    from maxtext_compat.matrix import load_matrix, with_environments

    root = Path(_TESTS_DIR).parent
    return frozenset(
        with_environments(load_matrix(root / "compat_matrix.yaml"), root / "tests/environments.yaml").environments
    )


def _marker_envs(item: pytest.Item, name: str) -> tuple[str, ...] | None:
    """The environments a `name` marker (envs, extended_in) lists; None without the marker."""
    marker = item.get_closest_marker(name)
    if marker is None:
        return None
    unknown = sorted(set(marker.args) - _matrix_env_names())
    if unknown or not marker.args:
        # A typo or a renamed environment would deselect the test everywhere without a word.
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.{name} names {unknown or 'no environment'}; expected names from "
            f"tests/environments.yaml {sorted(_matrix_env_names())}; fix the marker or the environment's name"
        )
    return marker.args


def pytest_itemcollected(item: pytest.Item) -> None:
    """`extended_in(envs)`: in those environments the test is `extended` (so `-m extended` selects it there)."""
    marker = item.get_closest_marker("extended_in")  # its names are checked with the others, below
    if marker is not None and ENV_NAME in marker.args:
        item.add_marker(pytest.mark.extended)


def _why_inapplicable(item: pytest.Item) -> str | None:
    """Why this test does not run in this environment (None: it runs)."""
    envs = _marker_envs(item, "envs")
    _marker_envs(item, "extended_in")
    if envs is not None:
        if ENV_NAME not in envs:
            return f"runs only in {', '.join(envs)}"
    elif _is_unit_test(item) and ENV_NAME not in ("", UNIT_ENV) and item.get_closest_marker("every_env") is None:
        return f"a unit test: runs in the {UNIT_ENV} environment"
    if item.get_closest_marker("extended") is not None and os.environ.get(EXTENDED_ENV) != "1":
        return f"extended: runs with {EXTENDED_ENV}=1 (make test-extended)"
    accel = os.environ.get(ACCEL_ENV) or os.environ.get(ACCEL_OLD_ENV, "")
    if item.get_closest_marker("tpu") is not None and accel not in ACCEL_MODES:
        return f"the accelerator tier: runs with {ACCEL_ENV}=1 on a TPU or GPU, =dry on a CPU (make test-accel)"
    if item.get_closest_marker("needs_maxtext") is not None and not HAS_MAXTEXT:
        return "needs MaxText"
    if item.get_closest_marker("needs_tpu_inference") is not None and not HAS_TPU_INFERENCE:
        return "needs tpu-inference"
    if item.get_closest_marker("needs_shim_profile") is not None and not _release_has_a_shim_profile():
        return "needs a release with a shim profile"
    return None


def _is_unit_test(item: pytest.Item) -> bool:
    return item.path.is_relative_to(UNIT_TESTS)


_LEFT_OUT: dict[str, int] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        why = _why_inapplicable(item)
        if why is None:
            keep.append(item)
        else:
            drop.append(item)
            _LEFT_OUT[why] = _LEFT_OUT.get(why, 0) + 1
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = sorted(keep, key=_phase)  # stable: every module stays whole and in its order


# An environment's heavy phase, after every other module: the modules that start `vllm serve` processes (a server
# holds 3 to 10 GB: data parallelism's four processes, the Ray cluster, the real models' servers), then those that
# leave GBs resident in the pytest process for the rest of the run (measured per module on maxtext-0.2.5, warm: the
# process at 1.9 GB before test_convert_checkpoint, 5.4 GB after it, 7.8 GB after test_real_gemma3, 9.95 GB at its
# high-water mark), so the servers start beside a small pytest process. Its first test takes the matrix run's gate
# (envmemory.enter_heavy_phase): one gated environment at a time is in its heavy phase, the others run their light
# phases beside it. Not here: test_serve_trained_checkpoint, the full sets' one small server (4.5 GB at its peak):
# in the gate it waited out another environment's whole heavy phase (906 s on a 3-job run) while holding a job's
# place; ungated, the scheduler counts its environment at its peak instead.
SERVING_MODULES = (
    "test_output_head", "test_readme_recipes", "test_serving_conformance", "test_serving_data_parallel",
    "test_serving_load", "test_serving_multihost_ray", "test_serving_real_families", "test_serving_real_gemma3",
    "test_serving_real_model", "test_serving_vllm",
)  # fmt: skip
RUN_LAST = ("test_convert_checkpoint", "test_real_families", "test_real_gemma3")


def _phase(item: pytest.Item) -> int:
    """0: the light phase; 1: the serving modules; 2: the modules that stay resident (last of all)."""
    module = getattr(getattr(item, "module", None), "__name__", "").rsplit(".", 1)[-1]
    return 2 if module in RUN_LAST else 1 if module in SERVING_MODULES else 0


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _phase(item) and not _is_unit_test(item):
        from maxtext_compat.runner.memory import enter_heavy_phase

        if (waited := enter_heavy_phase()) >= 1:
            print(f"\n[maxtext-compat] heavy phase: waited {waited:.0f} s for another environment's", file=sys.stderr)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say what this environment left out, so a run outside the matrix is not read as complete."""
    if not _LEFT_OUT:
        return
    where = ENV_NAME or "no matrix environment (MAXTEXT_COMPAT_ENV unset)"
    terminalreporter.write_line(f"maxtext-compat: in {where}, deselected (they run in other environments):")
    for why, n in sorted(_LEFT_OUT.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"  {n:5d}  {why}")
