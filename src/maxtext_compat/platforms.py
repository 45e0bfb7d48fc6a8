"""Which platform jax is configured for, and the CPU stand-in's settings, read without importing jax.

Why at the bottom: the settings registry, `doctor` and `serve` parse these before anything is installed, and the
code that only runs on a CPU (`maxtext_compat.cpu`) is never imported by production code to read a value.
"""

from __future__ import annotations

import os
import sys

from maxtext_compat.errors import InvalidArgumentError

PARTS: tuple[str, ...] = ("mesh", "hbm", "compiler_options", "rpa", "host_copy")
DISABLE_ENV = "MAXTEXT_COMPAT_DISABLE_CPU_SHIM"
HBM_ENV = "MAXTEXT_COMPAT_CPU_HBM_GB"
MAX_CPU_HBM_GB = 1 << 20  # 1 PiB: anything above is a typo
DEFAULT_CPU_HBM_GB = 2.0  # what the KV-cache sizing sees; pass --num-gpu-blocks-override for tiny caches
# Which RPA kernel a CPU server runs: `xla` (maxtext_compat.kernel.rpa_xla) or `pallas` (the real kernel, interpreted).
KERNEL_ENV = "MAXTEXT_COMPAT_RPA_KERNEL"
KERNELS: tuple[str, ...] = ("xla", "pallas")


def configured_platforms() -> tuple[str, ...]:
    """The platforms jax is configured for, read without initialising a backend."""
    jax = sys.modules.get("jax")
    value = None
    if jax is not None:
        try:
            value = jax.config.jax_platforms
        except AttributeError:
            value = None
    if not value:
        value = os.environ.get("JAX_PLATFORMS", "") or os.environ.get("JAX_PLATFORM_NAME", "")
    return tuple(p.strip().lower() for p in str(value).split(",") if p.strip())


def cpu_only() -> bool:
    """True when jax can only use CPU devices (JAX_PLATFORMS=cpu); never initialises a backend."""
    return configured_platforms() == ("cpu",)


def disabled_parts(value: str | None = None) -> tuple[str, ...]:
    """Parts switched off by MAXTEXT_COMPAT_DISABLE_CPU_SHIM ('1'/'all' = every part)."""
    from maxtext_compat.switches import FALSE, TRUE, parse_flag

    raw = os.environ.get(DISABLE_ENV, "") if value is None else value
    if raw.lower() in ("all", *TRUE, *FALSE, ""):
        return PARTS if raw.lower() == "all" or parse_flag(DISABLE_ENV, raw) else ()
    names = tuple(p.strip().lower() for p in raw.split(",") if p.strip())
    unknown = [n for n in names if n not in PARTS]
    if unknown or not names:  # " 1" or "y" is no part name: refused, not read as "nothing disabled"
        raise InvalidArgumentError(
            f"{DISABLE_ENV} names unknown parts",
            argument=DISABLE_ENV,
            expected=f"1/all (every part), 0 (none), or a comma list of {list(PARTS)}",
            found=repr(raw),
            fix=f"e.g. {DISABLE_ENV}=rpa or {DISABLE_ENV}=mesh,hbm",
        )
    return names


def cpu_hbm_bytes(value: str | None = None) -> int:
    """The HBM limit a CPU device reports (MAXTEXT_COMPAT_CPU_HBM_GB, or `value`), in bytes."""
    from maxtext_compat.switches import env_positive_number

    gb = env_positive_number(
        HBM_ENV, example="2", default=f"{DEFAULT_CPU_HBM_GB:g} GiB", maximum=MAX_CPU_HBM_GB, value=value
    )
    return int((DEFAULT_CPU_HBM_GB if gb is None else gb) * (1 << 30))


def kernel_choice(value: str | None = None) -> str | None:
    """MAXTEXT_COMPAT_RPA_KERNEL as `xla` or `pallas`; None when unset (then `xla` where it applies)."""
    raw = os.environ.get(KERNEL_ENV, "") if value is None else value
    if raw == "":
        return None
    if raw.lower() not in KERNELS:
        raise InvalidArgumentError(
            f"{KERNEL_ENV} names no RPA kernel",
            argument=KERNEL_ENV,
            expected=f"one of {list(KERNELS)} (or unset: xla where a checked tpu-inference binds the v3 kernels)",
            found=repr(raw),
            fix=f"set {KERNEL_ENV}=xla (fast, the kernel's semantics in XLA) or =pallas (the real kernel, interpreted)",
        )
    return raw.lower()
