"""MaxText shim profiles: `vllm-backport` (pre-#2616 releases) and `known-defects` (fixes per release).

Why profiles on MaxText's own classes (and not only adapters): vLLM's model code, MaxText's
own decode scripts and users' training loops construct MaxText's classes directly. A shim
gives those classes the two-convention call rule in place: new calls thread KV caches and
run ragged paged attention, every old call MaxText makes internally keeps its old return.
Both profiles are built from the installed release's matrix row and go through the shims
core (atomic, reversible, listed by `maxtext-compat doctor`).
"""

from __future__ import annotations

from typing import Any

from maxtext_compat import names
from maxtext_compat.backport.call import inner_call
from maxtext_compat.backport.session import current
from maxtext_compat.convention import callers
from maxtext_compat.convention.kinds import CLASS_KINDS
from maxtext_compat.convention.rule import CallSite, call_rule
from maxtext_compat.convention.signature import advertised_signature, native_signature
from maxtext_compat.locks import fork_safe_lock
from maxtext_compat.matrix import MaxTextRow
from maxtext_compat.patching.shim import Shim
from maxtext_compat.shims.backport_hooks import WRITE_PATH

BACKPORT = names.VLLM_BACKPORT
DEFECTS = names.KNOWN_DEFECTS
CALL_RULE = names.CALL_RULE
_registered = fork_safe_lock()


def _row() -> MaxTextRow:
    from maxtext_compat.resolution.installed import installed_row

    return installed_row()


def _unbound(wrapped: Any, instance: Any, args: tuple) -> tuple[Any, Any, tuple]:
    """wrapt passes instance=None when a method is called through the class (Linen's apply does)."""
    if instance is None and args:
        module = args[0]
        return (lambda *a, **k: wrapped(module, *a, **k)), module, args[1:]
    return wrapped, instance, args


# ----------------------------------------------------------------------------------------------
# vllm-backport: the call rule in MaxText's own classes
# ----------------------------------------------------------------------------------------------


def _rule_factory(kind: str, row: MaxTextRow) -> Any:
    def factory(original: Any) -> Any:
        native = native_signature(original.function)
        where = f"{getattr(original.owner, '__qualname__', original.owner)}.__call__"
        site = CallSite(kind, row, native, advertised_signature(native, kind), where, deprecation=False,
                        write_path=WRITE_PATH)  # fmt: skip
        native_call_var = callers.NATIVE_CALL
        routes = not row.has_kv_params  # only the backport opens KV sessions (0.1.0): decided once, here

        def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            if instance is None and args:  # called through the class (Linen's apply does)
                call, module, args = _unbound(wrapped, instance, args)
            else:
                call, module = wrapped, instance
            running = native_call_var.get()
            # NATIVE_CALL holds (id of the module running natively, ...): this module's own native call
            if running is not None and running[0] == id(module):
                return call(*args, **kwargs)  # the rule is applied to this very call already (an adapter's)
            if routes:
                session = current()
                if session is not None and session.route:
                    return inner_call(kind, row, call, args, kwargs, where)

            def native_call(m: Any, kw: dict[str, Any]) -> Any:
                token = native_call_var.set((id(m), True))  # what MaxText's code calls now is MaxText's own call
                try:
                    return call(**kw)
                finally:
                    native_call_var.reset(token)

            return call_rule(site, module, native_call, args, kwargs)

        return wrapper

    return factory


def _advertise(kind: str) -> Any:
    def source(fn: Any) -> Any:
        import inspect

        sig = advertised_signature(native_signature(fn), kind)
        self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        return sig.replace(parameters=[self_param, *sig.parameters.values()])

    return source


BATCHED = "vllm_batched_rpa"


