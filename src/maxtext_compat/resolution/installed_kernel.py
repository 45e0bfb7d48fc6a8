"""The installed tpu-inference: its matrix row, its RPA entry point and its AttentionMetadata class.

Why apart from the dispatcher: the paged-metadata code needs the AttentionMetadata class and the
dispatcher needs the paged checks; the installed-release lookup both use sits beneath them.
Reads package metadata only; importing tpu-inference happens in `entry_point` and
`attention_metadata_class`.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from maxtext_compat.errors import CompatError, KernelUnavailableError
from maxtext_compat.matrix import CompatMatrix, TpuInferenceRow, load_matrix


@dataclass(frozen=True)
class InstalledRpa:
    version: str
    row: TpuInferenceRow

    @property
    def label(self) -> str:
        return f"tpu-inference {self.version}"


def install_hint(m: CompatMatrix, maxtext: str | None) -> str:
    """The pip command for the newest tpu-inference the installed MaxText release works with.

    Why per release: MaxText 0.2.0/0.2.1 need tpu-inference < 0.20 (jax 0.9.2); telling their
    users to install the newest vllm-tpu would hand them an incompatible pair.
    """
    wanted = None
    if maxtext is not None:
        try:
            wanted = m.row(maxtext).requires.tpu_inference
        except CompatError:  # an unlisted release: any listed tpu-inference is a fair hint
            wanted = None
    releases = [rel for r in m.tpu_inference for rel in r.releases.values() if rel.vllm_tpu]
    fitting = [rel for rel in releases if wanted is None or wanted.contains(rel.version, prereleases=True)]
    if not fitting:
        return "install tpu-inference with the vllm-tpu release that pins it (see compat_matrix.yaml)"
    best = max(fitting, key=lambda rel: Version(rel.version))
    who = f"the newest MaxText {maxtext} works with; " if wanted is not None else ""
    return f"pip install vllm-tpu=={best.vllm_tpu} (pins tpu-inference {best.version}, {who}it needs jax {best.jax})"


@functools.lru_cache(maxsize=1)
def installed_rpa() -> InstalledRpa:
    """The installed tpu-inference and its matrix row (read from package metadata, no import)."""
    from maxtext_compat.versions import installed_versions

    versions = installed_versions()
    info = versions.get("tpu_inference")
    if info is None:
        mt = versions.get("maxtext")
        raise KernelUnavailableError(
            "tpu-inference is not installed, so there is no ragged paged attention kernel",
            argument="tpu_inference",
            expected="an installed tpu-inference listed in compat_matrix.yaml",
            fix=install_hint(load_matrix(), None if mt is None else mt.version),
        )
    m = load_matrix()
    row = m.tpu_inference_row(info.version)
    if row is None:
        raise KernelUnavailableError(
            "the installed tpu-inference is not covered by the compat matrix",
            argument="tpu_inference",
            expected=f"one of {[str(r.versions) for r in m.tpu_inference]}",
            found=info.version,
            fix="install a listed release, or add a row to compat_matrix.yaml (MAXTEXT_COMPAT_MATRIX)",
        )
    return InstalledRpa(info.version, row)


def row_label(row: TpuInferenceRow) -> str:
    return f"tpu-inference {row.versions}"


def first_release_with(name: str, matrix: CompatMatrix | None = None) -> str | None:
    """The oldest tpu-inference release whose RPA entry point takes parameter `name`."""
    m = matrix if matrix is not None else load_matrix()
    found = [
        Version(v)
        for r in m.tpu_inference
        if name in (*r.rpa.params, *r.rpa.factory_params, *r.rpa.optional_kwargs)
        for v in r.releases
    ]
    return str(min(found)) if found else None


def entry_point(row: TpuInferenceRow) -> Callable[..., Any]:
    """Import the row's `sharded_ragged_paged_attention` (imports tpu-inference, vllm, torch)."""
    try:
        module = importlib.import_module(row.rpa.module)
    except ImportError as exc:
        raise KernelUnavailableError(
            f"cannot import the RPA module the matrix names: {exc}",
            argument="tpu_inference",
            expected=f"{row.rpa.module} ({row_label(row)})",
            fix="install vllm-tpu with its tpu-inference (the module imports vllm and torch)",
        ) from exc
    fn = getattr(module, row.rpa.function, None)
    if fn is None:
        raise KernelUnavailableError(
            "the RPA entry point the matrix names is missing",
            argument="tpu_inference",
            expected=f"{row.rpa.module}.{row.rpa.function}",
            fix="fix the row in compat_matrix.yaml",
        )
    return fn


def attention_metadata_class(row: TpuInferenceRow | None = None) -> type:
    """tpu-inference's AttentionMetadata class for the installed (or given) release."""
    r = row if row is not None else installed_rpa().row
    try:
        return getattr(importlib.import_module(r.metadata.module), r.metadata.cls)
    except (ImportError, AttributeError) as exc:
        raise KernelUnavailableError(
            f"cannot load tpu-inference's AttentionMetadata: {exc}",
            argument="tpu_inference",
            expected=f"{r.metadata.module}:{r.metadata.cls}",
            fix="install vllm-tpu with its tpu-inference",
        ) from exc
