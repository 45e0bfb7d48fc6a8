"""vLLM general plugin (`vllm.general_plugins: maxtext_compat = maxtext_compat.vllm_plugin:register`).

vLLM calls `register()` in every process it starts (API server, engine core, workers), possibly
more than once per process. Each call, once per process:
1. on a CPU-only jax (JAX_PLATFORMS=cpu), installs the CPU serving shim (`shims.cpu_serving`:
   mesh, HBM limit, TPU-only compiler options, RPA in interpret mode) before tpu-inference builds
   its mesh or traces a kernel; never on TPU;
2. resolves the installed versions against compat_matrix.yaml and picks the serving backend;
3. applies the shim profile the matrix's default-profile chooser picks for that row (if a chooser
   is registered) and the backend's own preparation, and the handling of the installed tpu-inference's
   request defects (`shims.serving_requests`: fixed, or refused with a 400);
4. registers `MaxTextForCausalLM` with tpu-inference's model registry (which also registers it
   with vLLM's) — ours by default, or MaxText's own shipped adapter with
   MAXTEXT_COMPAT_VLLM_MODEL=maxtext (0.2.x only; used to compare the two).
Absent tpu-inference or MaxText: log and skip (vLLM swallows plugin import errors but not errors
raised by `register()`; a missing package must not stop a server of some other model). A MaxText
release no backend serves (0.1.0 before the backport backend exists): the class is registered and
its construction raises that typed error, so only a MaxText model fails, loudly. Other errors of a
present stack (a CPU shim that cannot install, a broken shim profile) are raised at start-up.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from maxtext_compat.errors import InvalidArgumentError
from maxtext_compat.locks import fork_safe_lock
from maxtext_compat.serving.settings import MODEL_CHOICES, MODEL_ENV, model_choice

__all__ = [
    "ARCHITECTURE",
    "MODEL_CHOICES",
    "MODEL_ENV",
    "PluginState",
    "engine_config_of_caller",
    "join_engine",
    "model_choice",
    "new_model_design",
    "register",
    "state",
]

if TYPE_CHECKING:
    from maxtext_compat.serving.runtime import ServingRuntime

ARCHITECTURE = "MaxTextForCausalLM"

# A child of vLLM's logger, so the lines appear in the server log with vLLM's formatting.
log = logging.getLogger("vllm.maxtext_compat")
_LOCK = fork_safe_lock()


@dataclass(frozen=True)
class PluginState:
    registered: bool
    model: str | None = None  # "compat" | "maxtext" | None (skipped)
    reason: str = ""
    cpu_shim: str = ""
    pid: int = 0
    role: str = ""  # "engine" | "worker": where vLLM called register() with its config at hand; "" elsewhere
    fingerprint: str = ""  # this process's plugin fingerprint digest (serving.fingerprint), once registered


_STATE: PluginState | None = None


def state() -> PluginState | None:
    """What `register()` did in this process (None: not called yet)."""
    with _LOCK:
        return _STATE


def new_model_design(environ: Mapping[str, str] | None = None) -> bool:
    """NEW_MODEL_DESIGN as tpu-inference reads it (1/true/0/false, any case); other values are an error
    there too (a raw ValueError deep in its runner), so they are a typed one here."""
    from maxtext_compat.switches import TPU_INFERENCE_FALSE, TPU_INFERENCE_TRUE, parse_flag

    env = os.environ if environ is None else environ
    return parse_flag(
        "NEW_MODEL_DESIGN", env.get("NEW_MODEL_DESIGN"), true=TPU_INFERENCE_TRUE, false=TPU_INFERENCE_FALSE
    )


def register() -> None:
    """Called by vLLM in every process; idempotent per process (forks re-register)."""
    global _STATE
    with _LOCK:
        if _STATE is not None and _STATE.pid == os.getpid():
            return
        config, role = engine_config_of_caller()
        _STATE = _register(config, role)
        log.info(
            "maxtext_compat plugin (pid %d): %s%s",
            _STATE.pid,
            _STATE.reason,
            f"; CPU serving shim: {_STATE.cpu_shim}" if _STATE.cpu_shim else "",
        )


def _register(config: Any = None, role: str = "") -> PluginState:
    pid = os.getpid()
    missing = [name for name in ("tpu_inference", "vllm") if importlib.util.find_spec(name) is None]
    if missing:
        reason = f"skipped: {', '.join(missing)} not installed (maxtext-compat serves through vllm-tpu)"
        log.warning("maxtext_compat plugin %s", reason)
        return PluginState(False, None, reason, pid=pid)
    from maxtext_compat.probes import detect_import_root

    if detect_import_root() is None:
        reason = "skipped: MaxText is not installed, MaxTextForCausalLM is not registered"
        log.warning("maxtext_compat plugin %s", reason)
        return PluginState(False, None, reason, pid=pid)

    from maxtext_compat.serving import settings

    if config is not None:  # before anything reads a setting: vLLM's config reaches every host, the env may not
        applied = settings.apply(getattr(config, "additional_config", None))
        if applied:
            log.info("maxtext_compat plugin: settings from additional_config[%r]: %s", settings.CONFIG_KEY,
                     ", ".join(f"{k}={v}" for k, v in applied.items()))  # fmt: skip
    _carry_settings_to_other_hosts()
    choice = model_choice()
    from maxtext_compat.shims import cpu_serving

    shim = cpu_serving.install()
    off = [p for p in shim.skipped if p not in shim.not_needed]
    shim_text = (
        f"installed ({', '.join(shim.parts)}"
        + (f"; switched off: {', '.join(off)}" if off else "")
        + (f"; not needed here: {', '.join(shim.not_needed)}" if shim.not_needed else "")
        + f") [{len(shim.patches)} patches]"
        if shim.active
        else shim.reason
    )
    if not new_model_design():
        log.info(
            "maxtext_compat plugin: NEW_MODEL_DESIGN is not set; a MaxText model needs tpu-inference's "
            "new-model-design mesh (set NEW_MODEL_DESIGN=1, as `maxtext-compat serve` does)"
        )

    from tpu_inference.models.common.model_loader import register_model

    from maxtext_compat.errors import BackendUnavailableError, ResolutionError
    from maxtext_compat.serving import runtime

    try:
        rt = runtime.build_runtime()
    except (BackendUnavailableError, ResolutionError) as exc:
        # Register anyway so a MaxText model fails with this typed error when it is built, while a
        # server of any other model in this environment is not broken by our plugin.
        runtime.set_failure(exc)
        from maxtext_compat.serving.model import MaxTextForCausalLM

        register_model(ARCHITECTURE, MaxTextForCausalLM)
        reason = f"registered {ARCHITECTURE}, but it cannot be built in this environment: {exc}"
        log.warning("maxtext_compat plugin: %s", reason)
        return PluginState(True, "compat", reason, shim_text, pid)
    runtime.set_current(rt)
    _apply_shim_profile(rt)
    rt.backend.prepare()
    from maxtext_compat.shims import serving_requests

    handled = serving_requests.install(rt.resolution)  # the stack's request defects: for every model served
    shim_text += f"; request defects handled: {', '.join(handled) or 'none'}"

    if choice == "maxtext":
        row = rt.resolution.maxtext
        if row is None or row.vllm is None:
            raise InvalidArgumentError(
                f"{MODEL_ENV}=maxtext needs a MaxText release that ships a vLLM adapter",
                argument=MODEL_ENV,
                expected="MaxText >= 0.2.0",
                found=None if row is None else row.name,
                fix=f"unset {MODEL_ENV} to serve maxtext-compat's model",
            )
        adapter_pkg = row.vllm.adapter.module.rsplit(".", 1)[0]  # ...maxtext_vllm_adapter
        importlib.import_module(adapter_pkg).register()
        reason = f"registered MaxText's own adapter {row.vllm.adapter} as {ARCHITECTURE} ({rt.describe()})"
    else:
        from maxtext_compat.serving.model import MaxTextForCausalLM

        register_model(ARCHITECTURE, MaxTextForCausalLM)
        reason = f"registered maxtext_compat's {ARCHITECTURE} ({rt.describe()})"
    digest = join_engine(config, role, model=choice, resolution=rt.resolution) if config is not None else ""
    return PluginState(True, choice, reason, shim_text, pid, role, digest)


# Where vLLM calls load_general_plugins() with the engine's config as a local of the caller: (module, function).
CONFIG_CALLERS = {
    ("vllm.v1.engine.core", "__init__"): "engine",  # EngineCore.__init__(vllm_config, ...), before the executor
    ("vllm.v1.worker.worker_base", "init_worker"): "worker",  # WorkerWrapperBase.init_worker, in each worker
}
MAX_FRAMES = 12


def engine_config_of_caller() -> tuple[Any, str]:
    """(vllm_config, "engine" | "worker") when vLLM's engine core or worker start-up called us, else (None, "").

    vLLM calls a general plugin with no arguments; those two callers hold the config in a local named
    `vllm_config` when they load the plugins (read, never changed, from their frames)."""
    frame = sys._getframe(1)
    for _ in range(MAX_FRAMES):
        if frame is None:
            break
        role = CONFIG_CALLERS.get((frame.f_globals.get("__name__", ""), frame.f_code.co_name))
        if role is not None:
            config = frame.f_locals.get("vllm_config")
            if config is not None and hasattr(config, "additional_config"):
                return config, role
        frame = frame.f_back  # type: ignore[assignment]
    return None, ""


def join_engine(config: Any, role: str, *, model: str | None = None, resolution: Any = None) -> str:
    """The engine writes its plugin fingerprint into `config.additional_config`; a worker compares its own with it
    (PluginMismatchError, naming the host and each differing field, when they differ). Returns this process's digest."""
    from maxtext_compat.serving import fingerprint

    mine = fingerprint.current(model=model, resolution=resolution)
    additional = getattr(config, "additional_config", None)
    if role == "engine":
        if additional is None:
            additional = config.additional_config = {}
        additional[fingerprint.ENGINE_KEY] = mine.as_dict()
        log.info("maxtext_compat plugin: engine fingerprint %s written to additional_config", mine.digest)
    elif role == "worker":
        engine = None if additional is None else additional.get(fingerprint.ENGINE_KEY)
        if engine is None:
            log.info("maxtext_compat plugin: no engine fingerprint in additional_config (the engine core did not "
                     "load the plugin with its config: a forked engine core); fingerprint %s not compared",
                     mine.digest)  # fmt: skip
        else:
            fingerprint.check_against(engine, mine)
            log.info("maxtext_compat plugin: fingerprint %s agrees with the engine's", mine.digest)
    return mine.digest


