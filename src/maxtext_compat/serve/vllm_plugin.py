"""vLLM general plugin (`vllm.general_plugins: maxtext_compat = maxtext_compat.serve.vllm_plugin:register`).

vLLM calls `register()` in every process it starts (API server, engine core, workers), possibly
more than once per process. Each call, once per process:
1. on a CPU-only jax (JAX_PLATFORMS=cpu), installs the CPU serving shim (`cpu.serving`:
   mesh, HBM limit, TPU-only compiler options, RPA in interpret mode) before tpu-inference builds
   its mesh or traces a kernel; never on TPU;
2. resolves the installed versions against compat_matrix.yaml and picks the serving backend;
3. applies the shim profile the matrix's default-profile chooser picks for that row (if a chooser
   is registered) and the backend's own preparation, and the handling of the installed tpu-inference's
   request defects (`serving_fixes.request_defects`: fixed, or refused with a 400);
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

from maxtext_compat import names
from maxtext_compat.errors import InvalidArgumentError
from maxtext_compat.locks import fork_safe_lock
from maxtext_compat.patching.shim import Shim
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
    settings: Mapping[str, object] | None = None  # the effective settings the plugin was set up with


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
            "maxtext_compat plugin (pid %d%s): %s%s%s",
            _STATE.pid,
            f", {_STATE.role}" if _STATE.role else "",
            _STATE.reason,
            f"; CPU serving shim: {_STATE.cpu_shim}" if _STATE.cpu_shim else "",
            f"; fingerprint {_STATE.fingerprint} ({_given(_STATE.settings)})" if _STATE.fingerprint else "",
        )


def _given(effective: Mapping[str, object] | None) -> str:
    """The settings that are set (not left to their default), as the fingerprint holds them."""
    given = {k: v for k, v in (effective or {}).items() if v is not None}
    return "settings: " + (", ".join(f"{k}={v!r}" for k, v in given.items()) or "all defaults")


def _register(config: Any = None, role: str = "") -> PluginState:
    pid = os.getpid()
    missing = [name for name in ("tpu_inference", "vllm") if importlib.util.find_spec(name) is None]
    if missing:
        reason = f"skipped: {', '.join(missing)} not installed (maxtext-compat serves through vllm-tpu)"
        log.warning("maxtext_compat plugin %s", reason)
        return PluginState(False, None, reason, pid=pid)
    from maxtext_compat.resolution.probes import detect_import_root

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
    from maxtext_compat.cpu import serving as cpu_serving

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
    statuses = install_row_shims(_row_shims(rt))
    for name, st in statuses.items():
        log.info("maxtext_compat plugin: shim %r: %s", name, st.reason)
    rt.backend.prepare()
    from maxtext_compat.serving_fixes.request_defects import PROFILE as REQUESTS

    requests = statuses.get(REQUESTS)
    handled = list(requests.facts.get("handled", ())) if requests is not None and requests.active else []
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
    _install_config_hooks()
    if config is not None:
        digest = join_engine(config, role, model=choice, resolution=rt.resolution)
    else:  # a process vLLM loads the plugin in without its config (an API server): the fingerprint is logged
        from maxtext_compat.serving import fingerprint

        digest = fingerprint.current(model=choice, resolution=rt.resolution).digest
    return PluginState(True, choice, reason, shim_text, pid, role, digest, settings.effective())


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

        carried = type(current_platform).additional_env_vars
    except (ImportError, AttributeError, RuntimeError) as exc:
        log.debug("maxtext_compat plugin: no additional_env_vars to extend (%s)", exc)
        return
    if isinstance(carried, list):
        carried.extend(n for n in ENV_NAMES if n not in carried)


def _row_shims(rt: ServingRuntime) -> list[Any]:
    """The shims the resolved row needs in a vLLM process: the convention profile the matrix's chooser picks (none
    for native 0.2.x rows without defects to fix) and the serving stack's request fixes (for every model served)."""
    from maxtext_compat.patching import profiles, shim
    from maxtext_compat.serving_fixes.request_defects import RequestDefectsShim

    needed: list[Any] = []
    if importlib.util.find_spec("maxtext_compat.shims.maxtext_profiles") is not None:
        # Registers the MaxText shims (vllm-backport, known-defects, call-rule) and their default chooser.
        importlib.import_module("maxtext_compat.shims.maxtext_profiles").register()
    if profiles.has_default_profile_chooser():
        name = profiles.default_profile(rt.resolution)
        if name is not None:
            needed.append(shim.registered().get(name) or _NamedProfile(name))
    else:
        log.debug("maxtext_compat plugin: no default-profile chooser registered; no convention shim applied")
    needed.append(RequestDefectsShim(rt.resolution))
    return needed


def install_row_shims(shims: list[Any]) -> dict[str, Any]:
    """Install each shim (a release outside one's verified range: ShimRefusedError, unless MAXTEXT_COMPAT_FORCE_SHIMS
    forces it, as `force=True` does in Python); their statuses by name."""
    from maxtext_compat.switches import force_shims

    force = force_shims()
    return {s.name: s.install(force=force) for s in shims}


@dataclass(frozen=True)
class _NamedProfile:
    """A profile a user's chooser picked that no shim object owns: installed by name."""

    name: str

    def install(self, *, force: bool = False) -> Any:
        from maxtext_compat.patching import profiles, shim

        profiles.install(self.name, force=force)
        return shim.status_of(self.name)


# Where vLLM hands the config on to the engine cores it starts (the API server or the user's LLM process) and where an
# engine core starts: patched so the settings reach a process started by fork too (vLLM's default start method
# outside `vllm serve`), whose plugin vLLM does not load again.
HOOKS_PROFILE = names.PLUGIN_CONFIG
PROC_MANAGER = "vllm.v1.engine.utils:CoreEngineProcManager.__init__"
ENGINE_INIT = "vllm.v1.engine.core:EngineCore.__init__"


