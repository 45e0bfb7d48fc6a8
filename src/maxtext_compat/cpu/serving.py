"""Let `vllm serve` (vllm-tpu + tpu-inference) run on a CPU backend: the runtime gaps plus the RPA shim.

Why: tpu-inference's runner assumes TPU devices. Measured on tpu-inference 0.32.0 / jax 0.11.2, a stock
`vllm serve` on JAX_PLATFORMS=cpu fails at:
  F1 `make_optimized_mesh` sorts devices by `.coords` (CPU devices have none) -> plain mesh;
  F2 `get_device_hbm_limit` -> `get_device_name` raises 'Expected TPU devices' -> a fixed CPU limit;
  F3 the RPA Pallas kernel ('Only interpret mode is supported on CPU backend') -> `cpu.rpa`,
     and by default the kernel's exact semantics as one XLA program (`rpa_xla`, ~500x faster than
     interpret mode) in its place: `MAXTEXT_COMPAT_RPA_KERNEL=pallas` runs the real kernel instead;
  F4 `get_step_fn_compiler_options` / `get_sampling_compiler_options` hand XLA:CPU TPU-only options
     ('No such compile option') -> no options on CPU (tpu-inference 0.19 has no such module and passes
     no options: the part is logged as not needed);
  F5 (silent) PJRT CPU puts a numpy array on the device without copying it, and the runner refills
     its numpy input buffers for the next step while a step may still read them: token positions
     arrived one step ahead (RoPE off by one, text drifting from the reference, found serving
     SmolLM2) -> `general_device_put` gets a private copy of every numpy input;
  F6 tpu-inference < 0.32 reads `device.memory_stats()["bytes_in_use"]`, which is None on CPU
     (0.32 falls back to live arrays itself) -> live-array bytes against the F2 limit.

Rules: acts only when jax is configured for the CPU platform alone (JAX_PLATFORMS=cpu); that is
decided from the configuration, without initialising a backend, so an API-server process on a TPU
host never grabs the TPU. Each wrapper checks again at call time and passes through on
non-CPU devices. Patches go through the patching core (atomic, reversible, recorded in
`patching.ledger`, aliases such as `from tpu_inference.utils import make_optimized_mesh` swept).
`MAXTEXT_COMPAT_DISABLE_CPU_SHIM=1` (or a comma list of parts: mesh,hbm,compiler_options,rpa)
leaves parts out, which is how the tests prove the shim is what makes serving work.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
from collections.abc import Callable, Iterable
from typing import Any

from maxtext_compat import names
from maxtext_compat.cpu.kernel_choice import ATTENTION_INTERFACE, XLA_KERNELS, resolve_kernel, xla_kernel_factory
from maxtext_compat.errors import InvalidArgumentError, ServingConfigError
from maxtext_compat.kernel import mesh_limits
from maxtext_compat.patching import Original, PatchSpec, profiles
from maxtext_compat.patching.settings import Setting, attribute_slot
from maxtext_compat.patching.shim import NOT_ASKED, Shim, ShimStatus
from maxtext_compat.patching.shim import status_of as shim_status
from maxtext_compat.platforms import (
    DISABLE_ENV,
    KERNEL_ENV,
    PARTS,
    configured_platforms,
    cpu_hbm_bytes,
    cpu_only,
    disabled_parts,
    kernel_choice,
)

PROFILE = names.CPU_SERVING
UTILS = "tpu_inference.utils"
DEVICE_PUT = "tpu_inference.layers.common.utils:general_device_put"
COMPILER_OPTIONS = "tpu_inference.models.common.compiler_options"
TOPOLOGY = "tpu_inference.distributed.utils:get_device_topology_order_id"  # the Ray path's worker start-up
# Decorated at import time with jax.jit(compiler_options=get_sampling_compiler_options()): if it
# was imported before us, its jit object already holds the TPU options and must be rebuilt.
SAMPLING = "tpu_inference.layers.jax.sample.sampling"

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# When to act
# --------------------------------------------------------------------------------------------


def _on_cpu_devices(devices: Iterable[Any]) -> bool:
    devs = list(devices)
    return bool(devs) and all(getattr(d, "platform", "") == "cpu" for d in devs)


# --------------------------------------------------------------------------------------------
# The wrappers (F1, F2, F4, F6)
# --------------------------------------------------------------------------------------------


def _mesh_factory(original: Original, *, kernel: str | None = None) -> Callable[..., Any]:
    """A plain mesh of CPU devices; with the real kernel interpreted (`kernel="pallas"`), refused where
    `mesh_limits` says the interpreter cannot run its 'model' axis (the server calls the kernel past
    our dispatcher, so its mesh is where the check can stand)."""

    def make_optimized_mesh(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        import jax
        import numpy as np
        from jax.sharding import Mesh

        axis_shapes = kwargs.get("axis_shapes", args[0] if args else None)
        axis_names = kwargs.get("axis_names", args[1] if len(args) > 1 else None)
        devices = kwargs.get("devices")
        devs = list(devices) if devices is not None else jax.devices()
        if not _on_cpu_devices(devs) or axis_shapes is None or axis_names is None:
            return wrapped(*args, **kwargs)
        need = math.prod(int(s) for s in axis_shapes)
        if len(devs) < need:
            raise ServingConfigError(
                "the serving mesh needs more CPU devices than jax has",
                argument="tensor_parallel_size",
                expected=f"at least {need} devices for mesh {dict(zip(axis_names, axis_shapes, strict=False))}",
                found=f"{len(devs)} CPU device(s)",
                fix=f"set XLA_FLAGS=--xla_force_host_platform_device_count={need} before starting vllm serve",
            )
        if kernel == "pallas":
            shape = dict(zip(axis_names, (int(s) for s in axis_shapes), strict=False))
            mesh_limits.check_mesh(shape.get("model", 1), interpret=True, jax_version=jax.__version__)
        # CPU devices have no coords to sort by; their ids are already in order.
        return Mesh(np.array(devs[:need]).reshape(tuple(int(s) for s in axis_shapes)), tuple(axis_names))

    return make_optimized_mesh


def _hbm_factory(original: Original) -> Callable[..., Any]:
    def get_device_hbm_limit(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        import jax

        if _on_cpu_devices(jax.devices()):
            return cpu_hbm_bytes()
        return wrapped(*args, **kwargs)

    return get_device_hbm_limit


def live_bytes_per_device(devices: list[Any]) -> dict[Any, int]:
    """Bytes of live jax buffers on each of `devices` (each buffer counted once)."""
    import jax

    used = dict.fromkeys(devices, 0)
    seen: set[int] = set()
    for array in jax.live_arrays():
        for shard in array.addressable_shards:
            data = shard.data
            if id(data) not in seen and data.device in used:
                seen.add(id(data))
                used[data.device] += data.nbytes
    return used


def _hbm_usage_factory(original: Original) -> Callable[..., Any]:
    def hbm_usage_bytes(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        devices = list(args[0] if args else kwargs.get("devices", ()))
        if not devices or not _on_cpu_devices(devices) or all(d.memory_stats() is not None for d in devices):
            return wrapped(*args, **kwargs)
        used = live_bytes_per_device(devices)
        return [(used[d], cpu_hbm_bytes()) for d in devices]

    return hbm_usage_bytes


def _no_options_factory(original: Original) -> Callable[..., Any]:
    def compiler_options(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        import jax

        if _on_cpu_devices(jax.devices()):
            return {}
        return wrapped(*args, **kwargs)

    return compiler_options


def _host_copy_factory(original: Original) -> Callable[..., Any]:
    def general_device_put(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        import jax
        import numpy as np

        def private(tree: Any) -> Any:
            return jax.tree.map(lambda t: np.array(t, copy=True) if isinstance(t, np.ndarray) else t, tree)

        if args:
            args = (private(args[0]), *args[1:])
        elif "tensor" in kwargs:
            kwargs = {**kwargs, "tensor": private(kwargs["tensor"])}
        return wrapped(*args, **kwargs)

    return general_device_put


def _topology_factory(original: Original) -> Callable[..., Any]:
    def get_device_topology_order_id(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        named = dict(zip(("local_devices", "global_devices"), args, strict=False)) | kwargs
        local, everyone = list(named["local_devices"]), list(named["global_devices"])
        if not (_on_cpu_devices(local) and _on_cpu_devices(everyone)):
            return wrapped(*args, **kwargs)
        # CPU devices have no coords to find each process's corner by: processes are ordered by their index.
        return sorted({d.process_index for d in everyone}).index(local[0].process_index)

    return get_device_topology_order_id


def _has(target: str) -> bool:
    import importlib

    module, _, name = target.partition(":")
    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False


def _not_needed() -> dict[str, str]:
    """Parts the installed tpu-inference has no step for, with the reason (measured on 0.19.0: no compiler
    options module, and its jits pass no TPU compiler options)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(COMPILER_OPTIONS)
    except ModuleNotFoundError:
        spec = None
    if spec is None:
        return {"compiler_options": f"this tpu-inference has no {COMPILER_OPTIONS} (no TPU compiler options to drop)"}
    return {}


