"""Eager overhead: extra microseconds per call of an adapter (`wrap`) and of a shim-patched class vs native.

    MAXTEXT_COMPAT_ENV=maxtext-0.2.5 .envs/maxtext-0.2.5/bin/python benchmarks/bench_eager.py   # real modules
    .envs/unit/bin/python benchmarks/bench_eager.py                                             # fake modules

Why two kinds of module: a jitted call pays the adapter once, at trace time (bench_traced shows
the program is the same); an eager call pays it every time. On the real tiny MaxText modules an
eager call costs milliseconds, so the adapter's microseconds sit inside the call-to-call noise:
those rows show what a user sees. A pure-Python fake with the release's exact signature (no
jax; where no MaxText is installed) isolates the adapter's own cost.
Method: rounds that call every variant once (real) or 100 times (fake), in a rotating order to
cancel drift; per round, extra = variant - native; reported: median extra and its IQR. A
patched variant runs with the profile installed for its call only (install/uninstall is outside
the timed region), so native and adapter run on the unpatched class in the same round.
"""

from __future__ import annotations

import functools
import gc
import statistics
import sys
import time
import types
from collections.abc import Callable
from typing import Any

import run_all

REAL_ROUNDS = 400  # ms-long calls with ~±150 µs call-to-call noise: the median extra is known to ~±15 µs
FAKE_ROUNDS, FAKE_CALLS = 300, 100


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def measure(variants: dict[str, Callable[[], Any]], rounds: int, calls: int = 1,
            setup: dict[str, Any] | None = None) -> dict[str, list[float]]:  # fmt: skip
    """Seconds per call of each variant, one sample per round; `setup[name]` is a context manager factory."""
    names = list(variants)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for fn in variants.values():  # warm-up: caches, first-call paths
        fn()
    gc.collect()
    gc.disable()  # as timeit does: collections land on whichever call happens to run then
    try:
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                fn = variants[name]
                ctx = setup[name]() if setup and name in setup else None
                if ctx is not None:
                    ctx.__enter__()
                try:
                    start = time.perf_counter()
                    for _ in range(calls):
                        fn()
                    samples[name].append((time.perf_counter() - start) / calls)
                finally:
                    if ctx is not None:
                        ctx.__exit__(None, None, None)
    finally:
        gc.enable()
    return samples


