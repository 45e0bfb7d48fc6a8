"""The CPU serving shim, part by part, in-process against the real tpu-inference 0.32.0 (no server).

Each runtime gap (F1, F2, F4 in cpu/serving.py, and F5 found serving a real model) is first
shown failing stock on
CPU, then working under the shim, and the originals are back (by identity) after uninstall. The
RPA part (F3) is `cpu.rpa`'s and is proven end to end in test_serving_vllm.py.
"""

from __future__ import annotations

import importlib

import pytest

pytestmark = [pytest.mark.envs("maxtext-0.2.5", "maxtext-0.1.0-jax011")]

PARTS = ("mesh", "hbm", "compiler_options")


@pytest.fixture
def tpi():
    utils = importlib.import_module("tpu_inference.utils")
    co = importlib.import_module("tpu_inference.models.common.compiler_options")
    loader = importlib.import_module("tpu_inference.models.common.model_loader")
    runner = importlib.import_module("tpu_inference.runner.tpu_runner")
    return utils, co, loader, runner


@pytest.fixture
def shim(tpi):
    from maxtext_compat.cpu import serving as cpu_serving

    assert not cpu_serving.installed(), "another test left the CPU serving shim installed"
    yield cpu_serving
    cpu_serving.uninstall()


def test_stock_tpu_inference_fails_on_cpu(tpi) -> None:
    import jax

    utils, co, _, _ = tpi
    with pytest.raises(RuntimeError, match="Expected TPU devices"):
        utils.get_device_hbm_limit()
    with pytest.raises(AttributeError):
        utils.make_optimized_mesh((1, 2), ("data", "model"), devices=jax.devices()[:2])
    options = co.get_step_fn_compiler_options()
    assert any(k.startswith("xla_tpu_") for k in options)
    with pytest.raises(Exception, match="No such compile option"):
        jax.jit(lambda x: x + 1, compiler_options=options)(1.0)


def test_shim_fills_each_gap_and_uninstall_restores_identity(tpi, shim) -> None:
    import jax

    from maxtext_compat.patching.ledger import active_patches

    utils, co, loader, runner = tpi
    originals = {
        "mesh": utils.make_optimized_mesh,
        "hbm": utils.get_device_hbm_limit,
        "step": co.get_step_fn_compiler_options,
        "runner_mesh": runner.make_optimized_mesh,
        "loader_step": loader.get_step_fn_compiler_options,
    }
    status = shim.install(parts=PARTS)
    assert status.active and status.parts == PARTS and status.skipped == ("rpa", "host_copy")

    assert utils.get_device_hbm_limit() == shim.cpu_hbm_bytes() == 2 << 30
    mesh = utils.make_optimized_mesh((1, 2), ("data", "model"), devices=jax.devices()[:2])
    assert dict(mesh.shape) == {"data": 1, "model": 2}
    # `from tpu_inference.utils import make_optimized_mesh` in the runner sees the patch too.
    assert runner.make_optimized_mesh((1, 2), ("data", "model"), devices=jax.devices()[:2]).shape == mesh.shape
    assert co.get_step_fn_compiler_options() == {} == loader.get_step_fn_compiler_options()
    assert co.get_sampling_compiler_options() == {}
    assert float(jax.jit(lambda x: x + 1, compiler_options=co.get_step_fn_compiler_options())(1.0)) == 2.0

    ours = {p.target for p in active_patches() if p.profile == shim.PROFILE}
    assert {
        "tpu_inference.utils:make_optimized_mesh",
        "tpu_inference.utils:get_device_hbm_limit",
        "tpu_inference.models.common.compiler_options:get_step_fn_compiler_options",
    } <= ours
    assert shim.install(parts=PARTS) is shim.status()  # idempotent

    shim.uninstall()
    assert utils.make_optimized_mesh is originals["mesh"]
    assert utils.get_device_hbm_limit is originals["hbm"]
    assert co.get_step_fn_compiler_options is originals["step"]
    assert runner.make_optimized_mesh is originals["runner_mesh"]
    assert loader.get_step_fn_compiler_options is originals["loader_step"]
    assert not [p for p in active_patches() if p.profile == shim.PROFILE]


def test_mesh_needs_enough_cpu_devices(tpi, shim) -> None:
    import jax

    from maxtext_compat.errors import ServingConfigError

    utils = tpi[0]
    shim.install(parts=("mesh",))
    with pytest.raises(ServingConfigError, match="xla_force_host_platform_device_count"):
        utils.make_optimized_mesh((1, len(jax.devices()) + 1), ("data", "model"))


def test_sampler_imported_before_the_shim_is_rebuilt_without_tpu_options(tpi, shim) -> None:
    sampling = importlib.import_module("tpu_inference.layers.jax.sample.sampling")
    before = sampling.sample
    shim.install(parts=("compiler_options",))
    assert sampling.sample is not before
    shim.uninstall()
    assert sampling.sample is before


