"""Pin sets and environments: the installs the compat test matrix builds.

A pin set (compat_matrix.yaml's `pin_sets:`, shipped in the wheel) is the tested install of one MaxText release:
`maxtext-compat pins` prints it and `maxtext-compat matrix` builds it in any project. An environment
(tests/environments.yaml, this repository's CI only) is a pin set plus what our own tests need (`pins:`), or a
list of pins of its own (the kernel-only and unit environments). Both are EnvironmentSpecs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from maxtext_compat.errors import MatrixError
from maxtext_compat.matrix.schema import Yaml, check_keys, normalized_version, parsed, read_struct, reader_for
from maxtext_compat.matrix.values import ENV_NAME_PATTERN, ENV_NAME_RULE, FreeText
from maxtext_compat.matrix.yaml_node import Node


def read_requirement(n: Node) -> str:
    """One PEP 508 requirement (`jax==0.11.2`)."""
    text = n.nonempty_string()
    try:
        Requirement(text)
    except InvalidRequirement as exc:
        raise n.error(f"requirement {text!r} is not valid: {exc}", fix="use PEP 508 syntax, e.g. jax==0.11.2") from None
    return text


def read_test_files(node: Node) -> tuple[str, ...]:
    """`tests:`: test files of this repository, as paths relative to its root (tests/...py)."""
    files = node.string_list()
    for f in files:
        parts = f.split("/")
        if parts[0] != "tests" or not f.endswith(".py") or ".." in parts or "" in parts:
            raise node.error(
                f"is not a test file of this repository: {f!r}",
                expected="paths like tests/compat/test_paged_rpa.py (relative, under tests/, no '..')",
                fix="list the test files the environment runs, or drop `tests:` to run the whole suite",
            )
    if not files:
        raise node.error("is empty", expected="at least one test file", fix="drop `tests:` to run the whole suite")
    return files


Pins = tuple[Annotated[str, Yaml(read=read_requirement)], ...]
MaxTextRelease = Annotated[str, parsed(normalized_version, "a MaxText release")]
PythonVersion = Annotated[str, parsed(normalized_version, "a Python version like 3.12")]


@dataclass(frozen=True)
class WheelsForPython:
    """Pins installed without dependencies from wheels built for another Python version.

    Why: vllm-tpu ships cp312 wheels only (its sdist needs torch to build), yet its Python code runs on
    3.11, the TPU VM's interpreter; its two compiled helpers are optional. The dependencies it needs are
    listed in the environment's own requirements."""

    python: PythonVersion
    no_deps: Pins


@dataclass(frozen=True)
class EnvironmentSpec:
    """A real environment the project builds and runs the suite in."""

    name: Annotated[str, Yaml(given=True)]  # its key under `environments:`
    description: str
    python: PythonVersion
    maxtext: MaxTextRelease | None
    requirements: Pins = ()
    no_deps: Pins = ()
    wheels_for_python: WheelsForPython | None = None  # no-deps pins from wheels of another Python (vllm-tpu on 3.11)
    overrides: tuple[str, ...] = ()
    exclude_newer: FreeText | None = None
    env: Mapping[str, FreeText] = field(default_factory=dict)
    serving: bool = False
    # Left out of a plain `matrix` run (make test): it runs in make test-extended (MAXTEXT_COMPAT_EXTENDED=1) and
    # whenever it is named.
    extended: bool = False
    tests: Annotated[tuple[str, ...], Yaml(read=read_test_files)] = ()  # test files it runs (empty: the whole suite)
    # Another environment whose pins this one takes, with its own MaxText release pinned instead.
    like: Annotated[str | None, Yaml(later=True)] = None
    # Added to the pins (its own or those `like:` copied).
    extra_requirements: Annotated[Pins, Yaml(later=True)] = ()
    # The pin set this environment starts from, as is (tests/environments.yaml only), and no-deps pins added to it.
    pins: Annotated[str | None, Yaml(later=True)] = None
    extra_no_deps: Annotated[Pins, Yaml(later=True)] = ()

    def pinned(self, package: str) -> str | None:
        """The exact version of `package` this environment installs (`name==X`; an override wins over its pins)."""
        for lines in (self.overrides, (*self.requirements, *self.no_deps)):
            for line in lines:
                try:
                    req = Requirement(line)
                except InvalidRequirement:  # a path or URL requirement: not a version pin
                    continue
                if canonicalize_name(req.name) == canonicalize_name(package):
                    exact = [s.version for s in req.specifier if s.operator in ("==", "===")]
                    if exact:
                        return exact[0]
        return None

    def as_dict(self) -> dict[str, Any]:
        """The fields that decide what is installed (the build's spec hash), `like:` and the extras folded in."""
        # `tests` and `wheels_for_python` only when set: the spec hashes of the environments without them stay.
        other = self.wheels_for_python
        return (
            ({"tests": list(self.tests)} if self.tests else {})
            | ({"wheels_for_python": {"python": other.python, "no_deps": list(other.no_deps)}} if other else {})
        ) | {
            "name": self.name,
            "description": self.description,
            "python": self.python,
            "maxtext": self.maxtext,
            "requirements": list(self.requirements),
            "no_deps": list(self.no_deps),
            "overrides": list(self.overrides),
            "exclude_newer": self.exclude_newer,
            "env": dict(self.env),
            "serving": self.serving,
        }