def _carry_settings_to_other_hosts() -> None:
    """Add the MAXTEXT_COMPAT_* settings to tpu-inference's `TpuPlatform.additional_env_vars`, the names its (and
    vLLM's) Ray executor copies from the driver to every worker (a set variable only; idempotent)."""
    from maxtext_compat.serving.settings import ENV_NAMES

    try:
        from vllm.platforms import current_platform

        names = type(current_platform).additional_env_vars
    except (ImportError, AttributeError, RuntimeError) as exc:
        log.debug("maxtext_compat plugin: no additional_env_vars to extend (%s)", exc)
        return
    if isinstance(names, list):
        names.extend(n for n in ENV_NAMES if n not in names)


def _apply_shim_profile(rt: ServingRuntime) -> None:
    """The convention shim the matrix's chooser picks for this row (none for native 0.2.x rows)."""
    from maxtext_compat.shims import profiles

    if importlib.util.find_spec("maxtext_compat.shims.maxtext_profiles") is not None:
        # Registers the MaxText profiles (vllm-backport, known-defects) and their default chooser.
        importlib.import_module("maxtext_compat.shims.maxtext_profiles").register()
    if not profiles.has_default_profile_chooser():
        log.debug("maxtext_compat plugin: no default-profile chooser registered; no convention shim applied")
        return
    name = profiles.default_profile(rt.resolution)
    if name is not None:
        profiles.install(name, resolution=rt.resolution)
        log.info("maxtext_compat plugin: installed shim profile %r", name)