def _specs(parts: tuple[str, ...], kernel: str | None = None) -> list[PatchSpec | Setting]:
    specs: list[PatchSpec | Setting] = []
    origin = "maxtext_compat.cpu.serving"
    if "host_copy" in parts:
        specs.append(PatchSpec(DEVICE_PUT, _host_copy_factory, origin=f"{origin} (F5 private copies of host inputs)"))
    if "rpa" in parts and kernel == "xla":
        for name in XLA_KERNELS:
            specs.append(PatchSpec(f"{ATTENTION_INTERFACE}:{name}", xla_kernel_factory(name), aliases=(),
                                   origin="maxtext_compat.kernel.rpa_xla (F3 the kernel's semantics in XLA)"),
                                   )  # fmt: skip
    if "mesh" in parts:
        mesh = functools.partial(_mesh_factory, kernel=kernel)  # None when the rpa part is left out
        specs.append(PatchSpec(f"{UTILS}:make_optimized_mesh", mesh, origin=f"{origin} (F1 CPU mesh)"))
        if _has(TOPOLOGY):  # multi-host workers (TPU_MULTIHOST_BACKEND=ray) sort devices by coords too
            specs.append(PatchSpec(TOPOLOGY, _topology_factory, origin=f"{origin} (F1 CPU device topology order)"))
    if "hbm" in parts:
        specs.append(PatchSpec(f"{UTILS}:get_device_hbm_limit", _hbm_factory, origin=f"{origin} (F2 CPU HBM limit)"))
        specs.append(PatchSpec(f"{UTILS}:hbm_usage_bytes", _hbm_usage_factory,
                               origin=f"{origin} (F6 CPU devices report no memory stats)"))  # fmt: skip
    if "compiler_options" in parts:
        for name in ("get_step_fn_compiler_options", "get_sampling_compiler_options"):
            specs.append(
                PatchSpec(f"{COMPILER_OPTIONS}:{name}", _no_options_factory, origin=f"{origin} (F4 no TPU options)")
            )
        specs.extend(_sampling_settings())
    return specs


