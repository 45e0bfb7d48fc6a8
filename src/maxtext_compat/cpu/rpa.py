"""Run tpu-inference's real ragged paged attention kernel on a CPU backend (Pallas TPU interpret mode).

Why: the kernel is a Pallas TPU kernel with no CPU fallback. Four things stand between it and
a CPU, each measured on jax 0.11.2 / tpu-inference 0.32.0:
1. "Only interpret mode is supported on CPU backend" -> TPU interpret mode, set globally
   (so MaxText's own vLLM path gets it too) and forced around our dispatcher's calls;
2. the stock interpreter cannot follow ref reshape/bitcast views -> `pallas_interpret_views`
   (and jax < 0.9's copies HBM operands instead of passing them -> `pallas_interpret_hbm`);
3. `pltpu.get_tpu_info()` knows no 'cpu' device kind -> a TPU v6e entry in jax's tpu_info registry
   (a jax without that table has nothing to ask);
4. the kernel's block-size lookup needs a TPU (tpu_version -1 raises; the tuned tables call
   get_device_name) -> CPU block sizes, by the matrix row's `block_sizes` method: `function`
   (patch get_default_block_sizes, 0.18+), `env` (RPA_V3_*_BLOCK_SIZES, 0.30+) or `tuned`
   (patch the older API's get_tuned_block_sizes, (pages per block, queries per block), 0.11-0.17).

Rules: acts only on a CPU backend (elsewhere `install()` returns an inactive status and
patches nothing); refuses a jax not in the matrix's `cpu_shim.verified_jax` unless forced;
refuses to install after an interpreted kernel already ran in this process (traced code keeps
the stock callbacks) unless `clear_caches=True`; every patch is recorded in
`maxtext_compat.patching.ledger` and `uninstall()` restores each object by identity.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
from collections.abc import Iterator
from typing import Any

from maxtext_compat import names
from maxtext_compat.cpu import pallas_hbm as hbm
from maxtext_compat.cpu import pallas_interpreter as interpreter
from maxtext_compat.cpu import pallas_views as views
from maxtext_compat.errors import KernelUnavailableError, ShimRefusedError
from maxtext_compat.kernel import interpret as kernel_interpret
from maxtext_compat.kernel.interpret import on_cpu
from maxtext_compat.patching import profiles
from maxtext_compat.patching.settings import Setting, attribute_slot, env_slot, global_slot, item_slot
from maxtext_compat.patching.shim import NOT_ASKED, Shim, ShimStatus
from maxtext_compat.patching.shim import status_of as shim_status
from maxtext_compat.patching.shim import uninstall as shim_uninstall

PROFILE = names.CPU_RPA
KERNEL_MODULE = "tpu_inference.kernels.ragged_paged_attention.v3.kernel"
HD64_MODULE = "tpu_inference.kernels.ragged_paged_attention.v3.kernel_hd64"
INTERPRET_TARGET = "jax.config:pallas_tpu_interpret_mode_context_manager (global)"
ENV_VARS = ("RPA_V3_DECODE_BLOCK_SIZES", "RPA_V3_PREFILL_BLOCK_SIZES", "RPA_V3_MIXED_BLOCK_SIZES")
# The env route fixes one size for every shape: bkv = 64 tokens fits page sizes that divide 64.
ENV_BLOCK_SIZES = {"DECODE": "1,64,1,64", "PREFILL": "8,64,8,64", "MIXED": "8,64,8,64"}
TPU_CHIP = "TPU_V6E"  # VMEM size etc. the kernel asks for; any real chip works for interpret mode

log = logging.getLogger(__name__)
_MISSING = object()


_AFTER_UNINSTALL: list[tuple[Any, Any] | None] = [None]  # the interpreter's run marker when we last uninstalled


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


class CpuKernelShim(Shim):
    """The settings that let the real kernel run interpreted on CPU devices, in one transaction; installed, it
    hands the kernel dispatcher its interpret mode (`kernel.interpret`), and removed, takes it back."""

    name = PROFILE
    description = "the real RPA kernel on a CPU: Pallas TPU interpret mode, CPU block sizes, interpreter views"

    # matrix cpu_shim.verified_jax (checked exactly in applies()) and verified_tpu_inference lie inside
    verified_for = (names.CPU_JAX_RELEASES, names.TPU_INFERENCE_RELEASES)

    def __init__(self, *, force: bool = False, clear_caches: bool = False) -> None:
        self.force, self.clear_caches = force, clear_caches
        self.jax_version = ""
        self.jax_verified = False
        self.tpu_inference_version: str | None = None
        self.block_sizes: str | None = None
        self.block_settings: list[Setting] = []
        self.patches: tuple[str, ...] = ()

    def install(self, *, stack: bool = False, force: bool = False) -> ShimStatus:
        """`CpuKernelShim(force=True).install()` forces the base's range check too."""
        return super().install(stack=stack, force=force or self.force)

    def applies(self) -> str | None:
        import jax

        from maxtext_compat.matrix import load_matrix

        self.jax_version = jax.__version__
        self.jax_verified = load_matrix().cpu_shim.jax_verified(self.jax_version)
        if not on_cpu():
            why = f"default backend is {jax.default_backend()!r}, not cpu: the kernel runs natively, nothing patched"
            log.info("maxtext_compat cpu-rpa shim: %s", why)
            return why
        if not self.jax_verified and not self.force:
            raise ShimRefusedError(
                "the CPU RPA shim patches JAX's private Pallas TPU interpreter and was not verified on this jax",
                argument="jax",
                expected=f"one of {list(load_matrix().cpu_shim.verified_jax)} (matrix cpu_shim.verified_jax)",
                found=self.jax_version,
                fix="install a verified jax, or call install(force=True) and check the RPA tests pass",
            )
        _refuse_if_late(self.clear_caches)
        self.tpu_inference_version, methods = _block_size_methods(self.force)
        self.block_sizes, self.block_settings = _block_size_settings(methods)
        return None

    def specs(self) -> list[Setting]:
        tpu_info = _tpu_info_setting()
        return [
            *views.settings(),
            *hbm.settings(),
            *([tpu_info] if tpu_info else []),
            *self.block_settings,
            _interpret_mode_setting(),
        ]

    def reason(self) -> str:
        return "installed on the cpu backend" + (
            "" if self.jax_verified else f" (forced on unverified jax {self.jax_version})"
        )

    def facts(self) -> dict[str, Any]:
        return {
            "jax_version": self.jax_version,
            "jax_verified": self.jax_verified,
            "tpu_inference_version": self.tpu_inference_version,
            "block_sizes": self.block_sizes,  # "function" | "env" | "tuned" | None
            "patches": self.patches,
        }

    def installed_now(self, patch_set: Any) -> None:
        self.patches = tuple(patch_set.targets)
        kernel_interpret.set_interpret_mode(interpret_mode)  # what the kernel dispatcher enters on CPU devices

    def removed(self) -> None:
        if kernel_interpret.interpret_mode() is interpret_mode:
            kernel_interpret.set_interpret_mode(None)
        _AFTER_UNINSTALL[0] = _run_marker()