class PluginConfigShim(Shim):
    """vLLM's hand-over of the config to the engine cores it starts, and an engine core's start: the plugin's
    settings reach a process started by fork, whose plugin vLLM does not load again."""

    name = HOOKS_PROFILE
    description = "the plugin's settings reach engine cores started by fork"
    # the vLLM of every serving environment of this repository (tests/compat/test_serving_plugin.py, the Ray tests)
    verified_for = (names.TPU_INFERENCE_RELEASES,)  # the vLLM releases the serving rows of the matrix pin with them

    def __init__(self) -> None:
        self.present: list[tuple[str, Any]] = []

    def applies(self) -> str | None:
        targets = [(PROC_MANAGER, _proc_manager_factory), (ENGINE_INIT, _engine_init_factory)]
        self.present = [(t, f) for t, f in targets if _resolvable(t)]
        if len(self.present) < len(targets):
            log.info("maxtext_compat plugin: this vLLM has no %s; settings reach forked processes through the "
                     "environment only", ", ".join(t for t, _ in targets if (t, _) not in self.present))  # fmt: skip
        return None

    def specs(self) -> list[Any]:
        from maxtext_compat.patching import PatchSpec

        origin = f"{__name__} (plugin settings from vLLM's config)"
        return [PatchSpec(t, f, aliases=(), origin=origin) for t, f in self.present]


def _install_config_hooks() -> None:
    PluginConfigShim().install()


def _resolvable(target: str) -> bool:
    module, _, path = target.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in path.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return False
    return True


def _config_argument(original: Any, args: tuple[Any, ...], kwargs: dict[str, Any], instance: Any) -> Any:
    import inspect

    bound = inspect.signature(original.function).bind_partial(instance, *args, **kwargs)
    return bound.arguments.get("vllm_config")


def _proc_manager_factory(original: Any) -> Any:
    def init(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        config = _config_argument(original, args, kwargs, instance)
        if config is not None:
            frontend_settings(config)
        return wrapped(*args, **kwargs)

    return init


def _engine_init_factory(original: Any) -> Any:
    def init(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        config = _config_argument(original, args, kwargs, instance)
        current = state()
        # Forked (vLLM does not load the plugin again) or in the process that set it up without the config
        # (VLLM_ENABLE_V1_MULTIPROCESSING=0); a spawned engine core loads it with the config inside this call.
        set_up_earlier = current is not None and (current.pid != os.getpid() or current.role == "")
        if config is not None and current is not None and current.registered and set_up_earlier:
            join_forked_engine(config, current)
        return wrapped(*args, **kwargs)

    return init


def frontend_settings(config: Any) -> dict[str, str]:
    """In the process that starts the engine cores: the config's settings become its environment, which every
    process it starts inherits (spawned API servers and engine cores set the plugin up with them from their first
    line). This process itself was set up before it read the config: what differs is logged (the request shim reads
    disable_request_shim per request; the others apply to the processes started from here)."""
    from maxtext_compat.serving import settings

    applied = settings.apply(getattr(config, "additional_config", None))
    current = state()
    used = {} if current is None or current.settings is None else current.settings
    changed = {k: v for k, v in settings.effective().items() if v != used.get(k)}
    if applied and changed and current is not None and current.registered:
        log.warning("maxtext_compat plugin (pid %d): settings from additional_config[%r] reach the processes started "
                    "from here; this process was set up before it read them: %s", os.getpid(), settings.CONFIG_KEY,
                    ", ".join(f"{k}={v!r}" for k, v in changed.items()))  # fmt: skip
    return applied


def join_forked_engine(config: Any, parent: PluginState) -> str:
    """An engine core whose plugin was set up before it saw the config: forked from a process set up already (vLLM
    does not load the plugin again), or running in that process (VLLM_ENABLE_V1_MULTIPROCESSING=0). Its patches
    were made without the config, so the config's settings must be what they were made with (ServingConfigError
    otherwise); then it writes its fingerprint for the workers, as a spawned engine core does."""
    import dataclasses

    from maxtext_compat.errors import CompatError, ServingConfigError
    from maxtext_compat.serving import runtime, settings

    used = parent.settings or {}
    by_env = {s.env: s for s in settings.SETTINGS}
    for name, text in settings.from_config(getattr(config, "additional_config", None)).items():
        setting = by_env[name]
        if setting.parse(text) != used.get(setting.key):
            raise ServingConfigError(
                f"{settings.config_argument(setting.key)} reached an engine core whose plugin was set up before "
                f"the config (forked, or in-process): the patches here were made with another value "
                f"({setting.meaning})",
                argument=settings.config_argument(setting.key),
                expected=f"{used.get(setting.key)!r} (what the plugin was set up with)",
                found=repr(text),
                fix=f"start vLLM with VLLM_WORKER_MULTIPROC_METHOD=spawn (vllm serve's default), so the engine core "
                f"sets the plugin up with its config, or set {name}={text} in the environment before vLLM starts",
            )
    try:
        resolution = runtime.current().resolution
    except CompatError:  # the parent found MaxText cannot be served here: the installed resolution is compared
        resolution = None
    digest = join_engine(config, "engine", model=parent.model, resolution=resolution)
    global _STATE
    with _LOCK:
        _STATE = dataclasses.replace(parent, pid=os.getpid(), role="engine", fingerprint=digest)
    log.info("maxtext_compat plugin (pid %d, engine, set up in pid %d): fingerprint %s", os.getpid(), parent.pid,
             digest)  # fmt: skip
    return digest