def _accept_vllm_rpa(row: MaxTextRow) -> Any:
    """pyconfig.validate_attention_kernel: also accept "vllm_rpa" (MaxText 0.2.x accepts it).

    "vllm_batched_rpa" (0.2.4+) is refused with a typed error: the backport runs one RPA call per
    layer (tpu-inference's batched kernel is bound at its import, not per config), so accepting the
    name would silently serve with the other kernel.
    """

    def factory(original: Any) -> Any:
        def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            kernel = args[0] if args else kwargs.get("s")
            if kernel == "vllm_rpa":
                return None
            if kernel == BATCHED:
                from maxtext_compat.errors import ShimRefusedError

                raise ShimRefusedError(
                    f"attention={BATCHED!r} is not available on MaxText {row.name} with the vllm-backport shim",
                    argument="attention",
                    expected="'vllm_rpa' (the backported vLLM path)",
                    found=repr(kernel),
                    fix="set attention='vllm_rpa'; the batched kernel needs MaxText 0.2.4 or newer",
                )
            return wrapped(*args, **kwargs)

        return wrapper

    return factory


def _vllm_rpa_op_is_dot_product(original: Any) -> Any:
    """AttentionOp.__init__: under "vllm_rpa" the op itself is MaxText's dot-product op, as in 0.2.x
    (`attention_kernel == "vllm_rpa"` joins the dot-product dispatch; RPA runs in Attention)."""

    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if kwargs.get("attention_kernel") == "vllm_rpa":
            kwargs = {**kwargs, "attention_kernel": "dot_product"}
        return wrapped(*args, **kwargs)

    return wrapper


def rule_specs(row: MaxTextRow) -> list[Any]:
    """The adapters' call rule in MaxText's own Attention, decoder layers, Decoder and Transformer classes."""
    from maxtext_compat.shims import PatchSpec

    specs = []
    here = __name__
    for key, kind in CLASS_KINDS:
        class_ref = row.classes.get(key)
        if class_ref is not None:
            ref = str(class_ref)
            specs.append(
                PatchSpec(
                    f"{ref}.__call__",
                    _rule_factory(kind, row),
                    signature=_advertise(kind),
                    origin=f"{here}._rule_factory({kind!r})",
                )
            )
    for ref in dict.fromkeys(str(r) for r in row.decoder_layers.values()):
        specs.append(
            PatchSpec(
                f"{ref}.__call__",
                _rule_factory("decoder_layer", row),
                signature=_advertise("decoder_layer"),
                origin=f"{here}._rule_factory('decoder_layer')",
            )
        )
    return specs


def call_rule_specs(row: MaxTextRow) -> list[Any]:
    """The call-rule profile: releases with the KV parameters (on older ones vllm-backport holds the rule)."""
    if not row.has_kv_params:
        from maxtext_compat.errors import ShimRefusedError

        raise ShimRefusedError(
            f"MaxText {row.name} has no KV parameters: the call rule comes with the backport there",
            argument="profile",
            expected=f"'{BACKPORT}' on MaxText {row.name}",
            found=f"'{CALL_RULE}'",
            fix=f"shims.install('{BACKPORT}') (or shims.install(convention=...), which picks it)",
        )
    return rule_specs(row)


def backport_specs(row: MaxTextRow) -> list[Any]:
    from maxtext_compat.shims import PatchSpec
    from maxtext_compat.shims import backport_hooks as hooks

    here = __name__
    specs = [s for s in hooks.specs(row) if not s.target.endswith("Attention.__call__")]
    specs += rule_specs(row)
    op = row.classes["attention_op"]
    if op is not None:
        specs.append(
            PatchSpec(f"{op}.__init__", _vllm_rpa_op_is_dot_product, origin=f"{here}._vllm_rpa_op_is_dot_product")
        )
    specs.append(
        PatchSpec(
            f"{row.config.pyconfig}:validate_attention_kernel", _accept_vllm_rpa(row), origin=f"{here}._accept_vllm_rpa"
        )
    )
    return specs


# ----------------------------------------------------------------------------------------------
# known-defects: fixes listed in the matrix row
# ----------------------------------------------------------------------------------------------


class _ConfigView:
    """The layer's config with a few keys overridden (the layer reads them at call time)."""

    def __init__(self, config: Any, **overrides: Any) -> None:
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "_overrides", overrides)

    def __getattr__(self, name: str) -> Any:
        overrides = object.__getattribute__(self, "_overrides")
        if name in overrides:
            return overrides[name]
        return getattr(object.__getattribute__(self, "_config"), name)