def installed() -> bool:
    """Whether the shim is active in this process."""
    return profiles.installed(PROFILE)


def status() -> ShimStatus | None:
    """What the last install did in this process (None when none was asked for, or it was removed since)."""
    found = shim_status(PROFILE)
    return None if found.reason == NOT_ASKED else found


def install(*, force: bool = False, clear_caches: bool = False) -> ShimStatus:
    """Make the real RPA kernel runnable on this CPU backend; idempotent.

    force: install on a jax version the matrix does not list as verified (and on tpu-inference
    releases whose kernel API the shim does not cover). clear_caches: if an interpreted Pallas
    kernel already ran in this process, run `jax.clear_caches()` and reset the interpreter
    state instead of refusing (cached traces would keep the stock interpreter callbacks).
    """
    return CpuKernelShim(force=force, clear_caches=clear_caches).install()


def uninstall() -> list[str]:
    """Undo every patch (by identity) and forget it in the ledger; returns the targets restored."""
    return shim_uninstall(PROFILE)  # no CpuKernelShim needed (it would read the matrix only to be removed)


@contextlib.contextmanager
def enabled(*, force: bool = False, clear_caches: bool = False) -> Iterator[ShimStatus]:
    """`with enabled(): ...` installs for the block and uninstalls after, unless it was already on."""
    was_on = installed()
    st = install(force=force, clear_caches=clear_caches)
    try:
        yield st
    finally:
        if st.active and not was_on:
            uninstall()


