"""The `known-defects` shim's patch specs: the fixes a MaxText matrix row lists (a scanned decoder's KV caches, the
config checks a release gets wrong), built from the row.

Why apart from the shims' choice and registration (`maxtext_profiles`): what a profile patches is one job, which
profile a process gets is another.
"""

from __future__ import annotations

from typing import Any

from maxtext_compat.convention.signature import native_signature
from maxtext_compat.matrix import MaxTextRow
from maxtext_compat.shims.rule_patches import unbound


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
        call, module, args = unbound(wrapped, instance, args)
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