# What only an environment of this repository's CI may say: a pin set is an install, not a test plan.
CI_ONLY_KEYS = frozenset({"pins", "extra_no_deps", "serving", "tests", "extended"})
# What an environment that says `pins:` takes from its set and may not say again (so the CI installs what users get).
PIN_SET_KEYS = (
    "like", "maxtext", "python", "requirements", "no_deps", "overrides", "exclude_newer", "wheels_for_python", "env",
)  # fmt: skip


def parse_environment(
    name: str, n: Node, earlier: Mapping[str, EnvironmentSpec], pin_sets: Mapping[str, EnvironmentSpec] | None = None
) -> EnvironmentSpec:
    """One entry of `environments:` (with `pin_sets`, those it may start from) or, without them, of `pin_sets:`;
    `earlier` are the entries above it (the ones `like:` may name)."""
    if not valid_env_name(name):
        raise MatrixError(
            "is not a valid environment name (it is the name of a directory that `envs build` replaces)",
            path=n.path,
            key=n.key,
            expected=ENV_NAME_RULE,
            found=repr(name),
            fix="rename the environment, e.g. `maxtext-0.2.5`",
        )
    check_keys(EnvironmentSpec, n)
    if pin_sets is None:
        for key in sorted(CI_ONLY_KEYS & set(n.mapping())):
            raise n.child(key).error(
                "belongs to an environment of this repository's CI, not to a pin set",
                expected=f"a pin set's keys (none of {sorted(CI_ONLY_KEYS)})",
                fix="move the test plan to tests/environments.yaml; a pin set says only what is installed",
            )
    pin_set = _pin_set(n, pin_sets)
    if pin_set is not None:
        inherited = _whole(pin_set)
        maxtext = pin_set.maxtext
        base = None
    else:
        mt = n.optional("maxtext")
        maxtext = None if mt is None else reader_for(MaxTextRelease)(mt)
        base = _like(n, earlier, maxtext)
        inherited = {} if base is None else _inherited(base, maxtext)
    extra_node, extra_nd_node = n.optional("extra_requirements"), n.optional("extra_no_deps")
    extra: tuple[str, ...] = () if extra_node is None else reader_for(Pins)(extra_node)
    extra_nd: tuple[str, ...] = () if extra_nd_node is None else reader_for(Pins)(extra_nd_node)
    spec = read_struct(
        EnvironmentSpec, n, defaults=inherited, name=name, like=None if base is None else base.name,
        pins=None if pin_set is None else pin_set.name,
    )  # fmt: skip
    return dataclasses.replace(
        spec, requirements=spec.requirements + extra, extra_requirements=extra, no_deps=spec.no_deps + extra_nd,
        extra_no_deps=extra_nd,
    )  # fmt: skip


