"""nox sessions that test a downstream project against the tested pin sets of MaxText releases.

Why a helper: a project that calls MaxText through maxtext-compat wants its suite run on the same installs this
project proved, without copying the pins. In its noxfile.py:

    import nox
    from maxtext_compat.runner.nox import compat_sessions
    compat_sessions(["0.1.0", "0.2.5"], extras="test")

registers one session, `compat`, parametrized by (Python, pin set). Each installs the pin set exactly as
`maxtext-compat pins RELEASE` and `maxtext-compat matrix` do (pinsets.install_steps), then this same
maxtext-compat (selfwheel), then the project with every exact pin of the set as a constraint, and runs pytest.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from maxtext_compat.errors import InvalidArgumentError
from maxtext_compat.matrix import EnvironmentSpec, load_matrix
from maxtext_compat.runner import pinsets, selfwheel

__all__ = ["compat_sessions", "install_pin_set"]


def compat_sessions(
    releases: Sequence[str] | None = None,
    *,
    name: str = "compat",
    extras: str = "",
    pytest_args: Sequence[str] = (),
    project: str = ".",
) -> None:
    """Register the nox session `name`, one run per pin set of `releases` (None: every pin set of the matrix).

    A release is a MaxText version with a tested set (`0.2.5`) or a set's name (`maxtext-0.1.0-jax011`); an
    unknown one raises the matrix's MatrixError, naming the known ones, when the noxfile is read."""
    import nox

    m = load_matrix()
    if isinstance(releases, str):
        releases = [releases]
    wanted = list(m.pin_sets) if releases is None else list(releases)
    if not wanted:
        raise InvalidArgumentError(
            "no release to make a session for",
            argument="releases",
            expected="MaxText releases with a tested pin set, or None for every one",
            found=repr(releases),
            fix="pass releases=None, or name releases from `maxtext-compat pins --list`",
        )
    specs = {spec.name: spec for spec in (m.pin_set(r) for r in wanted)}  # the same set named twice runs once

    def run(session: Any, release: str) -> None:
        spec = specs[release]
        install_pin_set(session, spec, project=project, extras=extras)
        env = {k: v for k, v in spec.env.items() if k not in os.environ}  # the set's defaults; the caller's win
        session.run("python", "-m", "pytest", *pytest_args, *session.posargs, env=env)

    run.__doc__ = "pytest on a tested pin set (the install `maxtext-compat pins RELEASE` names)"
    pairs = [(spec.python, key) for key, spec in specs.items()]
    parametrized = nox.parametrize("python,release", pairs, ids=list(specs))(run)
    nox.session(parametrized, name=name, venv_backend="uv")


def install_pin_set(session: Any, spec: EnvironmentSpec, *, project: str = ".", extras: str = "") -> None:
    """Install into a nox session's environment: the pin set, this maxtext-compat, then `project` on top.

    The project is installed with every exact pin of the set as a constraint: an install that needs another
    version fails, naming both, instead of testing something other than the set."""
    tmp = Path(session.create_tmp())
    target = f"{project}[{extras}]" if extras else project
    self_args = selfwheel.self_install_args(tmp / "self")
    for args in pinsets.install_plan(spec, tmp / "pins", tmp / "project", self_args, ("-e", target)):
        session.install(*args)