def rows_for(
    prefix: str, samples: dict[str, list[float]], how: str, ref: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """One row per non-native variant: median extra µs (IQR) per call vs native, paired by round.

    ref: the real MaxText row whose native time this (fake) row's ratio is taken against.
    """
    native = samples["native"]
    med_native = statistics.median(native) * 1e6
    out = []
    for name, xs in samples.items():
        if name == "native":
            continue
        lo, med, hi = _quartiles([(a - b) * 1e6 for a, b in zip(xs, native, strict=True)])
        spread = f"IQR {lo:+.1f} to {hi:+.1f}"
        if ref is None:
            r = run_all.row(f"eager overhead · {prefix} · {name}", med, "µs/call", how, native=med_native,
                            ratio=(med_native + med) / med_native, spread=spread)  # fmt: skip
        else:
            r = run_all.row(f"eager overhead · {prefix} · {name}", med, "µs/call",
                            f"{how}; fake native {med_native:.2f} µs; ratio vs the real MaxText call in {ref['env']}",
                            spread=spread, ref=ref)  # fmt: skip
        out.append(r)
        print(f"  {prefix} {name}: {med:+.2f} µs on {med_native:.1f} µs", file=sys.stderr, flush=True)
    return out


# ----------------------------------------------------------------------------------------------
# Real MaxText modules
# ----------------------------------------------------------------------------------------------


def real() -> list[dict[str, Any]]:
    import jax
    from flax import nnx

    from maxtext_compat import shims
    from maxtext_compat.adapters import wrap
    from maxtext_compat.shims import maxtext_profiles
    from maxtext_compat.testing import tiny

    row = tiny.installed_row()
    maxtext_profiles.register()
    profile = maxtext_profiles.choose(types.SimpleNamespace(maxtext=row))
    cfg = tiny.tiny_config("default")
    mesh = tiny.tiny_mesh(cfg)
    inp = tiny.tiny_inputs(cfg)
    x, pos, seg = inp["x"], inp["positions"], inp["segment_ids"]
    out: list[dict[str, Any]] = []
    how = (f"eager old call (train), jax.block_until_ready, tiny default model [2, 16, 128], {REAL_ROUNDS} rounds "
           "interleaved; extra = variant - native per round")  # fmt: skip
    with tiny.mesh_context(cfg, mesh):
        attn = tiny.tiny_attention(cfg, mesh)
        wrapped = wrap(attn)

        def call(m: Any) -> Callable[[], Any]:
            return lambda: jax.block_until_ready(m(x, x, pos, seg, model_mode="train", deterministic=True))

        variants = {"native": call(attn), "adapter": call(wrapped)}
        setup = None
        if profile == maxtext_profiles.BACKPORT:  # vllm-backport patches Attention itself
            variants["patched class"] = call(attn)
            setup = {"patched class": lambda: shims.patched(profile)}
        out += rows_for("Attention · old call", measure(variants, REAL_ROUNDS, setup=setup), how)

        layer_cls = row.decoder_layers["llama2"].load()
        if profile == maxtext_profiles.DEFECTS and issubclass(layer_cls, nnx.Module):  # the class known-defects patches
            layer = layer_cls(config=cfg, model_mode="train", mesh=mesh, rngs=nnx.Rngs(params=0, dropout=1), quant=None)

            def lcall(m: Any) -> Callable[[], Any]:
                return lambda: jax.block_until_ready(m(x, seg, pos, True, "train"))

            variants = {"native": lcall(layer), "adapter": lcall(wrap(layer)), "patched class": lcall(layer)}
            samples = measure(variants, REAL_ROUNDS, setup={"patched class": lambda: shims.patched(profile)})
            out += rows_for("LlamaDecoderLayer · old call", samples, how.replace(", tiny", ", known-defects, tiny"))
    return out


# ----------------------------------------------------------------------------------------------
# Pure-Python fakes with the releases' exact signatures (tests/unit/test_adapters_mocked_rows.py)
# ----------------------------------------------------------------------------------------------

# Attention.__call__ per release, as read from the maxtext 0.1.0 .. 0.2.5 wheels (test_adapters_mocked_rows.py).
_SIG_010 = (
    "inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, *, model_mode='train', "
    "deterministic=False, previous_chunk=None, slot=None, page_state=None, bidirectional_mask=None"
)
_SIG_020 = (
    "inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, out_sharding=None, *, "
    "model_mode='train', deterministic=False, previous_chunk=None, slot=None, page_state=None, "
    "bidirectional_mask=None, rope_kwargs=None, kv_cache=None, attention_metadata=None"
)
_SIG_023 = (
    "inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, out_sharding=None, *, "
    "model_mode='train', deterministic=False, previous_chunk=None, slot=None, bidirectional_mask=None, "
    "rope_kwargs=None, kv_cache=None, attention_metadata=None, shared_key=None, shared_value=None"
)
ATTENTION_SIGS = {"0.1.0": _SIG_010, "0.2.0": _SIG_020, "0.2.1": _SIG_020, "0.2.2": _SIG_020, "0.2.3": _SIG_023,
                  "0.2.4": _SIG_023, "0.2.5": _SIG_023}  # fmt: skip
LLAMA_SIG_025 = (
    "inputs, decoder_segment_ids, decoder_positions, deterministic, model_mode, previous_chunk=None, "
    "slot=None, kv_cache=None, attention_metadata=None"
)


def fake_class(name: str, params: str, new_return: bool) -> type:
    """A class whose __call__ has exactly `params` and returns a constant (the release's return shape)."""
    ns: dict[str, Any] = {}
    body = (
        "    return ('OUT', kv_cache + '+') if kv_cache is not None else 'OUT'\n"
        if new_return
        else "    return 'OUT'\n"
    )
    exec(f"def __call__(self, {params}):\n{body}", ns)  # the release's exact signature

    def __init__(self: Any) -> None:
        self.model_mode = "train"
        self.config = types.SimpleNamespace(attention="vllm_rpa", scan_layers=False)

    return type(name, (), {"__call__": ns["__call__"], "__init__": __init__, "__module__": FAKE_MODULE})


def bare_wrapt(cls: type) -> type:
    """The anchor: a subclass whose __call__ is the same function under a wrapt wrapper that only calls through."""
    import wrapt

    call = wrapt.FunctionWrapper(
        cls.__dict__["__call__"], lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs)
    )
    return type(f"Wrapt{cls.__name__}", (cls,), {"__call__": call, "__module__": FAKE_MODULE})


FAKE_MODULE = "maxtext_compat_bench_fakes"
# Each fake row's ratio is taken against the real module's native eager call of that release's environment.
_ATTN = "eager overhead · Attention · old call · adapter"
_LAYER = "eager overhead · LlamaDecoderLayer · old call · adapter"


def _ref(release: str) -> dict[str, Any]:
    env = "maxtext-0.1.0-jax011" if release == "0.1.0" else "maxtext-0.2.5"  # where a real module is timed
    return {"env": env, "figure": _ATTN, "overhead": True}


