"""End to end: a real `vllm serve` (vllm-tpu + tpu-inference, JAX_PLATFORMS=cpu) serving MaxText.

Each class starts one server (class-scoped fixture, started through `maxtext-compat serve --tiny`
so the CLI is exercised too), sends a few bounded requests and always stops the process group.
Tokens are compared with MaxText's own greedy decode of the same checkpoint without vLLM (train
mode, dot-product attention, no KV cache), computed in this process.

Server starts are the cost (55-90 s each on the shared 2-core box): TP=1 with the real RPA kernel in every
serving env (0.2.5, 0.2.4 natively on tpu-inference 0.32.0 and 0.1.0 through the backport, against a
checkpoint; 0.2.1 and 0.2.0 natively on 0.19.0 — the flat RPA entry point and 3-value model return — on
random weights, as their serving path restores no checkpoint); TP=2 on 0.2.5 and the backport; MaxText's own
adapter (0.2.5 and 0.2.4, which ship one); one without the RPA CPU shim (0.2.5 only: the shim is
release-independent). 0.2.2 and 0.2.3 install the same stack and could be added; they are left out
to keep `make test` short.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.vllm_server import Server

# 0.2.5 and 0.2.4 natively (0.2.4: the last release that ships the Linen decoder), 0.2.1 and 0.2.0 on
# tpu-inference 0.19.0, 0.1.0 through the backport.
SERVING_ENVS = ("maxtext-0.2.5", "maxtext-0.2.4", "maxtext-0.2.1", "maxtext-0.2.0", "maxtext-0.1.0-jax011")
pytestmark = [pytest.mark.envs(*SERVING_ENVS), pytest.mark.needs_maxtext, pytest.mark.slow]

PROMPTS: tuple[list[int], ...] = ([1, 5, 7, 9, 11, 13], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15])
MAX_TOKENS = 8
READY_TIMEOUT = 420.0
REQUEST_TIMEOUT = 240.0
STOCK_RPA_CPU_ERRORS = (
    "Unsupported TPU device kind: cpu",
    "Only interpret mode is supported on CPU backend",
    "Unsupported tpu_version",
)
CPU_ENV = {
    "JAX_PLATFORMS": "cpu",
    "TPU_NAME": "cpu-test",
    "TPU_WORKER_ID": "0",
    "TPU_ACCELERATOR_TYPE": "cpu",
    "SKIP_JAX_PRECOMPILE": "1",
    "HF_HUB_OFFLINE": "1",
    "NEW_MODEL_DESIGN": "1",
}


# ------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serving")


@pytest.fixture(scope="module")
def checkpoint(workdir: Path) -> str:
    """Random tiny weights written the way MaxText's load_parameters_path restores them."""
    from helpers.checkpoint import write_checkpoint
    from maxtext_compat.testing.tiny import tiny_config, tiny_mesh

    cfg = tiny_config("default")
    return write_checkpoint(cfg, str(workdir / "ckpt"), seed=0, mesh=tiny_mesh(cfg, 1))


@pytest.fixture(scope="module")
def dense_tokens(checkpoint: str) -> list[list[int]]:
    """MaxText's own greedy decode of the checkpoint, without vLLM."""
    from maxtext_compat.decode.greedy import greedy_decode
    from maxtext_compat.serving.backend import backend_for
    from maxtext_compat.testing.tiny import installed_row, tiny_config, tiny_mesh

    cfg = tiny_config("default", load_parameters_path=checkpoint)
    logits = backend_for(installed_row()).dense_logits_fn(cfg, tiny_mesh(cfg, 1))
    return greedy_decode(logits, PROMPTS, MAX_TOKENS, length=int(cfg.max_target_length))


def _serve(workdir: Path, name: str, checkpoint: str | None, *, tp: int, env: dict[str, str]) -> Iterator[Server]:
    """A `maxtext-compat serve --tiny` server; checkpoint None serves random weights (--load-format dummy)."""
    from helpers import vllm_server as server
    from maxtext_compat.serve import command as serve_cli

    port = server.free_port()
    mc = {"load_parameters_path": checkpoint} if checkpoint else {}
    additional = json.dumps({"maxtext_config": mc})
    ns = serve_cli.build_parser().parse_args(["--tiny"])
    base_env = {**os.environ, **CPU_ENV, "XLA_FLAGS": f"--xla_force_host_platform_device_count={max(tp, 1)}", **env}
    cmd = serve_cli.build_command(
        ns,
        [str(workdir / f"model_{name}"), "--additional-config", additional, "--port", str(port),
         "--tensor-parallel-size", str(tp), "--host", "127.0.0.1"],
        environ=base_env,
    )  # fmt: skip
    srv = server.start(
        cmd.argv,
        port=port,
        model=cmd.model_dir or "",
        log_path=workdir / f"{name}.log",
        env={**base_env, **cmd.env_changes},
    )
    try:
        yield srv
    finally:
        srv.stop()


