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

ATTENTION_SIGS = {
    "0.1.0": "inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, *, model_mode='train', "
    "deterministic=False, previous_chunk=None, slot=None, page_state=None, bidirectional_mask=None",
    "0.2.5": "inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, out_sharding=None, *, "
    "model_mode='train', deterministic=False, previous_chunk=None, slot=None, bidirectional_mask=None, "
    "rope_kwargs=None, kv_cache=None, attention_metadata=None, shared_key=None, shared_value=None",
}
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


FAKE_MODULE = "maxtext_compat_bench_fakes"
# Each fake row's ratio is taken against the real module's native eager call of that release.
_ATTN = "eager overhead · Attention · old call · adapter"
_LAYER = "eager overhead · LlamaDecoderLayer · old call · adapter"
REAL_REF = {
    "fake Attention, 0.1.0 row · old call": ("maxtext-0.1.0-jax011", _ATTN),
    "fake Attention, 0.2.5 row · old call": ("maxtext-0.2.5", _ATTN),
    "fake Attention, 0.2.5 row · new call": ("maxtext-0.2.5", _ATTN),
    "fake LlamaDecoderLayer, 0.2.5 row · new call": ("maxtext-0.2.5", _LAYER),
}


def fake() -> list[dict[str, Any]]:
    from maxtext_compat import shims
    from maxtext_compat.adapters.wrapper import adapted_class
    from maxtext_compat.matrix import load_matrix
    from maxtext_compat.shims import PatchSpec, maxtext_profiles

    matrix = load_matrix()
    old, new = matrix.row("0.1.0"), matrix.row("0.2.5")
    module = types.ModuleType(FAKE_MODULE)  # patch targets are "module:Class.attr"
    sys.modules[FAKE_MODULE] = module
    module.Attention010 = fake_class("Attention010", ATTENTION_SIGS["0.1.0"], False)
    module.Attention025 = fake_class("Attention025", ATTENTION_SIGS["0.2.5"], True)
    module.Layer025 = fake_class("Layer025", LLAMA_SIG_025, True)
    # Identical twins get patched, so native calls in the same round run the unpatched class.
    module.PatchedAttention010 = fake_class("PatchedAttention010", ATTENTION_SIGS["0.1.0"], False)
    module.PatchedLayer025 = fake_class("PatchedLayer025", LLAMA_SIG_025, True)
    specs = [
        # the vllm-backport profile's own wrapper (maxtext_profiles._rule_factory), on the fake class
        PatchSpec(f"{FAKE_MODULE}:PatchedAttention010.__call__", maxtext_profiles._rule_factory("attention", old)),
        PatchSpec(f"{FAKE_MODULE}:PatchedLayer025.__call__", maxtext_profiles.DEFECT_TARGETS["scan-unroll-drops-kv"]),
    ]
    shims.register_profile("bench-fakes", lambda: specs, replace=True)
    a010, a025, l025 = module.Attention010(), module.Attention025(), module.Layer025()
    w010 = adapted_class(module.Attention010, row=old, kind="attention")()
    w025 = adapted_class(module.Attention025, row=new, kind="attention")()
    p010, pl025 = module.PatchedAttention010(), module.PatchedLayer025()
    out: list[dict[str, Any]] = []
    how = (f"pure-Python fake with the release's exact __call__ signature (returns a constant); {FAKE_ROUNDS} "
           f"rounds x {FAKE_CALLS} calls, interleaved, gc off")  # fmt: skip
    with shims.patched("bench-fakes"):
        for prefix, variants in (
            ("fake Attention, 0.1.0 row · old call", {
                "native": lambda: a010("x", "x", "pos", "seg", model_mode="train", deterministic=True),
                "adapter": lambda: w010("x", "x", "pos", "seg", model_mode="train", deterministic=True),
                "patched class (vllm-backport rule)": lambda: p010("x", "x", "pos", "seg", model_mode="train",
                                                                   deterministic=True),
            }),
            ("fake Attention, 0.2.5 row · old call", {
                "native": lambda: a025("x", "x", "pos", "seg", model_mode="train", deterministic=True),
                "adapter": lambda: w025("x", "x", "pos", "seg", model_mode="train", deterministic=True),
            }),
            ("fake Attention, 0.2.5 row · new call", {
                "native": lambda: a025("x", "x", "pos", None, model_mode="autoregressive", kv_cache="KV",
                                       attention_metadata="MD"),
                "adapter": lambda: w025("x", "x", "pos", None, model_mode="autoregressive", kv_cache="KV",
                                        attention_metadata="MD"),
            }),
            ("fake LlamaDecoderLayer, 0.2.5 row · new call", {
                "native": lambda: l025("x", None, "pos", True, "autoregressive", kv_cache="KV",
                                       attention_metadata="MD"),
                "patched class (known-defects)": lambda: pl025("x", None, "pos", True, "autoregressive",
                                                               kv_cache="KV", attention_metadata="MD"),
            }),
        ):  # fmt: skip
            env, figure = REAL_REF[prefix]
            ref = {"env": env, "figure": figure, "overhead": True}
            out += rows_for(prefix, measure(variants, FAKE_ROUNDS, FAKE_CALLS), how, ref)
    return out


def run() -> list[dict[str, Any]]:
    run_all.cpu_env()
    from maxtext_compat.probes import detect_import_root

    return real() if detect_import_root() is not None else fake()


if __name__ == "__main__":
    run_all.emit(run())