def test_a_part_that_fails_to_install_takes_every_other_part_back(tpi, shim, mocker) -> None:
    """All or nothing over the whole shim: the sampler re-jit, the wrapped functions (one transaction) and the
    RPA kernel part (cpu_rpa's own profile) go together; a failure in the last leaves nothing behind."""
    from maxtext_compat.cpu import rpa as cpu_rpa
    from maxtext_compat.errors import PatchError
    from maxtext_compat.patching.ledger import active_patches

    utils, co, _, _ = tpi
    sampling = importlib.import_module("tpu_inference.layers.jax.sample.sampling")
    before = (sampling.sample, utils.make_optimized_mesh, co.get_step_fn_compiler_options)
    mocker.patch.object(cpu_rpa, "install", side_effect=PatchError("injected", argument="cpu-rpa"))
    mocker.patch.object(shim, "resolve_kernel", return_value="pallas")  # the RPA part goes through cpu_rpa
    with pytest.raises(PatchError, match="injected"):
        shim.install(parts=(*PARTS, "rpa"))
    after = (sampling.sample, utils.make_optimized_mesh, co.get_step_fn_compiler_options)
    assert all(a is b for a, b in zip(after, before, strict=True))
    assert not shim.installed() and not [p for p in active_patches() if p.profile == shim.PROFILE]


def _put_then_refill(put, tpi):
    """What a runner does: put a view of its numpy input buffer on the device, refill the buffer for the next
    step, then run the step. Returns what the step reads."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    raw = np.zeros(64 * 4 + 64, np.uint8)  # PJRT CPU aliases 64-byte-aligned buffers (the runner's are)
    offset = (-raw.ctypes.data) % 64
    buffer = raw[offset : offset + 64 * 4].view(np.int32)
    buffer[:] = np.arange(64)
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("x",)), PartitionSpec(None))
    on_device = put(buffer[:16], sharding=sharding)
    buffer[:16] += 1  # the next step's positions
    return np.asarray(on_device)


def test_stock_device_put_on_cpu_aliases_the_runners_buffer(tpi) -> None:
    """F5 stock: the step sees the *next* step's positions (PJRT CPU puts numpy arrays without copying)."""
    utils = tpi[0]
    assert (_put_then_refill(lambda x, sharding: utils.device_array(None, x, sharding=sharding), tpi)[:3]
            == [1, 2, 3]).all()  # fmt: skip


def test_host_copy_part_gives_the_device_a_private_copy(tpi, shim) -> None:
    from maxtext_compat.patching.ledger import active_patches

    utils = tpi[0]
    common = importlib.import_module("tpu_inference.layers.common.utils")
    before = common.general_device_put, utils.general_device_put
    shim.install(parts=("host_copy",))
    seen = _put_then_refill(lambda x, sharding: utils.device_array(None, x, sharding=sharding), tpi)
    assert list(seen[:3]) == [0, 1, 2]  # what was put, not what the buffer holds now
    assert shim.DEVICE_PUT in {p.target for p in active_patches() if p.profile == shim.PROFILE}
    shim.uninstall()
    assert (common.general_device_put, utils.general_device_put) == before


@pytest.mark.envs("maxtext-0.2.5", "maxtext-0.2.1")
def test_hbm_usage_counts_live_arrays_against_the_cpu_limit() -> None:
    """F6: CPU devices report no memory stats; tpu-inference 0.19 subscripts them at start-up (TypeError).
    Under the shim every release counts live buffers against the F2 limit."""
    import jax
    import jax.numpy as jnp

    from maxtext_compat import platforms
    from maxtext_compat.cpu import serving as cpu_serving

    utils = importlib.import_module("tpu_inference.utils")
    device = jax.devices()[0]
    assert device.memory_stats() is None  # what makes F6 a gap on CPU
    # Stock, on CPU: 0.19 subscripts the missing stats (TypeError); 0.32 falls back to live arrays against
    # get_device_hbm_limit, which wants a TPU (F2).
    with pytest.raises((TypeError, RuntimeError), match=r"not subscriptable|Expected TPU devices"):
        utils.hbm_usage_bytes([device])
    assert not cpu_serving.installed(), "another test left the CPU serving shim installed"
    try:
        assert cpu_serving.install(parts=("hbm",)).active
        ((before, limit),) = utils.hbm_usage_bytes([device])
        held = jax.device_put(jnp.zeros((1 << 18,), jnp.float32), device)  # 1 MiB
        ((after, _),) = utils.hbm_usage_bytes([device])
        assert limit == platforms.cpu_hbm_bytes() and after - before >= held.nbytes == 1 << 20
    finally:
        cpu_serving.uninstall()
    assert "tpu_inference.utils:hbm_usage_bytes" not in _ours_now()


def _ours_now() -> set[str]:
    from maxtext_compat.cpu import serving as cpu_serving
    from maxtext_compat.patching.ledger import active_patches

    return {p.target for p in active_patches() if p.profile == cpu_serving.PROFILE}


def test_the_ray_workers_device_order_needs_the_mesh_part_on_cpu(shim) -> None:
    """A Ray worker (TPU_MULTIHOST_BACKEND=ray) orders its devices by their TPU coords at start-up
    (tpu_worker.init_device): stock, AttributeError on CPU devices; under the mesh part, processes ordered by index
    (one jax process here: 0), seen through tpu_worker's own import of the function too."""
    import jax

    dist = importlib.import_module("tpu_inference.distributed.utils")
    worker = importlib.import_module("tpu_inference.worker.tpu_worker")
    original = dist.get_device_topology_order_id
    with pytest.raises(AttributeError):  # d.coords of a CPU device (jaxlib's message is empty)
        original(jax.local_devices(), jax.devices())
    shim.install(parts=("mesh",))
    assert dist.get_device_topology_order_id(jax.local_devices(), jax.devices()) == 0
    assert worker.get_device_topology_order_id(jax.local_devices(), jax.devices()) == 0
    shim.uninstall()
    assert dist.get_device_topology_order_id is original and worker.get_device_topology_order_id is original
