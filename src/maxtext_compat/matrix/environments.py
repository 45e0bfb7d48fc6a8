"""The `environments:` section: the dev/test installs the compat test matrix builds."""

from __future__ import annotations

from collections.abc import Mapping

from packaging.utils import canonicalize_name
from packaging.version import Version

from maxtext_compat._yaml_reader import Node
from maxtext_compat.errors import MatrixError
from maxtext_compat.matrix.types import (
    ENV_NAME_PATTERN,
    ENV_NAME_RULE,
    EnvironmentSpec,
)


def parse_environment(name: str, n: Node, earlier: Mapping[str, EnvironmentSpec]) -> EnvironmentSpec:
    n.only_keys({
        "description", "python", "maxtext", "like", "requirements", "extra_requirements", "no_deps", "overrides",
        "exclude_newer", "env", "serving", "tests",
    })  # fmt: skip
    if not valid_env_name(name):
        raise MatrixError(
            "is not a valid environment name (it is the name of a directory that `envs build` replaces)",
            path=n.path,
            key=n.key,
            expected=ENV_NAME_RULE,
            found=repr(name),
            fix="rename the environment, e.g. `maxtext-0.2.5`",
        )
    mt = n.optional("maxtext")
    maxtext = None if mt is None else mt.parsed(lambda s: str(Version(s)), "a MaxText release")
    base = _like(n, earlier, maxtext)

    def strings(key: str) -> tuple[str, ...]:
        if n.optional(key) is not None:
            return n.child(key).string_list()
        return tuple(_repin_maxtext(r, maxtext) for r in getattr(base, key)) if base else ()

    reqs, no_deps = strings("requirements"), strings("no_deps")
    if n.optional("extra_requirements") is not None:  # added to the pins (own or copied by `like:`)
        reqs += n.child("extra_requirements").string_list()
    for r in reqs + no_deps:
        _check_requirement(r, n)
    env_node = n.optional("env")
    return EnvironmentSpec(
        name=name,
        description=n.child("description").nonempty_string(),
        python=n.child("python").parsed(lambda s: str(Version(s)), "a Python version like 3.12")
        if base is None or n.optional("python")
        else base.python,
        maxtext=maxtext,
        requirements=reqs,
        no_deps=no_deps,
        overrides=strings("overrides"),
        exclude_newer=n.child("exclude_newer").string()
        if n.optional("exclude_newer")
        else (base.exclude_newer if base else None),
        env=env_node.string_map() if env_node is not None else (dict(base.env) if base else {}),
        serving=n.child("serving").boolean() if n.optional("serving") else (base.serving if base else False),
        tests=_test_files(n) if n.optional("tests") is not None else (base.tests if base else ()),
    )


def _test_files(n: Node) -> tuple[str, ...]:
    """`tests:`: test files of this repository, as paths relative to its root (tests/...py)."""
    node = n.child("tests")
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


def valid_env_name(name: object) -> bool:
    """Whether `name` may name an environment (a single, plain directory name under the envs folder)."""
    return isinstance(name, str) and ENV_NAME_PATTERN.fullmatch(name) is not None


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
            fix="define the environment it copies first (earlier in `environments:`), or fix the name",
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
    from packaging.requirements import Requirement

    return canonicalize_name(Requirement(requirement).name) == "maxtext"


def _repin_maxtext(requirement: str, release: str | None) -> str:
    return f"maxtext=={release}" if release and _pins_maxtext(requirement) else requirement


def _check_requirement(text: str, n: Node) -> None:
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        Requirement(text)
    except InvalidRequirement as exc:
        raise n.error(f"requirement {text!r} is not valid: {exc}", fix="use PEP 508 syntax, e.g. jax==0.11.2") from None