def fake() -> list[dict[str, Any]]:
    """Per release: the adapter's old and new calls and the patched class (the call rule in MaxText's own class:
    vllm-backport on 0.1.0, call-rule on 0.2.x), beside a bare wrapt wrapper of the same function. The fakes' strings
    stand in for caches: the write path records the new call instead of checking arrays (no jax here); the real
    modules' rows include the checks."""
    from maxtext_compat.testing.checkless import checkless_calls

    with checkless_calls():
        return _fake()


def _fake() -> list[dict[str, Any]]:
    from maxtext_compat import shims
    from maxtext_compat.adapters.wrapper import adapted_class
    from maxtext_compat.matrix import load_matrix
    from maxtext_compat.shims import PatchSpec, defect_patches, maxtext_profiles, rule_patches

    matrix = load_matrix()
    module = types.ModuleType(FAKE_MODULE)  # patch targets are "module:Class.attr"
    sys.modules[FAKE_MODULE] = module
    specs: list[Any] = []
    per_release: list[tuple[str, dict[str, Callable[[], Any]]]] = []
    old = {"model_mode": "train", "deterministic": True}
    new = {"model_mode": "autoregressive", "kv_cache": "KV", "attention_metadata": "MD"}
    for release, sig in ATTENTION_SIGS.items():
        row = matrix.row(release)
        tag = release.replace(".", "")
        native_cls = fake_class(f"Attention{tag}", sig, row.has_kv_params)
        # An identical twin gets patched, so the native calls of the same round run the unpatched class.
        twin = fake_class(f"PatchedAttention{tag}", sig, row.has_kv_params)
        setattr(module, native_cls.__name__, native_cls)
        setattr(module, twin.__name__, twin)
        specs.append(PatchSpec(f"{FAKE_MODULE}:{twin.__name__}.__call__", rule_patches._rule_factory("attention", row)))
        native, anchor = native_cls(), bare_wrapt(native_cls)()
        adapter, patched = adapted_class(native_cls, row=row, kind="attention")(), twin()
        calls = {"old call": ("x", "x", "pos", "seg"), "new call": ("x", "x", "pos", None)}
        for call, args in calls.items():
            if call == "new call" and not row.has_kv_params:
                continue  # 0.1.0's new call runs the backport through the real kernel: bench_decode times it
            kw = old if call == "old call" else new
            per_release.append((f"fake Attention, {release} row · {call}", {
                "native": functools.partial(native, *args, **kw),
                "bare wrapt wrapper (anchor)": functools.partial(anchor, *args, **kw),
                "adapter": functools.partial(adapter, *args, **kw),
                "patched class (" + (maxtext_profiles.BACKPORT if release == "0.1.0" else maxtext_profiles.CALL_RULE)
                + " rule)": functools.partial(patched, *args, **kw),
            }))  # fmt: skip
    module.Layer025 = fake_class("Layer025", LLAMA_SIG_025, True)
    module.PatchedLayer025 = fake_class("PatchedLayer025", LLAMA_SIG_025, True)
    specs.append(
        PatchSpec(f"{FAKE_MODULE}:PatchedLayer025.__call__", defect_patches.DEFECT_TARGETS["scan-unroll-drops-kv"])
    )
    layer_args = ("x", None, "pos", True, "autoregressive")
    layer_kw = {"kv_cache": "KV", "attention_metadata": "MD"}
    per_release.append(("fake LlamaDecoderLayer, 0.2.5 row · new call", {
        "native": functools.partial(module.Layer025(), *layer_args, **layer_kw),
        "bare wrapt wrapper (anchor)": functools.partial(bare_wrapt(module.Layer025)(), *layer_args, **layer_kw),
        "patched class (known-defects)": functools.partial(module.PatchedLayer025(), *layer_args, **layer_kw),
    }))  # fmt: skip
    shims.register_profile("bench-fakes", lambda: specs, replace=True)
    out: list[dict[str, Any]] = []
    how = (f"pure-Python fake with the release's exact __call__ signature (returns a constant); {FAKE_ROUNDS} "
           f"rounds x {FAKE_CALLS} calls, interleaved, gc off; the anchor is a wrapt.FunctionWrapper that only "
           "calls through, in the same run; the new call's write path records instead of checking arrays")  # fmt: skip
    with shims.patched("bench-fakes"):
        for prefix, variants in per_release:
            release = prefix.split(", ")[1].split(" ")[0]
            ref = {"env": "maxtext-0.2.5", "figure": _LAYER, "overhead": True} if "Layer" in prefix else _ref(release)
            out += rows_for(prefix, measure(variants, FAKE_ROUNDS, FAKE_CALLS), how, ref)
    shims.unregister_profile("bench-fakes")
    return out


def run() -> list[dict[str, Any]]:
    run_all.cpu_env()
    from maxtext_compat.resolution.probes import detect_import_root

    return real() if detect_import_root() is not None else fake()


if __name__ == "__main__":
    run_all.emit(run())
