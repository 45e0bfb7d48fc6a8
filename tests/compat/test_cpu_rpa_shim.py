"""The CPU RPA shim: installs only on CPU, idempotent, recorded, reversible by identity, refuses when unsafe."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from helpers.kernel_envs import (
    REAL_KERNEL_ENVS,
    V3_KERNEL,
    installed_attention_interface,
    installed_hd64_kernel,
    installed_v3_block_size_function,
    jax_below,
)

pytestmark = pytest.mark.envs(*REAL_KERNEL_ENVS)

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from maxtext_compat import paged  # noqa: E402
from maxtext_compat.cpu import pallas_interpreter  # noqa: E402
from maxtext_compat.cpu import pallas_views as views  # noqa: E402
from maxtext_compat.cpu import rpa as cpu_rpa  # noqa: E402
from maxtext_compat.errors import KernelUnavailableError, ShimRefusedError  # noqa: E402
from maxtext_compat.kernel import rpa  # noqa: E402
from maxtext_compat.matrix import default_matrix_path  # noqa: E402
from maxtext_compat.patching.ledger import active_patches  # noqa: E402


@pytest.fixture(autouse=True)
def leave_installed():
    """Every test leaves the shim installed: later modules rely on it."""
    yield
    cpu_rpa.install()
    assert cpu_rpa.installed()


# The v3 kernel's block-size function -> the shim's method name and its stand-in.
STAND_INS = {
    "get_default_block_sizes": ("function", "cpu_block_sizes"),
    "get_tuned_block_sizes": ("tuned", "cpu_tuned_block_sizes"),
}


def _targets():
    import importlib

    from jax._src import config

    ipc = pallas_interpreter.callbacks_module()
    kernel = importlib.import_module(V3_KERNEL)
    tpu_info = cpu_rpa.tpu_info_module()
    targets = {
        "get": ipc.get,
        "store": ipc.store,
        "swap": ipc.swap,
        "block_sizes": getattr(kernel, installed_v3_block_size_function()),
        "interpret": config.pallas_tpu_interpret_mode_context_manager.get_global(),
    }
    if tpu_info is not None:
        targets["tpu_info"] = tpu_info.registry.get("cpu")
    if installed_hd64_kernel():
        targets["hd64_block_sizes"] = importlib.import_module(cpu_rpa.HD64_MODULE).get_tuned_block_sizes
    return targets


def _ours():
    return [p for p in active_patches() if p.profile == cpu_rpa.PROFILE]


def test_install_is_idempotent_and_recorded():
    first = cpu_rpa.install()
    assert cpu_rpa.install() is first and cpu_rpa.installed()
    function = installed_v3_block_size_function()
    assert first.active and first.jax_verified and first.block_sizes == STAND_INS[function][0]
    assert first.tpu_inference_version is not None
    recorded = {p.target for p in _ours()}
    assert set(first.patches) == recorded
    assert {views.target("get"), cpu_rpa.INTERPRET_TARGET, f"{V3_KERNEL}:{function}"} <= recorded
    assert (cpu_rpa.tpu_info_target() in recorded) is (cpu_rpa.tpu_info_module() is not None)
    assert all(p.origin.startswith("maxtext_compat.cpu.") for p in _ours())
    assert views.applied()


def test_uninstall_restores_every_object_by_identity():
    cpu_rpa.uninstall()
    assert not cpu_rpa.installed() and not _ours() and not views.applied()
    stock = _targets()
    assert stock.get("tpu_info") is None and stock["interpret"] is None
    st = cpu_rpa.install()
    patched = _targets()
    assert all(patched[name] is not stock[name] for name in stock)
    assert patched["block_sizes"] is getattr(cpu_rpa, STAND_INS[installed_v3_block_size_function()][1])
    assert sorted(cpu_rpa.uninstall()) == sorted(st.patches)
    after = _targets()
    assert all(after[name] is stock[name] for name in stock), {n for n in stock if after[n] is not stock[n]}
    assert not _ours()


def test_hbm_operands_are_passed_by_reference_only_where_the_interpreter_copies_them():
    """jax < 0.9 gives a kernel's HBM operands fresh NaN buffers (the RPA cache came back NaN but for the new
    tokens): there the shim makes HBM count as ANY, and takes it back; jax >= 0.9 needs nothing."""
    from jax._src.pallas.mosaic import core as mosaic_core

    cpu_rpa.uninstall()
    ipc = pallas_interpreter.pallas_call_module()
    stock_is_any = getattr(ipc, "_is_any", None)
    copies_hbm = stock_is_any is not None and not stock_is_any(mosaic_core.MemorySpace.HBM)
    assert copies_hbm is jax_below("0.9")
    st = cpu_rpa.install()
    hbm_targets = {t for t in st.patches if t.endswith((":_is_any", ":TPU_MEMORY_SPACE_IDXS[HBM]"))}
    assert len(hbm_targets) == (2 if copies_hbm else 0)
    if copies_hbm:
        assert ipc._is_any(mosaic_core.MemorySpace.HBM) and ipc._is_any(mosaic_core.MemorySpace.ANY)
        assert not ipc._is_any(mosaic_core.MemorySpace.VMEM)
    cpu_rpa.uninstall()
    assert getattr(ipc, "_is_any", None) is stock_is_any


def test_context_manager_installs_for_the_block_only():
    cpu_rpa.uninstall()
    with cpu_rpa.enabled() as st:
        assert st.active and cpu_rpa.installed()
    assert not cpu_rpa.installed()
    cpu_rpa.install()
    with cpu_rpa.enabled():
        pass
    assert cpu_rpa.installed()  # it was on before the block: left on


def test_unverified_jax_is_refused_unless_forced(tmp_path, monkeypatch):
    text = Path(default_matrix_path()).read_text(encoding="utf-8")
    patched, n = re.subn(r"(?m)^(\s+verified_jax:).*$", r'\1 ["0.0.1"]', text)
    assert n == 1
    copy = tmp_path / "compat_matrix.yaml"
    copy.write_text(patched, encoding="utf-8")
    cpu_rpa.uninstall()
    monkeypatch.setenv("MAXTEXT_COMPAT_MATRIX", str(copy))
    with pytest.raises(ShimRefusedError) as info:
        cpu_rpa.install()
    assert info.value.argument == "jax" and info.value.found == jax.__version__
    assert "force=True" in info.value.fix and not cpu_rpa.installed() and not _ours()
    st = cpu_rpa.install(force=True)
    assert st.active and not st.jax_verified and "unverified" in st.reason
    cpu_rpa.uninstall()


def test_other_backends_are_left_alone(monkeypatch):
    cpu_rpa.uninstall()
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    st = cpu_rpa.install()
    assert not st.active and "nothing patched" in st.reason
    assert not cpu_rpa.installed() and not _ours() and not views.applied()


def test_applied_late_is_refused_then_fixed_with_clear_caches(caplog):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    cpu_rpa.uninstall()

    def add_one(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    with pltpu.force_tpu_interpret_mode(pltpu.InterpretParams()):  # stock interpreter, no shim
        out = pl.pallas_call(add_one, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(jnp.zeros((8, 128)))
    assert float(out[0, 0]) == 1.0
    with pytest.raises(ShimRefusedError, match="applied after") as info:
        cpu_rpa.install()
    assert "already ran" in str(info.value.found) and "clear_caches=True" in info.value.fix
    assert not cpu_rpa.installed()
    with caplog.at_level(logging.WARNING, logger=cpu_rpa.__name__):
        st = cpu_rpa.install(clear_caches=True)
    assert st.active and "clearing jax caches" in caplog.text
    assert cpu_rpa.late_reasons() == []


def test_reinstall_after_our_own_runs_is_not_late():
    cpu_rpa.uninstall()
    assert cpu_rpa.late_reasons() == []
    cpu_rpa.install()


def test_dispatcher_refuses_on_cpu_without_the_shim():
    layout = paged.KVCacheLayout(4, 16, 1, 128, "float32")
    md = paged.build_metadata([paged.SequenceSlice(1, 3, (2,))], layout, max_num_tokens=8)
    q = jnp.zeros((8, 2, 128))
    k = jnp.zeros((8, 1, 128))
    cpu_rpa.uninstall()
    with pytest.raises(KernelUnavailableError, match="CPU shim") as info:
        rpa.ragged_paged_attention(q, k, k, jnp.zeros(layout.shape), md, mesh=paged.make_mesh(1))
    assert "maxtext_compat.cpu.rpa.install()" in info.value.fix


@pytest.mark.parametrize(("page_size", "tokens", "pages_per_seq"), [(16, 32, 4), (8, 1, 1), (32, 256, 16), (16, 7, 2)])
def test_cpu_block_sizes_satisfy_the_kernel(page_size, tokens, pages_per_seq):
    import importlib
    from types import SimpleNamespace

    kernel = importlib.import_module(V3_KERNEL)
    # the installed kernel's own cases where it has them (0.18 on); the same three names before
    cases = getattr(kernel, "RpaCase", [SimpleNamespace(name=n) for n in ("DECODE", "PREFILL", "MIXED")])
    for case in cases:
        b = cpu_rpa.cpu_block_sizes("f", "f", 4, 2, 128, page_size, tokens, 4, pages_per_seq, case=case)
        assert b["bkv_sz"] % page_size == 0 and b["bkv_csz"] % page_size == 0
        assert b["bkv_sz"] % b["bkv_csz"] == 0 and b["bq_sz"] % b["bq_csz"] == 0
    pages, bq = cpu_rpa.cpu_tuned_block_sizes("f", "f", 4, 2, 64, page_size, tokens, pages_per_seq)
    assert 1 <= pages <= pages_per_seq and 1 <= bq <= tokens


def test_env_block_sizes_route(monkeypatch):
    """Rows with only `block_sizes: [env]`: RPA_V3_*_BLOCK_SIZES, which tpu-inference >= 0.30 forwards. Before
    0.30 nothing reads them: the shim sizes blocks through the function even when they are set."""
    import os

    import numpy as np

    from helpers.reference_attention import make_ragged_step, reference_ragged_attention

    for var in cpu_rpa.ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    cpu_rpa.uninstall()
    if not _kernel_reads_block_size_env():  # tpu-inference < 0.30: the variables would be ignored
        for var in cpu_rpa.ENV_VARS:
            monkeypatch.setenv(var, "not,sizes")  # ignored by the kernel, so they must not steer the shim either
        st = cpu_rpa.install()
        function = installed_v3_block_size_function()
        assert st.block_sizes == STAND_INS[function][0] and f"{V3_KERNEL}:{function}" in st.patches
    else:
        monkeypatch.setattr(cpu_rpa, "_block_size_methods", lambda force: ("0.32.0", ("env",)))
        st = cpu_rpa.install()
        assert st.block_sizes == "env" and os.environ["RPA_V3_MIXED_BLOCK_SIZES"] == cpu_rpa.ENV_BLOCK_SIZES["MIXED"]
    layout = paged.KVCacheLayout(8, 16, 1, 128, "float32")
    step = make_ragged_step(layout, [(6, 20), (1, 9)], num_q_heads=2, max_num_tokens=8, seed=4)
    mesh = paged.make_mesh(1)
    out, cache = rpa.ragged_paged_attention(
        step.q, step.k, step.v, step.kv_cache, step.metadata, mesh=mesh, sm_scale=0.5
    )
    ref = reference_ragged_attention(step.q, step.k, step.v, step.kv_cache, step.metadata, layout, sm_scale=0.5)
    n = step.metadata.num_tokens
    assert np.abs(np.asarray(out[:n]) - ref.out).max() <= 1e-5
    np.testing.assert_array_equal(np.asarray(cache), ref.kv_cache)
    cpu_rpa.uninstall()
    if st.block_sizes == "env":
        assert not any(os.environ.get(v) for v in cpu_rpa.ENV_VARS)


def _kernel_reads_block_size_env():
    """Whether the installed tpu-inference's entry point (attention_interface, which MaxText and the dispatcher
    call) reads RPA_V3_*_BLOCK_SIZES: from 0.30 on. 0.26-0.29 read them only in their own JAX models."""
    import inspect

    return "RPA_V3_" in inspect.getsource(installed_attention_interface())


def test_interpret_mode_is_global_and_forced():
    from jax._src import config

    cfg = config.pallas_tpu_interpret_mode_context_manager
    assert cfg.get_global() is not None and cfg.get_global().uninitialized_memory == "nan"
    with cpu_rpa.interpret_mode():
        assert cfg.value is not None


def test_a_servers_cpu_mesh_is_refused_where_the_interpreter_loses_tp_writes(monkeypatch):
    """vLLM calls the kernel past the dispatcher: the CPU serving shim's mesh carries the same refusal."""
    import importlib

    from maxtext_compat.cpu import serving as cpu_serving

    utils = importlib.import_module("tpu_inference.utils")
    monkeypatch.setenv("MAXTEXT_COMPAT_RPA_KERNEL", "pallas")  # the real kernel, interpreted
    assert not cpu_serving.installed()
    cpu_serving.install(parts=("mesh", "rpa"))
    try:
        assert utils.make_optimized_mesh((2, 1), ("data", "model"), devices=jax.devices()[:2]).shape["data"] == 2
        if jax_below("0.9"):
            with pytest.raises(KernelUnavailableError, match=r"\[mesh\].*loses KV cache writes") as e:
                utils.make_optimized_mesh((1, 2), ("data", "model"), devices=jax.devices()[:2])
            assert e.value.fix == "use tensor parallelism 1, or jax >= 0.9"
        else:
            assert utils.make_optimized_mesh((1, 2), ("data", "model"), devices=jax.devices()[:2]).shape["model"] == 2
    finally:
        cpu_serving.uninstall()