def _ready(srv: Server) -> Server:
    from maxtext_compat.errors import ServingError

    first = srv.ready_after is None
    try:
        seconds = srv.wait_ready(READY_TIMEOUT)
    except ServingError as exc:
        pytest.fail(f"server did not start: {exc}")
    if first:
        print(f"\n[serving] {srv.log_path.stem}: ready after {seconds:.1f} s", file=sys.stderr)
    return srv


def _request(srv: Server, prompt: list[int]) -> list[int]:
    import time

    from helpers.vllm_server import token_ids

    t0 = time.monotonic()
    status, body = srv.completion(prompt, max_tokens=MAX_TOKENS, timeout=REQUEST_TIMEOUT)
    took = time.monotonic() - t0
    assert status == 200, f"HTTP {status}: {body}\n--- server log tail ---\n{srv.log_tail()}"
    ids = token_ids(body)
    print(f"[serving] {srv.log_path.stem}: prompt len {len(prompt)} -> {ids} in {took:.2f} s", file=sys.stderr)
    return ids


def _concurrent(srv: Server) -> list[list[int]]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        futures = [pool.submit(_request, srv, p) for p in PROMPTS]
        return [f.result(timeout=REQUEST_TIMEOUT + 30) for f in futures]


# ------------------------------------------------------------------------------------- servers


@pytest.fixture(scope="class")
def compat_tp1(workdir: Path, checkpoint: str) -> Iterator[Server]:
    # The real RPA kernel (interpreted) end to end here; every other server runs the default XLA kernel.
    yield from _serve(workdir, "compat_tp1", checkpoint, tp=1, env={"MAXTEXT_COMPAT_RPA_KERNEL": "pallas"})


@pytest.fixture(scope="class")
def compat_tp2(workdir: Path, checkpoint: str) -> Iterator[Server]:
    yield from _serve(workdir, "compat_tp2", checkpoint, tp=2, env={})


@pytest.fixture(scope="class")
def maxtext_adapter_tp1(workdir: Path, checkpoint: str) -> Iterator[Server]:
    yield from _serve(workdir, "maxtext_adapter_tp1", checkpoint, tp=1, env={"MAXTEXT_COMPAT_VLLM_MODEL": "maxtext"})


@pytest.fixture(scope="class")
def random_weights_tp1(workdir: Path) -> Iterator[Server]:
    # MaxText 0.2.0/0.2.1 cannot restore a checkpoint in their serving path (a typed refusal): random weights.
    yield from _serve(workdir, "random_weights_tp1", None, tp=1, env={"MAXTEXT_COMPAT_RPA_KERNEL": "pallas"})


@pytest.fixture(scope="class")
def no_rpa_shim(workdir: Path) -> Iterator[Server]:
    # Random weights (--load-format dummy): this server also proves the dummy-weights start-up path.
    yield from _serve(workdir, "no_rpa_shim", None, tp=1, env={"MAXTEXT_COMPAT_DISABLE_CPU_SHIM": "rpa"})


# ------------------------------------------------------------------------------------- tests


@pytest.mark.envs("maxtext-0.2.5", "maxtext-0.2.4", "maxtext-0.1.0-jax011")
# make test: 0.2.5's server (the real kernel, interpreted); 0.2.4 serves MaxText's shipped adapter, the backport
# serves through test_backport_backend_serving
@pytest.mark.extended_in("maxtext-0.2.4", "maxtext-0.1.0-jax011")
class TestCompatModelTP1:
    """maxtext-compat's MaxTextForCausalLM, engine core in its own process (vLLM's default)."""

    def test_requests_match_maxtext_dense_decode(self, compat_tp1: Server, dense_tokens: list[list[int]]) -> None:
        srv = _ready(compat_tp1)
        got = [_request(srv, p) for p in PROMPTS]
        assert got == dense_tokens

    def test_two_requests_at_once_match(self, compat_tp1: Server, dense_tokens: list[list[int]]) -> None:
        assert _concurrent(_ready(compat_tp1)) == dense_tokens

    def test_plugin_registered_ours_with_cpu_shim_in_engine_process(self, compat_tp1: Server) -> None:
        log = _ready(compat_tp1).log_text()
        assert "weights: checkpoint" in log
        engine_lines = [ln for ln in log.splitlines() if "EngineCore" in ln and "maxtext_compat plugin" in ln]
        assert engine_lines, "the plugin did not run in the engine-core process"
        assert "registered maxtext_compat's MaxTextForCausalLM" in engine_lines[-1]
        assert "CPU serving shim: installed (mesh, hbm, compiler_options, rpa, host_copy) [" in engine_lines[-1]
        assert "RPA kernel on CPU: pallas" in log