DESCRIPTION = "vllm serve on a CPU backend (F1, F2, F4, F5, F6, the XLA kernel for F3)"


# --------------------------------------------------------------------------------------------
# sampling.sample: rebuilt without TPU compiler options when it was imported before us (F4)
# --------------------------------------------------------------------------------------------


def _sampling_settings() -> list[Setting]:
    """`sampling.sample` is `jax.jit(..., compiler_options=<TPU options>)` built at import time: re-jitted
    without them, in its module and wherever it was imported by name."""
    mod = sys.modules.get(SAMPLING)
    if mod is None:
        return []  # imported later, it reads the patched get_sampling_compiler_options
    import jax

    original = mod.sample
    inner = getattr(original, "__wrapped__", None)
    if inner is None:
        raise ServingConfigError(
            f"{SAMPLING}.sample is not a jax.jit function; the CPU shim cannot drop its TPU compiler options",
            argument=SAMPLING,
            expected="jax.jit(sample) with compiler_options",
            found=type(original).__name__,
            fix="report the tpu-inference version; load the plugin before the sampler is imported",
        )
    import inspect

    # The static arguments of tpu-inference 0.32.0's decorator, where the function still has them.
    params = inspect.signature(inner).parameters
    rebuilt = jax.jit(inner, static_argnames=[n for n in ("mesh", "allow_distributed_sampling") if n in params])
    rebound = [m for m in list(sys.modules.values()) if getattr(m, "sample", None) is original and m is not mod]
    origin = f"{__name__}._sampling_settings (F4 re-jit without options)"
    return [Setting(attribute_slot(m, "sample", f"{m.__name__}:sample"), rebuilt, origin) for m in [mod, *rebound]]


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


