"""A pin set as install steps any runner can take: `maxtext-compat pins`, the nox helper and `matrix` share them.

Why one function: the environment `matrix` builds, the one `pins --format commands` describes and the one a nox
session installs must be the same set of packages; they agree because each is `install_steps` of one pin set.
A set installs in up to three `uv pip install` calls: the resolved requirements, the no-deps pins, and the no-deps
wheels of another Python (vllm-tpu's cp312 wheels on 3.11), each with the set's overrides and registry date.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI imports FORMATS before parsing arguments: no YAML or packaging at its start
    from maxtext_compat.matrix import CompatMatrix, EnvironmentSpec

FORMATS: tuple[str, ...] = ("json", "requirements", "no-deps", "overrides", "commands")


@dataclass(frozen=True)
class InstallStep:
    """One `uv pip install` call: its arguments after `uv pip install`, and the files they name (name -> lines)."""

    args: tuple[str, ...]
    files: tuple[tuple[str, tuple[str, ...]], ...] = ()


def install_steps(spec: EnvironmentSpec, folder: Path) -> list[InstallStep]:
    """The calls that install `spec`, their files to be written in `folder` (`write_files` writes them)."""
    common: list[str] = []
    files: list[tuple[str, tuple[str, ...]]] = []
    if spec.exclude_newer:
        common += ["--exclude-newer", spec.exclude_newer]
    if spec.overrides:
        files.append(("overrides.txt", spec.overrides))
        common += ["--override", str(folder / "overrides.txt")]
    steps = []
    if spec.requirements:
        steps.append(InstallStep((*common, "-r", str(folder / "requirements.txt")),
                                 (*files, ("requirements.txt", spec.requirements))))  # fmt: skip
    if spec.no_deps:
        steps.append(InstallStep((*common, "--no-deps", "-r", str(folder / "no-deps.txt")),
                                 (*files, ("no-deps.txt", spec.no_deps))))  # fmt: skip
    other = spec.wheels_for_python
    if other is not None:
        steps.append(InstallStep(
            (*common, "--python-version", other.python, "--no-deps", "-r", str(folder / "wheels-for-python.txt")),
            (*files, ("wheels-for-python.txt", other.no_deps)),
        ))  # fmt: skip
    return steps


def constraint_lines(spec: EnvironmentSpec) -> tuple[str, ...]:
    """Every exact pin of the set, as constraints for what is installed on top (a user's project must not move
    them: an install that needs another version fails, naming both, instead of changing the tested set)."""
    from packaging.requirements import Requirement

    lines = []
    for line in (*spec.requirements, *spec.no_deps, *spec.overrides):
        req = Requirement(line)
        if any(s.operator in ("==", "===") for s in req.specifier):
            lines.append(f"{req.name}{req.specifier}")
    return tuple(dict.fromkeys(lines))


def on_top(spec: EnvironmentSpec, folder: Path) -> tuple[list[str], Path]:
    """For what is installed on top of the set (maxtext-compat, a user's project): the arguments that hold it to
    the set (its registry date, its overrides) and a constraints file of its exact pins, written into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    held = ["--exclude-newer", spec.exclude_newer] if spec.exclude_newer else []
    if spec.overrides:
        (folder / "overrides.txt").write_text("\n".join(spec.overrides) + "\n", encoding="utf-8")
        held += ["--override", str(folder / "overrides.txt")]
    constraints = folder / "constraints.txt"
    constraints.write_text("".join(f"{line}\n" for line in constraint_lines(spec)), encoding="utf-8")
    return held, constraints


def install_plan(
    spec: EnvironmentSpec,
    folder: Path,
    top: Path,
    self_args: tuple[str, ...],
    project: tuple[str, ...] | None,
    maxtext: tuple[str, ...] | None = None,
) -> list[tuple[str, ...]]:
    """Every `uv pip install` (its arguments) that makes an environment of `spec`, in order: the set's steps (their
    files written into `folder`), the user's own MaxText (`maxtext`: a folder, a wheel or a VCS URL, held to the
    set's constraints; the set then pins no maxtext), maxtext-compat (`self_args`), then `project` held to the set
    by its constraints (written into `top`; None: no project). `matrix` and the nox helper both install this plan."""
    steps = install_steps(spec, folder)
    write_files(steps, folder)
    held, constraints = on_top(spec, top)
    plan = [step.args for step in steps]
    if maxtext is not None:
        plan.append((*maxtext, "-c", str(constraints), *held))
    plan.append((*self_args, *held))
    if project is not None:
        plan.append((*project, "-c", str(constraints), *held))
    return plan


def write_files(steps: list[InstallStep], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for step in steps:
        for name, lines in step.files:
            (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")


def fingerprint(m: CompatMatrix) -> str:
    """What identifies the facts a run used (`CompatMatrix.fingerprint`: the matrix file's bytes)."""
    return m.fingerprint()


def describe(spec: EnvironmentSpec, m: CompatMatrix) -> dict[str, Any]:
    """The set as data (`pins --format json`): enough for any runner to build it."""
    from maxtext_compat._version import __version__

    other = spec.wheels_for_python
    return {
        "name": spec.name,
        "maxtext": spec.maxtext,
        "python": spec.python,
        "description": spec.description,
        "requirements": list(spec.requirements),
        "no_deps": list(spec.no_deps),
        "overrides": list(spec.overrides),
        "exclude_newer": spec.exclude_newer,
        "wheels_for_python": None if other is None else {"python": other.python, "no_deps": list(other.no_deps)},
        "env": dict(spec.env),
        "constraints": list(constraint_lines(spec)),
        "maxtext_compat": __version__,
        "matrix": fingerprint(m),
    }


_PARTS = {
    "requirements": lambda spec: spec.requirements,
    "no-deps": lambda spec: spec.no_deps,
    "overrides": lambda spec: spec.overrides,
}


def _part_notes(spec: EnvironmentSpec, fmt: str) -> list[str]:
    """Comment lines that say how this part is installed and which other parts the set has (a part alone is not
    the set: 0.1.0's is all no-deps pins, 0.2.5's needs its overrides)."""
    notes = [f"# {spec.name}, part {fmt}: the tested set is every part, installed in this order with uv:"]
    for part, how in (("requirements", "-r"), ("no-deps", "--no-deps -r")):
        if _PARTS[part](spec):
            notes.append(f"#   uv pip install {how} <(maxtext-compat pins {spec.name} --format {part}) ...")
    held = [f"--exclude-newer {spec.exclude_newer}"] if spec.exclude_newer else []
    if spec.overrides:
        held.append(f"--override <(maxtext-compat pins {spec.name} --format overrides)")
    if held:
        notes.append(f"#   each with: {' '.join(held)}")
    if spec.wheels_for_python is not None:
        notes.append(f"#   and the {spec.wheels_for_python.python} wheels: see --format json (wheels_for_python)")
    if not _PARTS[fmt](spec):
        notes.append(f"#   (this set has no {fmt} pins)")
    return notes


def render(spec: EnvironmentSpec, m: CompatMatrix, fmt: str, folder: Path | None = None) -> str:
    """The set in one of FORMATS (`commands`: a shell script that builds it in ./.venv with uv)."""
    if fmt == "json":
        return json.dumps(describe(spec, m), indent=2)
    if fmt in ("requirements", "no-deps", "overrides"):
        return "\n".join([*_part_notes(spec, fmt), *_PARTS[fmt](spec)])
    where = folder or Path(f"pins-{spec.name}")
    steps = install_steps(spec, where)
    lines = [f"# {spec.name}: {spec.description}", "set -e", f"mkdir -p {shlex.quote(str(where))}"]
    for name, content in dict(f for s in steps for f in s.files).items():
        body = "\n".join(content)
        lines.append(f"cat > {shlex.quote(str(where / name))} <<'EOF'\n{body}\nEOF")
    lines.append(f"uv venv --python {spec.python} .venv")
    lines += [f"uv pip install --python .venv/bin/python {shlex.join(s.args)}" for s in steps]
    # the variables the set was tested under (no TPU): defaults, a value already set wins
    lines += [f'export {k}="${{{k}:-{v}}}"' for k, v in spec.env.items()]
    return "\n".join(lines)
