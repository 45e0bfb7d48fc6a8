"""Which RPA kernel a CPU server runs: the XLA reproduction of the v3 kernels, or the real one interpreted.

Why apart from the serving shim: the choice is read by `doctor` and `serve` before anything is
installed, and it decides from tpu-inference's own module globals which kernel this process binds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from maxtext_compat.errors import ShimRefusedError
from maxtext_compat.patching import Original
from maxtext_compat.platforms import KERNEL_ENV

log = logging.getLogger(__name__)
_MISSING = object()
# tpu-inference releases whose v3 / head_dim-64 kernels rpa_xla was held to (tests/compat/test_rpa_xla.py).
XLA_VERIFIED_TPU_INFERENCE: tuple[str, ...] = ("0.32.0",)

# sharded_ragged_paged_attention reads these module globals at each call; only they are replaced, so a
# direct call of the kernel module's function (the kernel tests) still runs the real kernel.
ATTENTION_INTERFACE = "tpu_inference.layers.common.attention_interface"
XLA_KERNELS = {  # attention_interface global -> (the v3 kernel module it must be bound from, rpa_xla function)
    "ragged_paged_attention": ("tpu_inference.kernels.ragged_paged_attention.v3.kernel", "ragged_paged_attention"),
    "ragged_paged_attention_hd64": (
        "tpu_inference.kernels.ragged_paged_attention.v3.kernel_hd64", "ragged_paged_attention_hd64"),
}  # fmt: skip


def _bound_kernels() -> dict[str, bool]:
    """For each kernel global of attention_interface: is it the v3 kernel function rpa_xla reproduces?"""
    import importlib

    iface = importlib.import_module(ATTENTION_INTERFACE)
    out = {}
    for name, (module, attr) in XLA_KERNELS.items():
        out[name] = getattr(iface, name, None) is getattr(importlib.import_module(module), attr, _MISSING)
    return out


def _tpu_inference_version() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version("tpu-inference")
    except importlib.metadata.PackageNotFoundError:
        return None


def resolve_kernel(choice: str | None) -> str:
    """`xla` or `pallas` for this process: unset means xla when tpu-inference is a release whose kernels
    rpa_xla was checked against and binds the v3 kernels (not the experimental batched one); an explicit
    xla where another kernel is bound is refused, on an unchecked release it runs with a warning."""
    if choice == "pallas":
        return "pallas"
    version = _tpu_inference_version()
    if version not in XLA_VERIFIED_TPU_INFERENCE:
        if choice is None:
            log.info("maxtext_compat: rpa_xla is checked against tpu-inference %s, not %s; the real kernel runs",
                     "/".join(XLA_VERIFIED_TPU_INFERENCE), version)  # fmt: skip
            return "pallas"
        log.warning("maxtext_compat: %s=xla on tpu-inference %s: rpa_xla reproduces the kernels of %s only",
                    KERNEL_ENV, version, "/".join(XLA_VERIFIED_TPU_INFERENCE))  # fmt: skip
    unbound = [n for n, ok in _bound_kernels().items() if not ok]
    if not unbound:
        return "xla"
    if choice is None:
        log.info("maxtext_compat: %s binds %s to another kernel; the real kernel runs", ATTENTION_INTERFACE, unbound)
        return "pallas"
    raise ShimRefusedError(
        "the XLA kernel reproduces tpu-inference's v3 RPA kernels, and this process binds another one",
        argument=KERNEL_ENV,
        expected=f"{ATTENTION_INTERFACE}.{unbound[0]} bound to the v3 kernel",
        found="another kernel (USE_BATCHED_RPA_KERNEL set?)",
        fix=f"set {KERNEL_ENV}=pallas to run the bound kernel in interpret mode",
    )


def xla_kernel_factory(name: str) -> Callable[[Original], Callable[..., Any]]:
    def factory(original: Original) -> Callable[..., Any]:
        from maxtext_compat.kernel import rpa_xla

        replacement = getattr(rpa_xla, XLA_KERNELS[name][1])

        def xla_kernel(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return replacement(*args, **kwargs)

        return xla_kernel

    return factory