def interpret_params() -> Any:
    """Interpreter settings: uninitialised memory is NaN, so anything the kernel fails to write shows."""
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.InterpretParams(uninitialized_memory="nan")


@contextlib.contextmanager
def interpret_mode() -> Iterator[None]:
    """Force TPU interpret mode for every pallas_call traced in the block (the dispatcher's guarantee)."""
    from jax.experimental.pallas import tpu as pltpu

    with pltpu.force_tpu_interpret_mode(interpret_params()):
        yield


# --------------------------------------------------------------------------------------------
# CPU block sizes
# --------------------------------------------------------------------------------------------


def cpu_block_sizes(
    q_dtype: Any,
    kv_dtype: Any,
    actual_num_q_heads: int,
    actual_num_kv_heads: int,
    head_dim: int,
    page_size: int,
    max_num_tokens: int,
    max_num_seqs: int,
    pages_per_seq: int,
    *,
    case: Any = None,
    **_: Any,
) -> dict[str, int]:
    """Stand-in for v3 `get_default_block_sizes` (which knows no CPU): small, valid blocks.

    Interpret mode runs every block step in Python, so fewer, larger KV blocks are faster; the
    kernel requires bkv sizes to be page multiples and bq_sz % bq_csz == 0.
    """
    kv_pages = max(1, min(4, pages_per_seq))
    bkv = kv_pages * page_size
    if getattr(case, "name", "MIXED") == "DECODE":
        return {"bq_sz": 1, "bkv_sz": bkv, "bq_csz": 1, "bkv_csz": bkv}
    bq = max(1, min(16, max_num_tokens))
    return {"bq_sz": bq, "bkv_sz": bkv, "bq_csz": bq, "bkv_csz": bkv}


def cpu_tuned_block_sizes(
    q_dtype: Any,
    kv_dtype: Any,
    actual_num_q_heads: int,
    actual_num_kv_heads: int,
    head_dim: int,
    page_size: int,
    max_num_tokens: int,
    pages_per_seq: int,
    sliding_window: int | None = None,
) -> tuple[int, int]:
    """Stand-in for `get_tuned_block_sizes` (hd64's, and v3's before 0.18): (pages per block, queries per block).

    The stock one calls get_device_name(), which needs a TPU.
    """
    return max(1, min(4, pages_per_seq)), max(1, min(16, max_num_tokens))


# --------------------------------------------------------------------------------------------
# Internals
# --------------------------------------------------------------------------------------------


def _run_marker() -> tuple[Any, Any] | None:
    """What changes each time the interpreter runs a kernel (None: it never ran in this process).

    jax >= 0.8.1 counts DMA ids across kernels ((counter, value)); jax 0.7 and 0.8.0 make a new
    race-detection state for each kernel ((that object, None)).
    """
    ipc = interpreter.pallas_call_module()
    if hasattr(ipc, "dma_id_counter"):
        counter = ipc.dma_id_counter
        return None if counter is None else (counter, getattr(counter, "value", 0))
    races = getattr(ipc, "races", None)
    return None if races is None else (races, None)


