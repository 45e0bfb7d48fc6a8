"""Which of a MaxText row's known defects apply to the installed combination, and the refusal of those that do.

Why conditions: an upstream defect often bites only with some tpu-inference releases and some configs
(a model family, an attention kernel). The matrix says when (`when:`); this module decides it for the
installed versions (a dev build of an `after_release` package counts as its named release) and, for a
defect no shim can repair (`remedy: refuse`), raises a typed error when MaxText builds a config that
would hit it. Imports neither jax nor MaxText.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from packaging.version import Version

from maxtext_compat.errors import ShimRefusedError
from maxtext_compat.matrix import CompatMatrix, KnownDefect, MaxTextRow

Applies = Literal["yes", "no", "with-config"]  # with-config: the versions match, the config decides


@dataclass(frozen=True)
class DefectStatus:
    """One known defect of the installed row, and whether the installed versions meet its condition."""

    defect: KnownDefect
    applies: Applies
    reason: str  # why it does or does not apply (for doctor)


def _matches(value: Any, patterns: tuple[str, ...]) -> bool:
    return value is not None and any(fnmatch.fnmatchcase(str(value), p) for p in patterns)


def version_status(defect: KnownDefect, tpu_inference: Version | None) -> tuple[Applies, str]:
    """Does the defect apply to these versions (before looking at a config)?"""
    spec = defect.when.tpu_inference
    if spec is not None:
        if tpu_inference is None:
            return "no", f"needs tpu-inference {spec}; none is installed"
        if not spec.contains(tpu_inference, prereleases=True):
            return "no", f"tpu-inference {tpu_inference} is outside {spec}"
    found = f"tpu-inference {tpu_inference}" if spec is not None else "this release"
    if defect.when.config:
        return "with-config", f"{found}; applies when {defect.when.describe(versions=False)}"
    return "yes", found


def config_matches(defect: KnownDefect, config: Any) -> bool:
    """Every config key of the condition has one of its values (missing keys never match)."""
    return all(_matches(getattr(config, key, None), values) for key, values in defect.when.config.items())


def installed_tpu_inference(matrix: CompatMatrix | None = None) -> Version | None:
    """The installed tpu-inference as the matrix compares it (a nightly counts as its named release)."""
    from maxtext_compat.matrix import load_matrix
    from maxtext_compat.versions import installed_versions

    found = installed_versions().get("tpu_inference")
    if found is None:
        return None
    return (matrix or load_matrix()).comparable("tpu_inference", found.version)


def statuses(row: MaxTextRow, tpu_inference: Version | None) -> list[DefectStatus]:
    return [DefectStatus(d, *version_status(d, tpu_inference)) for d in row.known_defects]


# ----------------------------------------------------------------------------------------------
# Refusals
# ----------------------------------------------------------------------------------------------


def _batched_kernel_unbound() -> bool:
    """True when tpu-inference has (or will) bind its default kernel, not the experimental batched one."""
    module = sys.modules.get("tpu_inference.layers.common.attention_interface")
    if module is not None:
        bound = getattr(getattr(module, "ragged_paged_attention", None), "__module__", "")
        return "batched_rpa" not in bound
    return os.environ.get("USE_BATCHED_RPA_KERNEL", "").strip().lower() not in ("1", "true")


# Extra conditions a refusal checks at config time (the matrix cannot express them): still applies?
STILL_APPLIES: dict[str, Callable[[Any], bool]] = {
    "batched-rpa-kernel-bound-at-import": lambda config: _batched_kernel_unbound(),
}

FIXES: dict[str, str] = {
    "batched-rpa-kernel-bound-at-import": "set attention='vllm_rpa', or start vLLM with USE_BATCHED_RPA_KERNEL=1 in "
    "its environment (then tpu-inference binds the batched kernel at import)",
}


def refusal(row: MaxTextRow, defect: KnownDefect, tpu_inference: Version | None, config: Any) -> ShimRefusedError:
    keys = {key: getattr(config, key, None) for key in defect.when.config}
    found = ", ".join(f"{k}={v!r}" for k, v in keys.items())
    upgrade = f"use MaxText with the upstream fix ({defect.upstream_fix})" if defect.upstream_fix else ""
    fix = FIXES.get(defect.id) or "use another config for this model"
    return ShimRefusedError(
        f"known defect {defect.id} on MaxText {row.name} with tpu-inference {tpu_inference}: {defect.summary}",
        argument=", ".join(keys) or "config",
        expected=f"a config outside the defect's condition ({defect.when.describe()})",
        found=found,
        fix=f"{fix}; or {upgrade}" if upgrade else fix,
    )


def check_config(row: MaxTextRow, tpu_inference: Version | None, config: Any) -> None:
    """Raise ShimRefusedError for the first refused defect this config would hit."""
    for defect in row.known_defects:
        if defect.remedy != "refuse" or version_status(defect, tpu_inference)[0] == "no":
            continue
        if not config_matches(defect, config):
            continue
        still = STILL_APPLIES.get(defect.id)
        if still is not None and not still(config):
            continue
        raise refusal(row, defect, tpu_inference, config)


def describe(
    statuses_: list[DefectStatus],
    *,
    fixed_by: str = "the known-defects shim",
    refused: str = "refused with a typed error",
) -> list[str]:
    """Doctor's lines: one per defect of the installed row (with its upstream file and line when known)."""
    lines = []
    for s in statuses_:
        what = {"yes": "applies", "no": "does not apply", "with-config": "may apply"}[s.applies]
        remedy = f"fixed by {fixed_by}" if s.defect.remedy == "fix" else refused
        tail = f" ({remedy})" if s.applies != "no" else ""
        where = f" [{s.defect.upstream}]" if s.defect.upstream else ""
        lines.append(f"{s.defect.id}: {what} - {s.reason}{tail}{where}")
    return lines


