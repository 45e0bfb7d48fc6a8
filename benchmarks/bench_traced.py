"""Traced cost: HLO ops of the jitted adapter and of the patched class vs the jitted native MaxText call.

    MAXTEXT_COMPAT_ENV=maxtext-0.2.5 .envs/maxtext-0.2.5/bin/python benchmarks/bench_traced.py

Why op counts: an adapter (or a shim-patched class) that only translates arguments and picks
return values must trace to the program the native call traces to; equal counts of lowered
StableHLO ops, per op name (`testing.hlo`), show it without compiling or timing anything.
Attention, one decoder layer (llama2) and the whole Transformer; old call on every release,
new call (kv_cache + attention_metadata) natively on 0.2.5 and through the backport on 0.1.0,
where no native new call exists: those rows are compared with 0.2.5's native new call, which
is another release's code (equality is not expected there).
Patched: `known-defects` (0.2.5) or `vllm-backport` (0.1.0) installed, the module called the
native way; counted against the native count taken before the install.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import run_all

KINDS = ("Attention", "decoder layer", "Transformer")
NEW_REF_ENV = "maxtext-0.2.5"
MODE = "autoregressive"
TOKENS = 40  # padded token rows of the new-call step (two ragged prefills: 20 + 13 tokens)

Counter = Callable[[Any], Any]  # module (native or adapted) -> hlo.HloOpCount


def _linen_call(module: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a Linen layer as MaxText's Decoder does (`layer(...)`), the path every MaxText-internal call takes."""
    return module(*args, **kwargs)


def _old_cases(tiny: Any, row: Any) -> dict[str, tuple[Any, Counter]]:
    """kind -> (native module, count(module)) for the old call, train mode (as tests/compat do)."""
    import jax
    from flax import nnx

    from helpers import hlo

    cfg = tiny.tiny_config("default")
    mesh = tiny.tiny_mesh(cfg)
    inp = tiny.tiny_inputs(cfg)
    x, tok, pos, seg = inp["x"], inp["tokens"], inp["positions"], inp["segment_ids"]
    layer_cls = row.decoder_layers["llama2"].load()
    ctx = lambda: tiny.mesh_context(cfg, mesh)  # noqa: E731
    with ctx():
        attn = tiny.tiny_attention(cfg, mesh)
        model = tiny.tiny_transformer(cfg, mesh)

    def attention(m: Any) -> Any:
        with ctx():
            return hlo.count_module_ops(m, lambda m, x, p, s: m(x, x, p, s, model_mode="train", deterministic=True),
                                        x, pos, seg)  # fmt: skip

    def transformer(m: Any) -> Any:
        with ctx():
            return hlo.count_module_ops(m, lambda m, t, p, s: m(t, p, decoder_segment_ids=s, enable_dropout=False),
                                        tok, pos, seg)  # fmt: skip

    if issubclass(layer_cls, nnx.Module):
        with ctx():
            layer = layer_cls(config=cfg, model_mode="train", mesh=mesh, rngs=nnx.Rngs(params=0, dropout=1), quant=None)

        def decoder_layer(m: Any) -> Any:
            with ctx():
                return hlo.count_module_ops(m, lambda m, x, s, p: m(x, s, p, True, "train"), x, seg, pos)
    else:  # a Linen layer (0.1.0): count `apply` of the (adapted) class with the same variables
        layer = layer_cls
        kw = {"config": cfg, "mesh": mesh, "name": "layers_0", "quant": None, "model_mode": "train"}
        with ctx():
            variables = jax.eval_shape(
                lambda k: layer_cls(**kw).init({"params": k, "dropout": k, "aqt": k}, x, seg, pos, True, "train"),
                jax.random.PRNGKey(0),
            )

        def decoder_layer(cls: Any) -> Any:
            with ctx():
                return hlo.count_jit_ops(lambda v, *a: cls(**kw).apply(v, *a, True, "train", method=_linen_call),
                                         variables, x, seg, pos)  # fmt: skip

    return {
        "Attention": (attn, attention),
        "decoder layer": (layer, decoder_layer),
        "Transformer": (model, transformer),
    }


