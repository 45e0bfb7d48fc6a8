"""Where the compat matrix runs: this repository's checkout, or any project that pip-installed maxtext-compat.

Why two kinds: in this checkout the matrix is our CI's layout (tests/environments.yaml: 24 environments, the
MaxText ones each a pin set plus our tests' needs) and runs our suite; in a user's project it is the shipped pin
sets, with the user's package installed editable on top of each and their pytest run there. Everything the runner
touches that used to assume this checkout (the environments' folder, the reports, recorded durations and memory
peaks, what is installed besides the pins) is a field here, so one runner serves both.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maxtext_compat.errors import EnvironmentBuildError, InvalidArgumentError
from maxtext_compat.matrix import CompatMatrix, EnvironmentSpec, load_matrix, with_environments

ENVS_DIR_VAR = "MAXTEXT_COMPAT_ENVS_DIR"
STATE_DIR_NAME = ".maxtext-compat"  # in a user's project: environments, reports, logs, recorded durations
CI_LAYOUT = "tests/environments.yaml"
DURATIONS_NAME, MEMORY_NAME = "env_durations.json", "env_memory.json"


@dataclass(frozen=True)
class Workspace:
    """One place the matrix runs; see the module docstring."""

    project: Path  # pytest runs here
    state: Path  # reports, junit files, logs
    envs_dir: Path
    matrix: CompatMatrix  # its environments: the CI layout, or the pin sets
    # `uv pip install` arguments that put maxtext-compat (and its test extra) in an environment; None: the running
    # installation, repacked into a wheel when an environment is built (selfwheel)
    self_install: tuple[str, ...] | None
    project_install: tuple[str, ...] | None = None  # the user's project (None: this checkout itself)
    records: Path | None = None  # the folder of env_durations.json and env_memory.json
    identity: dict[str, Any] = field(default_factory=dict)  # what besides the pins decides an environment's contents
    maxtext_install: tuple[str, ...] | None = None  # `matrix --maxtext`: the user's own MaxText, in place of the set's
    maxtext_source: str | None = None  # that MaxText as the user named it (a folder, a wheel, a VCS URL)

    @property
    def is_checkout(self) -> bool:
        """This repository's own CI run (its claims about mocked rows hold only here)."""
        return self.project_install is None

    @property
    def project_name(self) -> str:
        """The project's name as its pyproject.toml gives it (the same on every machine a shard runs on)."""
        deps = self.identity.get("project")
        name = deps.get("name") if isinstance(deps, dict) else None
        return str(name) if name else self.project.name

    @property
    def durations_file(self) -> Path | None:
        return None if self.records is None else self.records / DURATIONS_NAME

    @property
    def memory_file(self) -> Path | None:
        return None if self.records is None else self.records / MEMORY_NAME

    def spec_env(self, spec: EnvironmentSpec) -> dict[str, str]:
        """The variables a run in `spec` gets: our CI's are set as written; a pin set's are defaults the caller's own
        environment overrides (JAX_PLATFORMS=cpu was how the set was tested, not what a TPU runner wants)."""
        if self.is_checkout:
            return {**os.environ, **spec.env}
        return {**spec.env, **os.environ}


def checkout_root() -> Path | None:
    """The source checkout this package runs from, when it runs from one (an editable install of this repo)."""
    root = Path(__file__).resolve().parents[3]  # <root>/src/maxtext_compat/runner/workspace.py
    wanted = ("pyproject.toml", "compat_matrix.yaml", CI_LAYOUT)
    return root if all((root / f).is_file() for f in wanted) else None


def _envs_dir(default: Path) -> Path:
    override = os.environ.get(ENVS_DIR_VAR)
    if override is None or override == "":
        return default
    if not override.strip() or "\0" in override:
        raise InvalidArgumentError(
            f"{ENVS_DIR_VAR} is not a usable folder name",
            argument=ENVS_DIR_VAR,
            expected="the path of the folder that holds the environments",
            found=repr(override),
            fix=f"set {ENVS_DIR_VAR} to a folder path, or unset it to use the default folder",
        )
    return Path(override)


def for_checkout(root: Path, *, state: Path | None = None) -> Workspace:
    """This repository: its CI layout, the checkout installed editable with its test extra."""
    m = with_environments(load_matrix(root / "compat_matrix.yaml"), root / CI_LAYOUT)
    return Workspace(
        project=root,
        state=state if state is not None else root / "build",
        envs_dir=_envs_dir(root / ".envs"),
        matrix=m,
        self_install=("-e", f"{root}[test]"),
        records=root / "tests",
        identity={"project": project_dependencies(root)},
    )


def for_project(project: Path, *, state: Path | None = None, extras: str = "") -> Workspace:
    """A user's project: the shipped pin sets as environments, their package installed editable on each."""
    project = project.resolve()
    if not (project / "pyproject.toml").is_file():
        raise EnvironmentBuildError(
            f"{project} has no pyproject.toml, so there is no project to install in the environments",
            argument="--project",
            expected="the folder of a Python project (with pyproject.toml)",
            found=str(project),
            fix="run from your project's folder, or pass --project PATH",
        )
    state = (state if state is not None else project / STATE_DIR_NAME).resolve()
    m = matrix_here(project)
    target = f"{project}[{extras}]" if extras else str(project)
    return Workspace(
        project=project,
        state=state,
        envs_dir=_envs_dir(state / "envs"),
        matrix=m,
        self_install=None,
        project_install=("-e", target),
        records=state,
        identity={"project": project_dependencies(project), "extras": extras, "self": _self_identity()},
    )