def stack_statuses(row: Any, tpu_inference: Version | None) -> list[DefectStatus]:
    """The serving stack's own defects (the installed tpu-inference range's `known_defects`), for every model."""
    return [] if row is None else [DefectStatus(d, *version_status(d, tpu_inference)) for d in row.known_defects]


# ----------------------------------------------------------------------------------------------
# The attention backend of a vLLM server
# ----------------------------------------------------------------------------------------------

VLLM_ATTENTION = ("vllm_rpa", "vllm_batched_rpa")
BACKEND_MODULE = "tpu_inference.layers.common.attention_backend"


def check_attention_backend(config: Any) -> None:
    """Refuse a MaxText vLLM config when the server selected an attention backend other than RPA.

    MaxText's layers call ragged paged attention themselves; tpu-inference lays out the KV cache for the
    backend `--attention-backend` selects, so another backend's cache would reach the RPA kernel. Reads
    only modules a vLLM process has already imported (nothing is imported here).
    """
    if getattr(config, "attention", None) not in VLLM_ATTENTION:
        return
    backends = sys.modules.get(BACKEND_MODULE)
    vllm_config_module = sys.modules.get("vllm.config")
    if backends is None or vllm_config_module is None or not hasattr(backends, "attention_backend_name"):
        return
    current = getattr(vllm_config_module, "get_current_vllm_config_or_none", None)
    server_config = current() if current is not None else None
    if server_config is None:  # not inside a vLLM engine's config context: no server to check
        return
    name = backends.attention_backend_name(server_config)
    if name != "rpa":
        raise ShimRefusedError(
            f"--attention-backend {name} cannot serve a MaxText model: MaxText's layers run ragged paged attention "
            "themselves, on a KV cache laid out for the backend you selected",
            argument="--attention-backend",
            expected="rpa (no --attention-backend, or one vLLM maps to RPA)",
            found=name,
            fix=f"start vLLM without --attention-backend {name} for MaxText models",
        )