def _new_cases(tiny: Any, row: Any) -> dict[str, tuple[Any, Counter]]:
    """kind -> (module, count(module)) for the new call: one ragged step through the paged KV cache."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from helpers import crossrun, hlo
    from maxtext_compat import paged

    native = row.has_kv_params
    cfg = tiny.tiny_config("default", vllm=native)
    mesh = crossrun.native_mesh(cfg, 1) if native else tiny.tiny_mesh(cfg)
    layout = paged.KVCacheLayout(8, 16, cfg.num_kv_heads, cfg.head_dim, "float32")
    alloc = paged.PageAllocator(8, 16)
    md = paged.build_metadata([alloc.append("a", 20), alloc.append("b", 13)], layout, max_num_tokens=TOKENS,
                              max_num_seqs=4, pages_per_seq=2)  # fmt: skip
    am = md.to_attention_metadata()
    x = jnp.zeros((TOKENS, 1, cfg.emb_dim), jnp.float32)
    tok = jnp.zeros((TOKENS, 1), jnp.int32)
    pos = jnp.asarray(np.asarray(md.input_positions, np.int32))[:, None]
    one, all_layers = layout.allocate(1)[0], layout.allocate(cfg.num_decoder_layers)
    mode = MODE if native else None
    ctx = lambda: tiny.mesh_context(cfg, mesh)  # noqa: E731
    layer_cls = row.decoder_layers["llama2"].load()
    with ctx():
        attn = tiny.tiny_attention(cfg, mesh, model_mode=mode, batch=TOKENS, seq=1)
        model = tiny.tiny_transformer(cfg, mesh, model_mode=mode)

    def attention(m: Any) -> Any:
        with ctx():
            return hlo.count_module_ops(
                m, lambda m, x, p, kv, md: m(x, x, p, None, model_mode=MODE, deterministic=True, kv_cache=kv,
                                             attention_metadata=md), x, pos, one, am)  # fmt: skip

    def transformer(m: Any) -> Any:
        with ctx():
            return hlo.count_module_ops(
                m, lambda m, t, p, kvs, md: m(t, p, kv_caches=kvs, attention_metadata=md, model_mode=MODE),
                tok, pos, all_layers, am)  # fmt: skip

    if issubclass(layer_cls, nnx.Module):
        with ctx():
            layer = layer_cls(config=cfg, model_mode=MODE, mesh=mesh, rngs=nnx.Rngs(params=0, dropout=1), quant=None)

        def decoder_layer(m: Any) -> Any:
            with ctx():
                return hlo.count_module_ops(
                    m, lambda m, x, p, kv, md: m(x, None, p, True, MODE, kv_cache=kv, attention_metadata=md),
                    x, pos, one, am)  # fmt: skip
    else:  # Linen (0.1.0)
        layer = layer_cls
        kw = {"config": cfg, "mesh": mesh, "name": "layers_0", "quant": None, "model_mode": "train"}
        seg = jnp.ones((TOKENS, 1), jnp.int32)
        with ctx():
            variables = jax.eval_shape(
                lambda k: layer_cls(**kw).init({"params": k, "dropout": k, "aqt": k}, x, seg, pos, True, "train"),
                jax.random.PRNGKey(0),
            )

        def decoder_layer(cls: Any) -> Any:
            def call(v: Any, x: Any, p: Any, kv: Any, md: Any) -> Any:
                return cls(**kw).apply(
                    v, x, None, p, True, MODE, kv_cache=kv, attention_metadata=md, method=_linen_call
                )

            with ctx():
                return hlo.count_jit_ops(call, variables, x, pos, one, am)

    return {
        "Attention": (attn, attention),
        "decoder layer": (layer, decoder_layer),
        "Transformer": (model, transformer),
    }


def _count(counter: Counter, module: Any) -> tuple[Any, str]:
    """(HloOpCount or None, error text): a failing count becomes a row saying why, not a dead script."""
    try:
        return counter(module), ""
    except Exception as exc:
        return None, f"failed: {type(exc).__name__}: {str(exc)[:160]}"


def _same(a: Any, b: Any) -> str:
    if a is None or b is None:
        return ""
    diff = a.diff(b)
    return "identical per op name" if not diff else f"differs: {dict(list(diff.items())[:3])}"


def _total(count: Any) -> int | None:
    return None if count is None else count.total


def _row(figure: str, ours: Any, native: Any, how: str, ref: dict[str, str] | None) -> dict[str, Any]:
    return run_all.row(figure, _total(ours), "ops", how, native=_total(native), ref=ref)


def run() -> list[dict[str, Any]]:
    run_all.cpu_env()
    import importlib.util

    from maxtext_compat import shims
    from maxtext_compat.adapters import wrap
    from maxtext_compat.shims import maxtext_profiles
    from maxtext_compat.testing import tiny

    row = tiny.installed_row()
    native_new = row.has_kv_params
    kernel = importlib.util.find_spec("tpu_inference") is not None
    if kernel:
        import tpu_inference  # noqa: F401 - before MaxText (0.1.0's TensorFlow protobuf vs tpu_info's probe)

        from maxtext_compat.cpu import rpa as cpu_rpa

        cpu_rpa.install()  # the RPA kernel lowers only in interpret mode on CPU
    maxtext_profiles.register()
    profile = maxtext_profiles.choose(SimpleNamespace(maxtext=row))  # known-defects (0.2.5) / vllm-backport (0.1.0)
    rows: list[dict[str, Any]] = []
    conventions = [("old call", _old_cases(tiny, row))]
    if kernel:
        conventions.append(("new call", _new_cases(tiny, row)))
    for convention, cases in conventions:
        backport = convention == "new call" and not native_new
        for kind in KINDS:
            module, count = cases[kind]
            figure = f"traced cost · {kind} · {convention}"
            ref = {"env": NEW_REF_ENV, "figure": f"{figure} · adapter"} if backport else None
            native, err = (None, "") if backport else _count(count, module)
            ours, ours_err = _count(count, wrap(module))
            if backport:
                how = f"backport (no native new call in {row.name}) vs 0.2.5's native new call (other code)"
            else:
                how = f"wrap(module) vs module; {_same(ours, native)}"
            rows.append(_row(f"{figure} · adapter", ours, native, ours_err or err or how, ref))
            print(f"  {figure}: native {_total(native)}, adapter {_total(ours)}", file=sys.stderr, flush=True)
            if profile is None or (profile == maxtext_profiles.DEFECTS and kind == "Attention"):
                continue  # known-defects patches decoder layers only
            try:
                with shims.patched(profile):
                    patched, patched_err = _count(count, module)
            except Exception as exc:
                patched, patched_err = None, f"failed: {type(exc).__name__}: {str(exc)[:160]}"
            if backport:
                how = f"`{profile}` installed, the class called the new way; vs 0.2.5's native new call"
            else:
                how = f"`{profile}` installed vs not installed, native call; {_same(patched, native)}"
            rows.append(_row(f"{figure} · patched class", patched, native, patched_err or how, ref))
            print(f"  {figure}: patched class {_total(patched)}", file=sys.stderr, flush=True)
    return rows


if __name__ == "__main__":
    run_all.emit(run())
