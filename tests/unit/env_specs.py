"""A tiny environment spec for the envs tests (one place, so the two test files cannot drift apart)."""

from __future__ import annotations

import dataclasses

from maxtext_compat.matrix import EnvironmentSpec


def tiny_spec(name: str = "tiny", **kw) -> EnvironmentSpec:
    """An environment of one small pinned package and no MaxText; `kw` replaces fields."""
    base = EnvironmentSpec(
        name=name,
        description="test",
        python="3.12",
        maxtext=None,
        requirements=("six==1.17.0",),
        no_deps=(),
        overrides=(),
        exclude_newer="2026-12-01T00:00:00Z",
        env={},
        serving=False,
    )
    return dataclasses.replace(base, **kw)