def _pin_set(n: Node, pin_sets: Mapping[str, EnvironmentSpec] | None) -> EnvironmentSpec | None:
    """The pin set `pins:` names (an environment that names one takes it whole: no `like:`, no `maxtext:`)."""
    node = n.optional("pins")
    if node is None or pin_sets is None:
        return None
    for other in PIN_SET_KEYS:
        if n.has(other):  # `maxtext: null` too: it would say "no MaxText" of a set that installs one
            raise n.child(other).error(
                "cannot be combined with `pins:` (the pin set says what is installed, and how)",
                fix=f"drop `{other}:` and keep `pins:` (add packages with extra_requirements / extra_no_deps), or "
                "list the pins here instead of `pins:`",
            )
    name = node.string()
    if name not in pin_sets:
        raise node.error(
            f"names no pin set of the matrix: {name!r}",
            expected=f"one of {sorted(pin_sets)}",
            fix="name a key of `pin_sets:` in compat_matrix.yaml",
        )
    return pin_sets[name]


def _whole(pin_set: EnvironmentSpec) -> dict[str, Any]:
    """Every install field of a pin set (an environment with `pins:` starts from exactly what users install)."""
    return {
        "description": pin_set.description,
        "python": pin_set.python,
        "maxtext": pin_set.maxtext,
        "requirements": pin_set.requirements,
        "no_deps": pin_set.no_deps,
        "wheels_for_python": pin_set.wheels_for_python,
        "overrides": pin_set.overrides,
        "exclude_newer": pin_set.exclude_newer,
        "env": dict(pin_set.env),
    }


def valid_env_name(name: object) -> bool:
    """Whether `name` may name an environment (a single, plain directory name under the envs folder)."""
    return isinstance(name, str) and ENV_NAME_PATTERN.fullmatch(name) is not None


def _inherited(base: EnvironmentSpec, maxtext: str | None) -> dict[str, Any]:
    """What an entry with `like:` takes from `base` for the keys it does not set: the pins, re-pinned."""
    return {
        "python": base.python,
        "requirements": tuple(_repin_maxtext(r, maxtext) for r in base.requirements),
        "no_deps": tuple(_repin_maxtext(r, maxtext) for r in base.no_deps),
        "wheels_for_python": base.wheels_for_python,
        "overrides": tuple(_repin_maxtext(r, maxtext) for r in base.overrides),
        "exclude_newer": base.exclude_newer,
        "env": dict(base.env),
        "serving": base.serving,
        "tests": base.tests,
    }


def _like(n: Node, earlier: Mapping[str, EnvironmentSpec], maxtext: str | None) -> EnvironmentSpec | None:
    """The environment `like:` names: this one takes its pins, with its own MaxText release pinned instead.

    Why: MaxText 0.2.2-0.2.5 install on the very same jax/flax/tpu-inference stack; one list of
    pins, written once, keeps their environments from drifting apart.
    """
    node = n.optional("like")
    if node is None:
        return None
    other = node.string()
    if other not in earlier:
        raise node.error(
            f"names an environment that is not defined above it: {other!r}",
            expected=f"one of {sorted(earlier)}",
            fix="define the entry it copies first (earlier in the same section: `pin_sets:` or `environments:`), or "
            "fix the name",
        )
    base = earlier[other]
    if maxtext is None or base.maxtext is None:
        raise node.error(
            "copies another environment's pins for a different MaxText release; both must name one",
            expected="`maxtext:` set here and in the environment copied",
            fix=f"set `maxtext:` in {n.key} and in environments.{other}, or list the pins here instead of `like:`",
        )
    if not any(_pins_maxtext(r) for r in (*base.requirements, *base.no_deps)):
        raise node.error(
            f"environments.{other} does not pin maxtext==X, so there is nothing to re-pin",
            expected="an environment whose requirements or no_deps pin maxtext",
            fix="list this environment's pins explicitly instead of `like:`",
        )
    return base


def _pins_maxtext(requirement: str) -> bool:
    return canonicalize_name(Requirement(requirement).name) == "maxtext"


def _repin_maxtext(requirement: str, release: str | None) -> str:
    return f"maxtext=={release}" if release and _pins_maxtext(requirement) else requirement


def drop_maxtext(requirements: tuple[str, ...]) -> tuple[str, ...]:
    """`requirements` without the line that installs maxtext (a user's own MaxText goes in its place)."""
    return tuple(r for r in requirements if not _pins_maxtext(r))