def late_reasons() -> list[str]:
    """Evidence that RPA (or any interpreted Pallas TPU kernel) was traced/ran before the shim."""
    reasons = []
    ipc = interpreter.pallas_call_module()
    if getattr(ipc, "_shared_memory", None) is not None:
        reasons.append("an interpreted Pallas TPU kernel failed and left its simulated memory behind")
    marker = _run_marker()
    if marker is not None:
        last = _AFTER_UNINSTALL[0]
        if last is None or marker[0] is not last[0] or marker[1] != last[1]:
            reasons.append("an interpreted Pallas TPU kernel already ran in this process without the shim")
    for name in (KERNEL_MODULE, HD64_MODULE):
        mod = sys.modules.get(name)
        fn = getattr(mod, "ragged_paged_attention" if name == KERNEL_MODULE else "ragged_paged_attention_hd64", None)
        size = getattr(fn, "_cache_size", None)
        if callable(size) and size() > 0 and _AFTER_UNINSTALL[0] is None:
            reasons.append(f"{name} already holds compiled kernels")
    return reasons


def _refuse_if_late(clear_caches: bool) -> None:
    reasons = late_reasons()
    if not reasons:
        return
    if not clear_caches:
        raise ShimRefusedError(
            "the CPU RPA shim is applied after the kernel was traced: cached traces keep the stock interpreter "
            "and would fail or run stale code",
            argument="install",
            expected="install() before the first trace of a Pallas TPU kernel",
            found="; ".join(reasons),
            fix="call maxtext_compat.cpu.rpa.install() first thing (e.g. in conftest.py), "
            "or install(clear_caches=True) to run jax.clear_caches() and reset the interpreter",
        )
    import jax
    from jax.experimental.pallas import tpu as pltpu

    log.warning("maxtext_compat cpu-rpa shim applied late (%s): clearing jax caches", "; ".join(reasons))
    jax.clear_caches()
    pltpu.reset_tpu_interpret_mode_state()


def _block_size_methods(force: bool) -> tuple[str | None, tuple[str, ...]]:
    """(installed tpu-inference version, the matrix row's block_sizes methods)."""
    from maxtext_compat.matrix import load_matrix
    from maxtext_compat.versions import installed_versions

    info = installed_versions().get("tpu_inference")
    if info is None:
        return None, ()  # kernel-free use (interpret mode for other Pallas kernels): nothing to size
    row = load_matrix().tpu_inference_row(info.version)
    if row is None:
        if force:
            return info.version, ("function", "env")
        raise KernelUnavailableError(
            "the installed tpu-inference is not in the compat matrix: the shim does not know how to size its kernel",
            argument="tpu_inference",
            expected="a release listed under tpu_inference in compat_matrix.yaml",
            found=info.version,
            fix="install a listed release, or install(force=True) to try the newest method",
        )
    if not row.block_sizes and not force:
        raise KernelUnavailableError(
            "the compat matrix gives no way to hand this tpu-inference's RPA kernel CPU block sizes",
            argument="tpu_inference",
            expected="a release whose matrix row lists block_sizes (function, env or tuned)",
            found=info.version,
            fix="use a tpu-inference release listed in cpu_shim.verified_tpu_inference for CPU runs",
        )
    return info.version, row.block_sizes


TPU_INFO_MODULES = ("jax._src.tpu_info", "jax._src.pallas.mosaic.tpu_info")


def tpu_info_module() -> Any | None:
    """jax's TPU hardware table (it moved in jax 0.10); None for a jax that has none (nothing asks for it)."""
    for name in TPU_INFO_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def _tpu_info_setting() -> Setting | None:
    """A TPU v6e entry for the 'cpu' device kind in jax's TPU hardware table (an existing entry is kept)."""
    tpu_info = tpu_info_module()
    if tpu_info is None:
        return None
    chip = getattr(tpu_info.ChipVersion, TPU_CHIP)

    def cpu_tpu_info() -> Any:
        return tpu_info.get_tpu_info_for_chip(chip, 1)

    clear = getattr(tpu_info.get_tpu_info, "cache_clear", None)
    return Setting(
        item_slot(tpu_info.registry, "cpu", _registry_target(tpu_info)),
        cpu_tpu_info,
        f"{__name__}._tpu_info_setting",
        keep_existing=True,
        after_restore=clear if callable(clear) else None,
    )


