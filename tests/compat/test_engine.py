"""The paged decode engine: ragged prefill + greedy decode vs the dense old call, buckets, forcing, typed errors.

Gemma 3 (two local sliding-window layers, window 16) is the model here: its prompts (21, 14
and 5 tokens) plus 8 decode steps run past the window, so the paged path must apply it the way
MaxText's dense attention does. Measured: max |Δ logits| 2e-6, greedy tokens identical, in
both the backport (0.1.0) and the native (0.2.5) environment. One compiled step serves the
prefill and every decode (shared 48-row bucket); a separate decode bucket compiles once more.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytestmark = pytest.mark.envs("maxtext-0.1.0-jax011", "maxtext-0.2.1", "maxtext-0.2.5")
NO_KERNEL_TOO = pytest.mark.envs("maxtext-0.1.0", "maxtext-0.1.0-jax011", "maxtext-0.2.5")  # fails before the kernel

jax = pytest.importorskip("jax")

from helpers import crossrun as cr  # noqa: E402
from maxtext_compat.decode import (  # noqa: E402
    Buckets,
    PagedEngine,
    compare,
    dense_greedy,
    format_table,
)
from maxtext_compat.errors import CacheCapacityError, InvalidArgumentError, InvalidArgumentTypeError  # noqa: E402
from maxtext_compat.paged import PageAllocator  # noqa: E402
from maxtext_compat.testing import tiny  # noqa: E402

ROW = tiny.installed_row()
NATIVE = ROW.has_kv_params
_rng = np.random.default_rng(1)
PROMPTS = tuple(tuple(int(t) for t in _rng.integers(0, 256, n)) for n in (21, 14, 5))
STEPS = 8
BUCKETS = Buckets(max_num_tokens=48, max_num_seqs=4, pages_per_seq=2)
TOL = 1e-5


@pytest.fixture(scope="module")
def shim():
    from maxtext_compat.cpu import rpa as cpu_rpa

    status = cpu_rpa.install()
    assert status.active, status.reason


@pytest.fixture(scope="module")
def models():
    """(paged-path model, dense model) of tiny Gemma 3 with the same weights."""
    spec = cr.RunSpec("gemma3", PROMPTS, STEPS)
    return cr.build(spec)


@pytest.fixture(scope="module")
def engine(shim, models):
    return PagedEngine(models[0], num_pages=16, page_size=16, buckets=BUCKETS)


@pytest.fixture(scope="module")
def greedy(engine, models):
    return engine.generate(PROMPTS, STEPS), dense_greedy(models[1], PROMPTS, STEPS)


def test_gemma3_sliding_window_paged_equals_dense(greedy):
    paged, dense = greedy
    rows = compare(paged, dense)
    print("\n" + format_table(rows))
    assert all(r.tokens_match for r in rows)
    assert max(r.max_abs_logits_diff for r in rows) <= TOL
    assert [len(t) for t in paged.tokens()] == [STEPS + 1] * len(PROMPTS)
    assert [s.logits[0].shape for s in paged.steps[:2]] == [(21, 256), (1, 256)]  # prefill rows, then one per step
    assert paged.kv_len(0) == 21 + STEPS and max(len(p) for p in paged.pages) == 2  # decode crossed into page 2
    table = format_table(rows)
    assert table.count("\n") == len(PROMPTS) + 1 and "| yes |" in table


def test_one_compile_per_bucket(engine, greedy):
    """Prefill and decode share the 48-row bucket: one compile; a rerun compiles nothing and repeats the numbers."""
    first, _ = greedy
    assert first.compiles == 1 and first.compile_seconds > 0
    again = engine.generate(PROMPTS, STEPS)
    assert again.compiles == 0 and again.compile_seconds == 0.0
    assert again.tokens() == first.tokens()
    for a, b in zip(first.steps, again.steps, strict=True):
        for x, y in zip(a.logits, b.logits, strict=True):
            np.testing.assert_array_equal(x, y)
    assert 0 < again.ms_per_step("decode") < 60_000 and again.ms_per_step("prefill") > 0


def test_separate_decode_bucket_compiles_once_more(shim, models, greedy):
    eng = PagedEngine(models[0], num_pages=16, page_size=16, buckets=dataclasses.replace(BUCKETS, decode_tokens=8))
    run = eng.generate(PROMPTS, 2)
    assert run.compiles == 2  # the prefill shape and the decode shape, each once
    assert run.tokens() == [t[:3] for t in greedy[0].tokens()]


def test_teacher_forcing_feeds_the_given_tokens(engine, models, greedy):
    """Both paths fed the same (non-greedy) tokens agree, and differ from the greedy run after step 1."""
    force = [[(t + 7) % 256 for t in row[1:]] for row in greedy[0].tokens()]
    paged = engine.generate(PROMPTS, STEPS, force=force)
    dense = dense_greedy(models[1], PROMPTS, STEPS, force=force)
    assert max(r.max_abs_logits_diff for r in compare(paged, dense)) <= TOL
    np.testing.assert_array_equal(paged.steps[0].logits[0], greedy[0].steps[0].logits[0])  # same prefill
    assert not np.allclose(paged.steps[2].logits[0], greedy[0].steps[2].logits[0])


def test_a_chunked_prefill_equals_one_prefill_call(engine, greedy):
    """Prompts fed 8 tokens per call (later chunks attend to the cached earlier ones; the calls are aligned so every
    prompt ends in the last) give the one-call prefill's logits and tokens; only the last call is a recorded step."""
    from maxtext_compat.decode.paged import prefill_rounds

    assert prefill_rounds([21, 14, 5], 8) == [[(0, 5)], [(0, 8), (1, 6)], [(0, 8), (1, 8), (2, 5)]]
    assert prefill_rounds([21, 14, 5], None) == [[(0, 21), (1, 14), (2, 5)]]
    chunked = engine.generate(PROMPTS, STEPS, prefill_chunk=8)
    assert [s.kind for s in chunked.steps].count("prefill") == 1 and chunked.tokens() == greedy[0].tokens()
    for ours, whole in zip(chunked.steps, greedy[0].steps, strict=True):  # the prefill: the last chunk's rows
        for a, b in zip(ours.logits, whole.logits, strict=True):
            np.testing.assert_allclose(a, b[len(b) - len(a) :], rtol=0, atol=TOL)
    with pytest.raises(InvalidArgumentError) as err:
        engine.generate(PROMPTS, 1, prefill_chunk=0)
    assert err.value.argument == "prefill_chunk"