def _call_unscanned(function: Any, call: Any, module: Any, args: tuple, kwargs: dict) -> Any:
    """Run the layer as if unscanned, so it returns (y, kv_cache) instead of dropping the cache.

    An NNX layer is shared (every thread calls the same instance): it runs as a twin that shares its
    variables and submodules but holds the config view, so the layer itself is never changed and a
    concurrent call sees its own config. A Linen layer is a per-`apply` clone: its config is swapped
    for the call.
    """
    view = _ConfigView(module.config, scan_layers=False)
    if "config" in getattr(module, "__dict__", {}) and not _is_linen(module):
        twin = object.__new__(type(module))
        twin.__dict__.update(module.__dict__)
        twin.__dict__["config"] = view
        return function(twin, *args, **kwargs)
    config = module.config
    object.__setattr__(module, "config", view)
    try:
        return call(*args, **kwargs)
    finally:
        object.__setattr__(module, "config", config)


def _is_linen(module: Any) -> bool:
    try:
        from flax import linen
    except ImportError:  # pragma: no cover - MaxText always brings flax
        return False
    return isinstance(module, linen.Module)


def _scan_kv_fix(original: Any) -> Any:
    """Decoder layers that lose the KV cache under scan_layers=True (matrix: scan-kv-carry-missing,
    scan-unroll-drops-kv). Handles both ways MaxText threads caches through a scanned stack: the
    (y, stacked_kv, idx) carry of the Linen scan (0.2.2–0.2.4) and the per-layer kv_cache= of
    NNXDecoder's static unroll (0.2.5)."""
    sig = native_signature(original.function)
    function = original.function

    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        call, module, args = _unbound(wrapped, instance, args)
        if not getattr(getattr(module, "config", None), "scan_layers", False):
            return call(*args, **kwargs)
        bound = sig.bind(*args, **kwargs)
        inputs = bound.arguments["inputs"]
        if isinstance(inputs, tuple) and len(inputs) == 3:  # the Linen scan carry
            y, stacked, idx = inputs
            bound.arguments["inputs"] = y
            bound.arguments["kv_cache"] = stacked[idx]
            y2, kv = _call_unscanned(function, call, module, bound.args, bound.kwargs)
            if kv is not None and getattr(kv, "size", None):
                stacked = stacked.at[idx].set(kv)
            return (y2, stacked, idx + 1), None
        if bound.arguments.get("kv_cache") is not None:  # NNXDecoder's unroll: kv_cache= per layer
            return _call_unscanned(function, call, module, bound.args, bound.kwargs)
        return call(*args, **kwargs)

    return wrapper


DEFECT_TARGETS: dict[str, Any] = {
    "scan-kv-carry-missing": _scan_kv_fix,
    "scan-unroll-drops-kv": _scan_kv_fix,
}


def _config_checks(row: MaxTextRow, tpu_inference: Any) -> Any:
    """pyconfig.initialize: refuse a config that hits a refused defect or a non-RPA vLLM attention backend."""
    from maxtext_compat.resolution import defects

    def factory(original: Any) -> Any:
        def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            config = wrapped(*args, **kwargs)
            defects.check_config(row, tpu_inference, config)
            defects.check_attention_backend(config)
            return config

        return wrapper

    return factory


def defect_specs(row: MaxTextRow) -> list[Any]:
    from maxtext_compat.resolution import defects
    from maxtext_compat.shims import PatchSpec

    specs: list[Any] = []
    tpi = defects.installed_tpu_inference()
    if row.vllm is not None and tpi is not None:  # MaxText's own vLLM path, with a tpu-inference to serve it
        origin = f"{__name__}._config_checks (refused known defects, attention backend)"
        specs.append(PatchSpec(f"{row.config.pyconfig}:initialize", _config_checks(row, tpi), origin=origin))
    seen: set[str] = set()
    for defect in row.known_defects:
        factory = DEFECT_TARGETS.get(defect.id)
        if factory is None or defect.remedy != "fix":
            continue
        for key in defect.affects:
            family = key.split(".", 1)[1] if key.startswith("decoder_layers.") else None
            ref = row.decoder_layers.get(family) if family else row.classes.get(key)
            if ref is None or str(ref) in seen:
                continue
            seen.add(str(ref))
            specs.append(PatchSpec(f"{ref}.__call__", factory, origin=f"{__name__}.{factory.__name__} ({defect.id})"))
    return specs


