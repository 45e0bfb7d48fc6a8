"""Tests that run a spec in another matrix environment (a partner): what to do when it is not built."""

from __future__ import annotations

import os

import pytest


def require_env(env: str) -> None:
    """Return when `env` is built; fail under the matrix runner (it builds every environment, so a skip
    would hide a broken build), skip in a bare pytest run."""
    from helpers.crossrun import missing_env

    reason = missing_env(env)
    if reason is None:
        return
    if os.environ.get("MAXTEXT_COMPAT_ENV"):
        pytest.fail(f"{reason}; the matrix runner builds it, so it must exist")
    pytest.skip(reason)
