"""Per-process serving facts: the resolved matrix rows, the backend, the runner's return arity.

Why cached per process: vLLM builds the model in the engine-core/worker process, sometimes more
than once; the decision (which backend, 3- or 4-tuple) must be the same every time and must come
from the matrix (`resolve()`), not from probing calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from maxtext_compat.errors import ResolutionError
from maxtext_compat.locks import fork_safe_lock

if TYPE_CHECKING:
    from maxtext_compat.resolution.resolver import Resolution
    from maxtext_compat.serving.backend import ServingBackend


@dataclass(frozen=True)
class ServingRuntime:
    resolution: Resolution
    backend: ServingBackend
    return_arity: int  # what tpu-inference's runner unpacks from model(...): 3 (< 0.20.0) or 4

    def describe(self) -> str:
        r = self.resolution
        tpi = r.versions.get("tpu_inference")
        return (
            f"MaxText {r.maxtext.name if r.maxtext else '?'} via backend {self.backend.name!r}, "
            f"tpu-inference {tpi.version if tpi else '?'} ({self.return_arity}-tuple model returns)"
        )


_LOCK = fork_safe_lock()
_CURRENT: list[ServingRuntime | None] = [None]
_FAILURE: list[BaseException | None] = [None]  # why this process cannot serve MaxText (set by the plugin)


def build_runtime(resolution: Resolution | None = None) -> ServingRuntime:
    from maxtext_compat.serving.backend import backend_for

    if resolution is None:
        from maxtext_compat.resolution.installed import installed_resolution

        found = installed_resolution()
        resolution = found.resolution
        import logging

        for w in found.warnings:  # a serving process logs them (vLLM's log is where operators look)
            logging.getLogger(__name__).warning("maxtext_compat: %s", w.message)
    if resolution.maxtext is None:
        raise ResolutionError(
            "MaxText is not installed in the serving process",
            argument="maxtext",
            expected="an installed MaxText release",
            found="absent",
            fix="install MaxText in the environment that runs `vllm serve`",
        )
    if resolution.tpu_inference is None:
        raise ResolutionError(
            "tpu-inference is not installed (or not in the compat matrix) in the serving process",
            argument="tpu_inference",
            expected="tpu-inference listed in compat_matrix.yaml (0.32.0 is verified)",
            found="absent",
            fix="install vllm-tpu and tpu-inference of the same release",
        )
    return ServingRuntime(resolution, backend_for(resolution.maxtext), resolution.tpu_inference.model_return_arity)


def current() -> ServingRuntime:
    """The process's runtime (resolved on first use; the vLLM plugin resolves it at start-up).

    If the plugin found at start-up that this process cannot serve MaxText (no backend for the
    installed release), that typed error is raised here, when a MaxText model is actually built.
    """
    with _LOCK:
        if _CURRENT[0] is None:
            if _FAILURE[0] is not None:
                raise _FAILURE[0]
            built = build_runtime()
            _CURRENT[0] = built
            return built
        return _CURRENT[0]


def set_current(rt: ServingRuntime | None) -> None:
    with _LOCK:
        _CURRENT[0] = rt
        _FAILURE[0] = None


def set_failure(exc: BaseException) -> None:
    """Remember why MaxText cannot be served here; `current()` raises it."""
    with _LOCK:
        _CURRENT[0] = None
        _FAILURE[0] = exc