class CpuServingShim(Shim):
    """The parts a CPU `vllm serve` needs (mesh, HBM, compiler options, host copies, the kernel), in one patch set;
    with the `rpa` part it also installs the CPU kernel stand-in (`cpu.rpa`) and removes it with itself."""

    name = PROFILE
    description = DESCRIPTION
    verified_for = (names.TPU_INFERENCE_RELEASES,)  # matrix cpu_shim.verified_tpu_inference lies inside

    def __init__(self, *, parts: Iterable[str] | None = None, force_rpa: bool = False) -> None:
        self.parts, self.force_rpa = parts, force_rpa
        self.wanted: tuple[str, ...] = ()
        self.skipped: tuple[str, ...] = ()
        self.absent: dict[str, str] = {}
        self.kernel: str | None = None
        self.rpa_targets: tuple[str, ...] = ()
        self.targets: tuple[str, ...] = ()
        self.rpa_ours = False  # whether this shim installed cpu.rpa (and so removes it)

    def applies(self) -> str | None:
        if not cpu_only():
            names = ",".join(configured_platforms()) or "unset (jax picks TPU/GPU when present)"
            why = f"JAX_PLATFORMS is {names}, not cpu: nothing patched"
            log.info("maxtext_compat cpu-serving shim: %s", why)
            return why
        off = disabled_parts()
        bad = [p for p in (self.parts or ()) if p not in PARTS]
        if bad:
            raise InvalidArgumentError(
                "unknown CPU serving shim parts",
                argument="parts",
                expected=list(PARTS),
                found=bad,
                fix=f"pass parts from {list(PARTS)}, or parts=None for all of them",
            )
        wanted = tuple(p for p in (PARTS if self.parts is None else tuple(self.parts)) if p not in off)
        self.absent = _not_needed()
        for part, why in self.absent.items():
            if part in wanted:
                log.info("maxtext_compat cpu-serving shim: %s not needed: %s", part, why)
        self.wanted = tuple(p for p in wanted if p not in self.absent)
        self.skipped = tuple(p for p in PARTS if p not in self.wanted)
        self.kernel = resolve_kernel(kernel_choice()) if "rpa" in self.wanted else None
        if switched_off := tuple(p for p in self.skipped if p in off):
            log.warning("maxtext_compat cpu-serving shim: parts switched off by %s: %s", DISABLE_ENV, switched_off)
        return None

    def specs(self) -> list[PatchSpec | Setting]:
        return _specs(self.wanted, self.kernel)

    def reason(self) -> str:
        return "installed (JAX_PLATFORMS=cpu)"

    def facts(self) -> dict[str, Any]:
        return {
            "parts": self.wanted,
            "skipped": self.skipped,
            "patches": (*self.targets, *self.rpa_targets),  # its own targets and those of cpu.rpa it installed
            "kernel": self.kernel,  # "xla" | "pallas" when the rpa part is on
            "not_needed": tuple(self.absent),  # parts the installed tpu-inference has no step for (in skipped too)
        }

    def installed_now(self, patch_set: Any) -> None:
        self.targets = tuple(patch_set.targets)
        if "rpa" in self.wanted:
            from maxtext_compat.cpu import rpa as cpu_rpa

            was_on = cpu_rpa.installed()
            rpa_status = cpu_rpa.install(force=self.force_rpa)
            self.rpa_ours = rpa_status.active and not was_on
            self.rpa_targets = rpa_status.patches
        log.info("maxtext_compat cpu-serving shim installed: %s", ", ".join([*patch_set.targets, *self.rpa_targets]))
        if self.kernel is not None:
            other = "pallas (the real kernel, interpreted)" if self.kernel == "xla" else "xla (its semantics in XLA)"
            log.warning("maxtext_compat: RPA kernel on CPU: %s; %s=%s for %s", self.kernel, KERNEL_ENV,
                        "pallas" if self.kernel == "xla" else "xla", other)  # fmt: skip

    def removed(self) -> None:
        if self.rpa_ours:
            from maxtext_compat.cpu import rpa as cpu_rpa

            self.rpa_ours = False
            cpu_rpa.uninstall()


def installed() -> bool:
    return profiles.installed(PROFILE)


def status() -> ShimStatus | None:
    """What the last install did in this process (None when none was asked for, or it was removed since)."""
    found = shim_status(PROFILE)
    return None if found.reason == NOT_ASKED else found


def install(*, parts: Iterable[str] | None = None, force_rpa: bool = False) -> ShimStatus:
    """Apply the CPU serving shim in this process (idempotent); a no-op unless JAX_PLATFORMS=cpu.

    parts: which parts to apply (default: all but those named in MAXTEXT_COMPAT_DISABLE_CPU_SHIM).
    force_rpa: passed to `cpu_rpa.install(force=...)` (unverified jax).
    """
    return CpuServingShim(parts=parts, force_rpa=force_rpa).install()


def uninstall() -> list[str]:
    """Restore everything this shim patched (and cpu.rpa, if this shim installed it)."""
    found = shim_status(PROFILE)
    if not found.active:
        return []
    restored = list(found.facts.get("patches", found.targets))
    profiles.uninstall(PROFILE)
    return restored