# ----------------------------------------------------------------------------------------------
# Registration and the default choice
# ----------------------------------------------------------------------------------------------


def for_declared_convention(profile: str | None) -> str | None:
    """What a declared caller convention needs besides `profile`: the call rule in MaxText's classes.

    On a release without the KV parameters the rule lives in vllm-backport (with the backport it
    routes to); without MaxText there is nothing to put it in.
    """
    from maxtext_compat.errors import ResolutionError

    try:
        row = _row()
    except ResolutionError:
        return None
    needed = CALL_RULE if row.has_kv_params else BACKPORT
    if profile in (needed, BACKPORT):
        return None
    register()  # puts back a built-in profile someone unregistered: the declaration needs it
    return needed


def choose(resolution: Any) -> str | None:
    """The profile `shims.install()` picks: the backport for pre-#2616 rows, else the defect fixes; a fork that
    no row's adapters can call is refused here, before any patch."""
    from maxtext_compat.resolution.installed import refuse_unbridged

    refuse_unbridged(resolution)
    row = resolution.maxtext
    if row is None:
        return None
    if not row.has_kv_params:
        return BACKPORT
    if any(d.id in DEFECT_TARGETS and d.remedy == "fix" for d in row.known_defects):
        return DEFECTS
    if row.vllm is not None and resolution.versions.get("tpu_inference") is not None:
        return DEFECTS  # the config checks: refused defects and the attention backend of a vLLM server
    return None


class _CallerConventions:
    """The caller convention as `shims.install(convention=...)` declares it (see profiles.Declarations)."""

    def check(self, value: str, argument: str) -> str:

        return callers.check(value, argument)

    def companion(self, profile: str | None) -> str | None:
        return for_declared_convention(profile)

    def declare(self, value: str, source: str) -> object:

        callers.set_caller_convention(value, source=source)
        return callers.process_convention()

    def forget(self, token: object) -> None:

        if callers.process_convention() is token:
            callers.set_caller_convention(None)


class _RowShim(Shim):
    """A MaxText profile: its patches are built for the installed release's matrix row at install time."""

    def build(self, row: MaxTextRow) -> list[Any]:
        raise NotImplementedError

    def specs(self) -> list[Any]:
        from maxtext_compat.resolution.installed import installed_resolution, refuse_unbridged

        refuse_unbridged(installed_resolution().resolution)
        return self.build(_row())

    def facts(self) -> dict[str, str]:
        return {"maxtext": _row().name}


class VllmBackportShim(_RowShim):
    name = BACKPORT
    description = "new calls on a pre-#2616 MaxText: the call rule, its KV session and ragged paged attention"
    verified_for = (names.MAXTEXT_RELEASES,)  # built for rows without the KV parameters (0.1.0); tested on 0.2.x too

    def build(self, row: MaxTextRow) -> list[Any]:
        return backport_specs(row)


class KnownDefectsShim(_RowShim):
    name = DEFECTS
    description = "fixes listed in the matrix row"
    verified_for = (names.MAXTEXT_RELEASES,)  # the defects each matrix row lists, with the releases each was seen on

    def build(self, row: MaxTextRow) -> list[Any]:
        return defect_specs(row)


class CallRuleShim(_RowShim):
    name = CALL_RULE
    description = "the call rule (and a declared caller convention) in MaxText's own classes"
    verified_for = (names.MAXTEXT_RELEASES,)  # built for rows with the KV parameters (0.2.x)

    def build(self, row: MaxTextRow) -> list[Any]:
        return call_rule_specs(row)


def register() -> None:
    """Register the three shims and, when none is set, the matrix-driven default chooser (idempotent, light).

    Safe to call again after a user or a test unregistered a profile or cleared the chooser: what is
    missing is put back, what is there is left alone.
    """
    from maxtext_compat.patching import profiles, shim

    with _registered:
        if not {BACKPORT, DEFECTS, CALL_RULE} <= set(profiles.registered_profiles()):
            for made in (VllmBackportShim(), KnownDefectsShim(), CallRuleShim()):
                if not profiles.installed(made.name):
                    shim.register(made)
            profiles.set_declarations(_CallerConventions())
        if not profiles.has_default_profile_chooser():
            profiles.set_default_profile_chooser(choose)
