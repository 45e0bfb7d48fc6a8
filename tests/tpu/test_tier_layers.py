"""MaxText 0.2.3's Attention, a decoder layer (llama2) and the Transformer on the chip, called natively and through
the layer: the old call (train mode) and the new call (one ragged prefill of two sequences through the paged KV
cache and the compiled RPA kernel), each through `wrap()` (adapters) and through the shims in MaxText's own classes
(`shims.install(convention=...)`: the call rule + the release's known-defects profile). Every route's outputs and
KV caches equal the native call's element for element on the same device, and its lowered program has the native
call's op counts per op name (tests/helpers/hlo.py, as tests/compat/test_backport_numerics.py on CPU). The
traced KV-write check (on by default) adds host callbacks and nothing else; with it off the programs are
identical. On the TPU the new call's program holds Mosaic's custom call (the compiled kernel), in the dry run the
interpreted kernel."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import numpy as np
import pytest

pytestmark = pytest.mark.tpu

KINDS = ("attention", "decoder_layer", "transformer")
TOKENS = 40  # padded token rows of the new call's step: two ragged prefills of 20 and 13 tokens
MODE = "autoregressive"


@dataclass
class Case:
    module: Any
    call: Callable[..., Any]
    args: tuple[Any, ...]
    context: Callable[[], contextlib.AbstractContextManager[Any]]


def _old(kind: str) -> Case:
    from flax import nnx

    from maxtext_compat.testing import tiny

    cfg = tiny.tiny_config("default")
    mesh = tiny.tiny_mesh(cfg)
    inp = tiny.tiny_inputs(cfg)
    x, tok, pos, seg = inp["x"], inp["tokens"], inp["positions"], inp["segment_ids"]
    ctx = lambda: tiny.mesh_context(cfg, mesh)  # noqa: E731
    with ctx():
        if kind == "attention":
            return Case(
                tiny.tiny_attention(cfg, mesh),
                lambda m, x, p, s: m(x, x, p, s, model_mode="train", deterministic=True),
                (x, pos, seg),
                ctx,
            )
        if kind == "decoder_layer":
            cls = tiny.installed_row().decoder_layers["llama2"].load()
            layer = cls(config=cfg, model_mode="train", mesh=mesh, rngs=nnx.Rngs(params=0, dropout=1), quant=None)
            return Case(layer, lambda m, x, s, p: m(x, s, p, True, "train"), (x, seg, pos), ctx)
        return Case(
            tiny.tiny_transformer(cfg, mesh),
            lambda m, t, p, s: m(t, p, decoder_segment_ids=s, enable_dropout=False),
            (tok, pos, seg),
            ctx,
        )


def _new(kind: str) -> Case:
    import jax.numpy as jnp
    from flax import nnx

    from helpers import crossrun
    from maxtext_compat import paged
    from maxtext_compat.testing import tiny

    cfg = tiny.tiny_config("default", vllm=True)
    mesh = crossrun.native_mesh(cfg, 1)
    layout = paged.KVCacheLayout(8, 16, cfg.num_kv_heads, cfg.head_dim, "float32")
    alloc = paged.PageAllocator(8, 16)
    md = paged.build_metadata([alloc.append("a", 20), alloc.append("b", 13)], layout, max_num_tokens=TOKENS,
                              max_num_seqs=4, pages_per_seq=2)  # fmt: skip
    am = md.to_attention_metadata()
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((TOKENS, 1, cfg.emb_dim)).astype(np.float32))
    tok = jnp.asarray(rng.integers(0, cfg.vocab_size, (TOKENS, 1)).astype(np.int32))
    pos = jnp.asarray(np.asarray(md.input_positions, np.int32))[:, None]
    ctx = lambda: tiny.mesh_context(cfg, mesh)  # noqa: E731
    with ctx():
        if kind == "attention":
            attn = tiny.tiny_attention(cfg, mesh, model_mode=MODE, batch=TOKENS, seq=1)
            return Case(
                attn,
                lambda m, x, p, kv, md: m(
                    x, x, p, None, model_mode=MODE, deterministic=True, kv_cache=kv, attention_metadata=md
                ),
                (x, pos, layout.allocate(1)[0], am),
                ctx,
            )
        if kind == "decoder_layer":
            cls = tiny.installed_row().decoder_layers["llama2"].load()
            layer = cls(config=cfg, model_mode=MODE, mesh=mesh, rngs=nnx.Rngs(params=0, dropout=1), quant=None)
            return Case(
                layer,
                lambda m, x, p, kv, md: m(x, None, p, True, MODE, kv_cache=kv, attention_metadata=md),
                (x, pos, layout.allocate(1)[0], am),
                ctx,
            )
        model = tiny.tiny_transformer(cfg, mesh, model_mode=MODE)
        return Case(
            model,
            lambda m, t, p, kvs, md: m(t, p, kv_caches=kvs, attention_metadata=md, model_mode=MODE),
            (tok, pos, layout.allocate(cfg.num_decoder_layers), am),
            ctx,
        )


@dataclass
class Run:
    out: Any  # the call's result, on the host
    text: str  # the lowered program (StableHLO)


def _run(case: Case, module: Any, *, execute: bool = True) -> Run:
    """Lower (and unless `execute` is False, compile and run) `case.call(module, *args)` jitted with the module's
    state as an input."""
    import jax
    from flax import nnx

    graphdef, state = nnx.split(module)

    def jitted(state: Any, *inner: Any) -> Any:
        return case.call(nnx.merge(graphdef, state), *inner)

    with case.context():
        lowered = jax.jit(jitted).lower(state, *case.args)
        out = lowered.compile()(state, *case.args) if execute else None
    return Run(jax.tree.map(np.asarray, out), lowered.as_text())


@contextlib.contextmanager
def _shims(convention: str) -> Iterator[None]:
    """What a user of MaxText's own classes installs: the release's default profile with the caller convention
    (`legacy` for old code, `kv_return` for new), the call rule into Attention, the layers and the Transformer."""
    from maxtext_compat import shims
    from maxtext_compat.convention import callers

    before = shims.active_profiles()
    shims.install(convention=convention)
    try:
        assert "call-rule" in shims.active_profiles(), shims.active_profiles()
        yield
    finally:
        for name in reversed(shims.active_profiles()):
            if name not in before:
                shims.uninstall(name)
        callers.set_caller_convention(None)


def _leaves(tree: Any) -> list[np.ndarray]:
    import jax

    return [np.asarray(a) for a in jax.tree.leaves(tree)]


def _assert_equal(ours: Any, native: Any, what: str) -> None:
    a, b = _leaves(ours), _leaves(native)
    assert len(a) == len(b), f"{what}: {len(a)} arrays vs the native call's {len(b)}"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.shape == y.shape, f"{what}[{i}]: shape {x.shape} vs native {y.shape}"
        np.testing.assert_array_equal(x, y, err_msg=f"{what}[{i}] differs from the native call")  # bit for bit


def _counts(run: Run) -> Any:
    from helpers import hlo

    return hlo.count_ops_in_text(run.text)


def _old_return(native: Any) -> Any:
    """The old call's result on 0.2.3: Attention and the layers return (out, None) natively; the old shape is out."""
    if isinstance(native, tuple):
        assert native[1] is None, "an old (train-mode) call returned a KV cache"
        return native[0]
    return native