def test_allocator_pages_are_used_and_freed(engine):
    alloc = PageAllocator(16, 16, seed=3)  # shuffled free list: pages are not contiguous
    run = engine.generate(PROMPTS[:2], 1, allocator=alloc)
    assert alloc.num_free == 16 and alloc.requests() == []
    assert sorted(p for pages in run.pages for p in pages) != list(range(sum(len(p) for p in run.pages)))


# ----------------------------------------------------------------------------------------------
# Typed errors (no kernel runs: they fail before anything is traced)
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def light_model():
    """A default-family model of the paged kind (vllm config on 0.2.x)."""
    cfg = tiny.tiny_config("default", vllm=NATIVE)
    mesh = cr.native_mesh(cfg, 1) if NATIVE else tiny.tiny_mesh(cfg)
    return tiny.tiny_transformer(cfg, mesh, model_mode="autoregressive" if NATIVE else None)


@NO_KERNEL_TOO
def test_bad_prompts_and_buckets_raise_typed_errors(light_model):
    eng = PagedEngine(light_model, num_pages=4, page_size=16, buckets=Buckets(8, 2, 1))
    with pytest.raises(InvalidArgumentError, match="no prompts"):
        eng.generate([], 1)
    with pytest.raises(InvalidArgumentError, match="at least one token"):
        eng.generate([[1, 2], []], 1)
    with pytest.raises(InvalidArgumentError, match="vocabulary") as err:
        eng.generate([[1, 256]], 1)
    assert err.value.argument == "prompts[0]"
    with pytest.raises(InvalidArgumentTypeError):
        eng.generate("hello", 1)
    with pytest.raises(CacheCapacityError, match="padded token capacity"):
        eng.generate([[1] * 9], 1)
    with pytest.raises(CacheCapacityError, match="more sequences") as err:
        eng.generate([[1], [2], [3]], 1)
    assert err.value.argument == "max_num_seqs/decode_tokens"
    with pytest.raises(CacheCapacityError, match="block-table row"):
        eng.generate([[1] * 8], 9)  # 17 tokens > 1 page of 16
    with pytest.raises(CacheCapacityError, match="free pages"):
        PagedEngine(light_model, num_pages=1, page_size=16, buckets=Buckets(32, 2, 1)).generate([[1] * 8, [2] * 8], 1)
    with pytest.raises(InvalidArgumentError, match="force"):
        eng.generate([[1, 2]], 2, force=[[3]])
    with pytest.raises(InvalidArgumentError, match=r"max_num_tokens.*Expected: an int >= 1.*Found: 0"):
        Buckets(0, 1, 1)