def tpu_info_target() -> str | None:
    """The ledger name of the 'cpu' entry this shim adds to jax's TPU hardware table (None: no table)."""
    tpu_info = tpu_info_module()
    return None if tpu_info is None else _registry_target(tpu_info)


def _registry_target(tpu_info: Any) -> str:
    return f"{tpu_info.__name__}:registry['cpu']"


def _kernel_attribute(
    module_name: str, attr: str, replacement: Any, *, optional_module: bool = False
) -> Setting | None:
    """`replacement` for `module_name.attr` (None when the module has no such attribute, or, if
    `optional_module`, no such module: tpu-inference 0.11 ships no hd64 kernel)."""
    try:
        mod = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if optional_module and exc.name == module_name:
            return None
        raise _unimportable(module_name, exc) from exc
    except ImportError as exc:
        raise _unimportable(module_name, exc) from exc
    if getattr(mod, attr, _MISSING) is _MISSING:
        return None
    slot = attribute_slot(mod, attr, f"{module_name}:{attr}")
    return Setting(slot, replacement, f"{__name__}.{replacement.__name__}")


def _unimportable(module_name: str, exc: ImportError) -> KernelUnavailableError:
    return KernelUnavailableError(
        f"cannot import tpu-inference's RPA kernel module: {exc}",
        argument="tpu_inference",
        expected=f"an importable {module_name}",
        fix="install vllm-tpu with its tpu-inference (importing tpu_inference imports vllm and torch)",
    )


# The v3 kernel's block-size function each patching method replaces, and its CPU stand-in.
V3_BLOCK_SIZE_FUNCTIONS = {
    "function": ("get_default_block_sizes", cpu_block_sizes),
    "tuned": ("get_tuned_block_sizes", cpu_tuned_block_sizes),
}


def _block_size_settings(methods: tuple[str, ...]) -> tuple[str | None, list[Setting]]:
    """(the method used, the settings that give the kernel CPU block sizes)."""
    if not {*V3_BLOCK_SIZE_FUNCTIONS, "env"} & set(methods):
        return None, []  # kernel-free use (interpret mode for other Pallas kernels): nothing to size
    hd64 = _kernel_attribute(HD64_MODULE, "get_tuned_block_sizes", cpu_tuned_block_sizes, optional_module=True)
    for method, (name, stand_in) in V3_BLOCK_SIZE_FUNCTIONS.items():
        if method not in methods:
            continue
        v3 = _kernel_attribute(KERNEL_MODULE, name, stand_in)
        if v3 is None:
            raise KernelUnavailableError(
                f"the matrix says this tpu-inference sizes RPA blocks with {name}, "
                "but the installed kernel module has none",
                argument="tpu_inference",
                expected=f"{KERNEL_MODULE}.{name}",
                fix="fix the row's block_sizes in compat_matrix.yaml",
            )
        return method, [s for s in (v3, hd64) if s is not None]
    if "env" in methods:
        # The user's own sizes win (keep_existing); tpu-inference forwards the env sizes to the v3 kernel
        # only, so hd64 still needs its function.
        env = [
            Setting(env_slot(var), ENV_BLOCK_SIZES[case], f"{__name__}.ENV_BLOCK_SIZES", keep_existing=True)
            for var, case in zip(ENV_VARS, ("DECODE", "PREFILL", "MIXED"), strict=True)
        ]
        return "env", [*env, *([hd64] if hd64 is not None else [])]
    return None, []


def _interpret_mode_setting() -> Setting:
    """Pallas TPU interpret mode as jax's global default (so MaxText's own vLLM path runs interpreted too)."""
    from jax._src import config

    cfg = config.pallas_tpu_interpret_mode_context_manager
    slot = global_slot(cfg.get_global, cfg.set_global, INTERPRET_TARGET)
    return Setting(slot, interpret_params(), f"{__name__}.interpret_params")