def current(project: Path | None = None, *, state: Path | None = None, extras: str = "") -> Workspace:
    """The workspace for a command run in `project` (default: the current folder): this checkout when it is the
    checkout maxtext-compat runs from, a user's project otherwise."""
    if state is not None and state.exists() and not state.is_dir():
        raise InvalidArgumentError(
            "is not a folder, so environments and results cannot go there",
            argument="--cache-dir",
            expected="a folder (made when missing)",
            found=f"{state} (a file)",
            fix="pass a folder path, e.g. --cache-dir results",
        )
    root = checkout_root()
    here = (project or Path.cwd()).resolve()
    if root is not None and here == root:
        if extras:
            raise InvalidArgumentError(
                "extras name the user's project's extras; this checkout installs its own test extra",
                argument="--extras",
                found=repr(extras),
                fix="drop --extras when running in the maxtext-compat checkout",
            )
        return for_checkout(root, state=state)
    return for_project(here, state=state, extras=extras)


def matrix_here(project: Path | None = None) -> CompatMatrix:
    """The matrix a report is drawn with: this checkout's CI layout in it, the shipped pin sets anywhere else (no
    project needed: the job that merges the results of many machines may run in any folder)."""
    root = checkout_root()
    if root is not None and (project or Path.cwd()).resolve() == root:
        return for_checkout(root).matrix
    m = load_matrix()
    return dataclasses.replace(m, environments=dict(m.pin_sets))


def default() -> Workspace:
    """For library calls that name no workspace: this checkout when there is one, else the current folder."""
    root = checkout_root()
    return for_checkout(root) if root is not None else for_project(Path.cwd())


def project_dependencies(project: Path) -> dict[str, object]:
    """What in a project's pyproject.toml decides an environment's contents (entry points are recorded at install
    time: a new plugin or script needs a reinstall too)."""
    import tomllib

    data = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
    proj = data.get("project", {})
    return {
        "name": proj.get("name"),
        "dependencies": proj.get("dependencies", []),
        "optional": proj.get("optional-dependencies", {}),
        "scripts": proj.get("scripts", {}),
        "entry_points": proj.get("entry-points", {}),
    }


def _self_identity() -> str:
    """The running maxtext-compat's identity: its RECORD (every installed file's hash) and where it came from."""
    from importlib import metadata

    dist = metadata.distribution("maxtext-compat")
    parts = [dist.version, dist.read_text("RECORD") or "", dist.read_text("direct_url.json") or ""]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def with_own_maxtext(ws: Workspace, names: list[str], source: str) -> tuple[Workspace, list[str]]:
    """The workspace and environment that run the one pin set `names` holds with MaxText from `source` in place of
    its own: a folder (installed editable), a wheel, or a VCS URL (`git+file:///path@REF`). The environment has a
    name of its own (the set's, `-own-` and a digest of the source), so the set's environment is left as it is."""
    from maxtext_compat.matrix.environments import drop_maxtext

    if len(names) != 1:
        raise InvalidArgumentError(
            "--maxtext replaces the MaxText of one pin set", argument="names", expected="one release",
            found=names, fix="name one release, e.g. `maxtext-compat matrix 0.2.5 --maxtext ../maxtext`",
        )  # fmt: skip
    spec = ws.matrix.environment(names[0])
    install, ident = _maxtext_install(source)
    no_deps = len(drop_maxtext(spec.no_deps)) < len(spec.no_deps)  # the set installs MaxText without its deps
    own = f"{spec.name}-own-{hashlib.sha256(ident.encode()).hexdigest()[:8]}"
    derived = dataclasses.replace(
        spec, name=own, requirements=drop_maxtext(spec.requirements), no_deps=drop_maxtext(spec.no_deps),
        description=f"{spec.description}; MaxText from {source}",
    )  # fmt: skip
    m = dataclasses.replace(ws.matrix, environments={**ws.matrix.environments, own: derived})
    install = (*install, "--no-deps") if no_deps else install
    identity = {**ws.identity, "maxtext_source": ident}
    return dataclasses.replace(ws, matrix=m, maxtext_install=install, maxtext_source=source, identity=identity), [own]


def _maxtext_install(source: str) -> tuple[tuple[str, ...], str]:
    """(`uv pip install` arguments, what identifies the source) for a folder, a wheel or a VCS URL."""
    if source.startswith(("git+", "hg+", "svn+", "bzr+")):
        return (f"maxtext @ {source}",), source
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".whl":
        return (str(path.resolve()),), hashlib.sha256(path.read_bytes()).hexdigest()
    if path.is_dir() and any((path / f).is_file() for f in ("pyproject.toml", "setup.py")):
        return ("-e", str(path.resolve())), str(path.resolve())  # editable: an edit needs no rebuild
    raise InvalidArgumentError(
        "is no MaxText to install",
        argument="--maxtext",
        expected="a folder holding MaxText's source (with pyproject.toml), a MaxText wheel, or git+file:///PATH@REF",
        found=source if path.exists() or "://" in source else f"{source} (no such file or folder)",
        fix="pass your MaxText checkout's folder, a wheel it built, or a git URL with the commit or branch",
    )