@NO_KERNEL_TOO
def test_models_the_engine_cannot_drive_raise_typed_errors(light_model):
    cfg = tiny.tiny_config("default", scan_layers=True, vllm=NATIVE)
    mesh = cr.native_mesh(cfg, 1) if NATIVE else tiny.tiny_mesh(cfg)
    scanned = tiny.tiny_transformer(cfg, mesh, model_mode="autoregressive" if NATIVE else None)
    with pytest.raises(InvalidArgumentError, match="unscanned") as err:
        PagedEngine(scanned)
    assert "unscan_params" in err.value.fix
    attn_cfg = tiny.tiny_config("default")
    attn = tiny.tiny_attention(attn_cfg, tiny.tiny_mesh(attn_cfg))
    with pytest.raises(InvalidArgumentTypeError, match="whole Transformer"):
        PagedEngine(attn)
    if NATIVE:
        base = tiny.tiny_config("default")
        with pytest.raises(InvalidArgumentError, match="vllm_rpa"):
            PagedEngine(tiny.tiny_transformer(base, tiny.tiny_mesh(base)))
        with pytest.raises(InvalidArgumentError, match="dense reference") as err:
            dense_greedy(light_model, [[1, 2]], 1)
        assert "dense_twin" in err.value.fix


@NO_KERNEL_TOO
def test_dense_greedy_is_deterministic_and_checks_its_arguments(light_model):
    model = tiny.dense_twin(light_model, tiny.tiny_config("default")) if NATIVE else light_model
    a = dense_greedy(model, [[5, 6, 7], [8]], 3)
    b = dense_greedy(model, [[5, 6, 7], [8]], 3, seq_len=16)
    assert a.tokens() == b.tokens() and a.path == "dense" and len(a.steps) == 4
    assert a.steps[0].logits[0].shape == (3, 256) and a.steps[1].logits[1].shape == (1, 256)
    with pytest.raises(InvalidArgumentError, match="seq_len"):
        dense_greedy(model, [[5, 6, 7]], 3, seq_len=4)
    with pytest.raises(InvalidArgumentError, match="differ in prompts"):
        compare(a, dense_greedy(model, [[5, 6]], 3))


def test_a_compile_inside_a_callback_is_not_the_step_recompiling():
    """Found on jax 0.9.2: the Pallas interpreter compiles helpers inside its callbacks the first time the
    process meets a shape, and counting every compile event in the process reported a cached step as
    compiled (2 compiles where the bucket gives 1, depending on which test ran first)."""
    import jax
    import jax.numpy as jnp

    from maxtext_compat.decode.timing import TraceCountingJit, compile_events, timed_call

    fresh = iter(range(1, 100))

    def helper(x):  # a new shape each call: a new compile each call, inside the callback
        return np.asarray(jax.jit(lambda y: y * 2)(jnp.ones(next(fresh))).sum() * 0 + x, np.float32)

    step = TraceCountingJit(lambda x: jax.pure_callback(helper, jax.ShapeDtypeStruct((), jnp.float32), x) + 1)
    x = jnp.float32(1.0)
    _, _, first = timed_call(step, x)
    before = compile_events()
    out, _, again = timed_call(step, x)
    assert compile_events() > before  # the callback did compile something
    assert first > 0 and again == 0.0 and float(out) == 2.0
    committed = jax.device_put(x, jax.devices()[0])  # another jit cache entry, the same trace: no compile
    assert timed_call(step, committed)[2] == 0.0 and step.traces == 1