@pytest.mark.parametrize("route", ["adapter", "shim"])
@pytest.mark.parametrize("kind", KINDS)
def test_old_call_equals_the_native_call(tier, kind, route):
    from maxtext_compat.adapters import wrap

    case = _old(kind)
    native = _run(case, case.module)
    if route == "adapter":
        ours = _run(case, wrap(case.module))
    else:
        with _shims("legacy"):
            ours = _run(case, case.module)
    assert not isinstance(ours.out, tuple), f"{route}: an old caller got {type(ours.out).__name__}, not the old shape"
    _assert_equal(ours.out, _old_return(native.out), f"{kind} old call via {route}")
    diff = _counts(ours).diff(_counts(native))
    print(f"\n[tier] {kind} old call via {route}: {_counts(ours).total} ops, native {_counts(native).total}")
    assert not diff, f"{kind} old call via {route}: op counts differ from the native call's: {diff}"


# The ops one jax.debug.callback adds to a lowered program, per platform (a GPU's: jax's custom call, not yet
# measured on one).
HOST_CALLBACK_OPS = {
    "cpu": {"stablehlo.custom_call"},
    "gpu": {"stablehlo.custom_call"},
    "tpu": {"stablehlo.send", "stablehlo.recv", "stablehlo.create_token"},
}


@pytest.mark.parametrize("route", ["adapter", "shim"])
@pytest.mark.parametrize("kind", KINDS)
def test_new_call_equals_the_native_call(tier, kind, route):
    """With the traced KV-write check on: outputs and caches equal to the native call's, host callbacks added to
    the native program and nothing else. Lowered with the check off: the native program, op for op. As users run it
    (the setting unset): the check's default for this platform, on on a CPU, off on an accelerator (guard.py)."""
    from maxtext_compat.adapters import wrap
    from maxtext_compat.paged import guard

    case = _new(kind)
    native = _run(case, case.module)
    assert isinstance(native.out, tuple) and native.out[1] is not None, "the native new call returned no KV cache"
    if tier.tpu:
        assert "tpu_custom_call" in native.text, "the native new call did not lower the RPA kernel to Mosaic"
    routed = (lambda: wrap(case.module)) if route == "adapter" else (lambda: case.module)
    with _shims("kv_return") if route == "shim" else contextlib.nullcontext():
        with mock.patch.dict(os.environ, {guard.TRACED_CHECKS_ENV: "1"}):
            checked = _run(case, routed())
        with mock.patch.dict(os.environ, {guard.TRACED_CHECKS_ENV: "0"}):
            ours = _run(case, routed(), execute=False)
        with mock.patch.dict(os.environ):
            os.environ.pop(guard.TRACED_CHECKS_ENV, None)
            default = _run(case, routed(), execute=False)
    _assert_equal(checked.out, native.out, f"{kind} new call via {route}")
    extra = _counts(checked).diff(_counts(native))
    # the check's host callbacks (one per checked module: the shims check MaxText's inner classes too), nothing else;
    # a host callback lowers to a custom call on a CPU and to send/recv over a token on a TPU (measured on a v5e)
    callback_ops = HOST_CALLBACK_OPS[tier.platform]
    assert set(extra) <= {"sdy.mesh", *callback_ops} and callback_ops & set(extra), extra
    diff = _counts(ours).diff(_counts(native))
    print(
        f"\n[tier] {kind} new call via {route}: {_counts(ours).total} ops (check off), native {_counts(native).total}"
    )
    assert not diff, f"{kind} new call via {route}: op counts differ from the native call's: {diff}"
    expected = checked if tier.platform == "cpu" else ours  # the default: on on a CPU, off on an accelerator
    assert not _counts(default).diff(_counts(expected)), _counts(default).diff(_counts(expected))