@pytest.mark.envs("maxtext-0.2.1", "maxtext-0.2.0")
@pytest.mark.extended_in("maxtext-0.2.1")  # one serving convention, one tpu-inference: make test serves it on 0.2.0
class TestKvReturnReleaseTP1:
    """MaxText 0.2.1 and 0.2.0 served natively on tpu-inference 0.19.0 (flat RPA entry point, 3-value model
    return), with the real kernel interpreted. Their serving path cannot restore a checkpoint, so the weights
    are random and there is no dense reference: the oracle is that batching changes nothing (two prompts
    decoded together, sharing the paged cache, give each prompt's tokens decoded alone) and that decoding is
    repeatable."""

    def test_each_prompt_alone_twice_then_both_together_give_the_same_tokens(self, random_weights_tp1: Server) -> None:
        srv = _ready(random_weights_tp1)
        alone = [_request(srv, p) for p in PROMPTS]
        assert all(len(ids) == MAX_TOKENS for ids in alone), alone
        assert len({tuple(ids) for ids in alone}) > 1, "random weights gave one answer to every prompt"
        assert [_request(srv, p) for p in PROMPTS] == alone
        assert _concurrent(srv) == alone

    def test_the_log_names_the_plugin_the_kernel_and_random_weights(self, random_weights_tp1: Server) -> None:
        log = _ready(random_weights_tp1).log_text()
        assert "weights: random (--load-format dummy)" in log
        engine_lines = [ln for ln in log.splitlines() if "EngineCore" in ln and "maxtext_compat plugin" in ln]
        assert engine_lines and "registered maxtext_compat's MaxTextForCausalLM" in engine_lines[-1]
        assert "RPA kernel on CPU: pallas" in log
        # tpu-inference 0.19 has no compiler options module: that part is reported as not needed, not as off
        assert "CPU serving shim: installed (mesh, hbm, rpa, host_copy; not needed here: compiler_options)" in log


@pytest.mark.envs("maxtext-0.2.5", "maxtext-0.1.0-jax011")
@pytest.mark.extended  # make test serves at TP=2 through the backport (test_backport_backend_serving's [2])
class TestCompatModelTP2:
    """Same model over 2 virtual CPU devices: KV heads padded 1 -> 2, cache sharded on 'model'."""

    def test_requests_match_maxtext_dense_decode(self, compat_tp2: Server, dense_tokens: list[list[int]]) -> None:
        srv = _ready(compat_tp2)
        assert [_request(srv, p) for p in PROMPTS] == dense_tokens

    def test_two_requests_at_once_match(self, compat_tp2: Server, dense_tokens: list[list[int]]) -> None:
        assert _concurrent(_ready(compat_tp2)) == dense_tokens

    def test_mesh_is_two_way_model_parallel(self, compat_tp2: Server) -> None:
        log = _ready(compat_tp2).log_text()
        assert "'model': 2" in log, "tpu-inference did not build a 2-way 'model' mesh axis"
        assert "RPA kernel on CPU: xla" in log


@pytest.mark.envs("maxtext-0.2.5", "maxtext-0.2.4")
@pytest.mark.extended_in("maxtext-0.2.5")  # the shipped adapter is the same file in both: make test serves it on 0.2.4
class TestMaxTextOwnAdapter:
    """MaxText 0.2.5's shipped adapter (registered by our plugin instead of ours, CPU shim still on)."""

    def test_same_tokens_as_ours_and_dense(self, maxtext_adapter_tp1: Server, dense_tokens: list[list[int]]) -> None:
        srv = _ready(maxtext_adapter_tp1)
        assert "registered MaxText's own adapter" in srv.log_text()
        got = _concurrent(srv)
        assert got == dense_tokens


@pytest.mark.envs("maxtext-0.2.4")  # the CPU shim is release-independent: one env proves it (the lighter one)
@pytest.mark.extended  # a third server start; every server of make test runs through the shim
class TestWithoutCpuRpaShim:
    """A server with the RPA part of the CPU shim switched off starts (random weights) and fails loudly
    on the first request: the plugin's shim is what makes the kernel run on CPU."""

    def test_starts_with_random_weights(self, no_rpa_shim: Server) -> None:
        log = _ready(no_rpa_shim).log_text()
        assert "weights: random (--load-format dummy)" in log

    def test_first_request_fails_loudly(self, no_rpa_shim: Server) -> None:
        srv = _ready(no_rpa_shim)
        try:
            status, body = srv.completion(PROMPTS[0], max_tokens=MAX_TOKENS, timeout=REQUEST_TIMEOUT)
        except OSError as exc:  # the server may drop the connection when its engine core dies
            status, body = -1, {"error": repr(exc)}
        assert status != 200, f"served without the RPA CPU shim: {body}"
        log = srv.log_text()
        assert "switched off: rpa" in log
        # The kernel's first CPU obstacle (tpu_info, block sizes or interpret mode, whichever it meets first).
        assert "kernels/ragged_paged_attention" in log, srv.log_tail()
        assert any(m in log for m in STOCK_RPA_CPU_ERRORS), srv.log_tail()
