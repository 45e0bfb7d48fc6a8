"""compat_matrix.yaml text → CompatMatrix: every field checked, every error naming its key."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from packaging.version import Version

from maxtext_compat.matrix.environments import EnvironmentSpec, parse_environment
from maxtext_compat.matrix.schema import read_struct
from maxtext_compat.matrix.types import CompatMatrix
from maxtext_compat.matrix.yaml_node import Node, safe_load_text


def parse_matrix(text: str, path: str = "<string>") -> CompatMatrix:
    """Parse matrix YAML text; raises MatrixError naming the key on any problem."""
    doc = Node(safe_load_text(text, path), "", path)
    matrix = read_struct(CompatMatrix, doc, source=path)
    matrix = dataclasses.replace(matrix, pin_sets=_read_environments(doc.child("pin_sets"), matrix, None))
    if not doc.has("environments"):
        return matrix
    return parse_environments(text, path, matrix)


def parse_environments(text: str, path: str, matrix: CompatMatrix) -> CompatMatrix:
    """`matrix` with the `environments:` of the YAML `text` (our CI layout, starting from the pin sets)."""
    doc = Node(safe_load_text(text, path), "", path)
    if path != matrix.source:  # a file of its own (tests/environments.yaml) holds environments and nothing else
        doc.only_keys({"environments"})
    envs = _read_environments(doc.child("environments"), matrix, matrix.pin_sets)
    return dataclasses.replace(matrix, environments=envs)


def _read_environments(
    envs_node: Node, matrix: CompatMatrix, pin_sets: Mapping[str, EnvironmentSpec] | None
) -> dict[str, EnvironmentSpec]:
    """Each entry, its `maxtext:` one of the rows' releases (written as the row writes it); `pin_sets` are the sets
    an environment may start from (None: these are the pin sets)."""
    envs: dict[str, EnvironmentSpec] = {}
    releases = {r.release: r.name for r in matrix.maxtext}
    folded: dict[str, str] = {}
    for name, n in envs_node.items():
        spec = parse_environment(name, n, envs, pin_sets)
        mt_version = None if spec.maxtext is None else Version(spec.maxtext)
        if mt_version in releases and spec.maxtext != releases[mt_version]:  # 0.2.5.0 is row 0.2.5
            spec = dataclasses.replace(spec, maxtext=releases[mt_version])
        if name.lower() in folded:  # one directory on a case-insensitive file system (macOS)
            raise n.error(
                f"differs from environment {folded[name.lower()]!r} only in letter case",
                fix="give every environment a name that differs in more than letter case",
            )
        folded[name.lower()] = name
        if mt_version is not None and mt_version not in releases:
            names = [releases[v] for v in sorted(releases)]
            raise n.child("maxtext").error(
                "names a MaxText release without a row",
                expected=f"one of {names} or null",
                fix=f"set `{n.key}.maxtext` to one of {names} (null for no MaxText), "
                f"or add a `maxtext:` row for release {spec.maxtext}",
            )
        envs[name] = spec
    return envs
