"""Suite-wide set-up: pick the tests that apply to the environment the suite runs in.

The same suite runs in every matrix environment (`make test`). A test marked
`@pytest.mark.envs("maxtext-0.2.5")` runs only there and is *deselected* elsewhere (not
skipped: a skip would read as "could not check"); tests that need MaxText are
deselected in the `unit` environment, tests that need tpu-inference where it is not installed,
and tests that churn the release's shim profile where the release needs none.
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

from maxtext_compat.probes import detect_import_root

# tests/helpers (fakes shared by several test files) is imported as `helpers`, under any import mode.
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

ENV_NAME = os.environ.get("MAXTEXT_COMPAT_ENV", "")
HAS_MAXTEXT = detect_import_root() is not None
HAS_TPU_INFERENCE = importlib.util.find_spec("tpu_inference") is not None


@functools.cache  # one resolve per session, not one per marked test
def _release_has_a_shim_profile() -> bool:
    """Whether the installed MaxText gets a shim profile by default (0.2.0/0.2.1 need none)."""
    from maxtext_compat import resolve
    from maxtext_compat.shims import maxtext_profiles

    return HAS_MAXTEXT and maxtext_profiles.choose(resolve(probe=False)) is not None


def _inapplicable(item: pytest.Item) -> bool:
    envs_marker = item.get_closest_marker("envs")
    if envs_marker is not None and ENV_NAME not in envs_marker.args:
        return True
    if item.get_closest_marker("needs_maxtext") is not None and not HAS_MAXTEXT:
        return True
    if item.get_closest_marker("needs_tpu_inference") is not None and not HAS_TPU_INFERENCE:
        return True
    return item.get_closest_marker("needs_shim_profile") is not None and not _release_has_a_shim_profile()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        (drop if _inapplicable(item) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
