"""Multi-host serving through Ray, as far as a CPU allows (issue 40, item 2).

A local two-node Ray cluster on this machine (`ray.cluster_utils.Cluster`: two raylets, each declaring one `TPU`,
the resource tpu-inference's executor asks for per host) and `TPU_MULTIHOST_BACKEND=ray`: tpu-inference's Ray
executor (RayDistributedExecutorV2, vLLM's default) puts one worker on each node. vLLM's `LLM` serves the converted
SmolLM2 with a setting given only in `additional_config` (`strict: false`); its engine core is spawned, loads the
plugin with the config and writes its fingerprint; each worker loads the plugin in `init_worker`. Through vLLM's
`collective_rpc` every worker reports its plugin state: both registered the same row with the same shims, the
fingerprint equal to the engine's (compared at start-up), the setting from the config; then the greedy answer
equals transformers'.

The wall a CPU puts up (the expected outcome here, as the TPU tier records its socket limit): in each worker
jax is a single process (`jax.process_count() == 1`, only that worker's CPU devices): tpu-inference leaves the
multi-host program to the TPU runtime, which forms one from the slice's hosts (`TPU_PROCESS_ADDRESSES`,
`TPU_WORKER_ID`, ...), and on CPU nothing calls `jax.distributed.initialize`, so each worker runs the whole
model on its own devices (both hold its weights and run every step; the engine takes rank 0's output) rather
than one program split across the two. docs/serving.md says what a slice needs instead.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.slow, pytest.mark.envs("maxtext-0.2.3")]
INSTALLED = importlib.metadata.version("maxtext")  # the release this environment serves

TOKENS = 8
RUN = r"""
import gc, json, os, sys

def plugin_state(worker):  # run by collective_rpc in every Ray worker
    import os, socket
    import jax, ray
    from maxtext_compat.serve import vllm_plugin
    from maxtext_compat.patching.ledger import active_patches
    s = vllm_plugin.state()
    engine = (worker.vllm_config.additional_config or {}).get("maxtext_compat_engine") or {}
    return {"pid": os.getpid(), "host": socket.gethostname(), "node": ray.get_runtime_context().get_node_id(),
            "role": s.role, "fingerprint": s.fingerprint, "engine_fingerprint": engine.get("digest"),
            "reason": s.reason, "profiles": sorted({p.profile for p in active_patches()}),
            "settings": {k: v for k, v in (s.settings or {}).items() if v is not None},
            "jax": {"process_count": jax.process_count(), "device_count": jax.device_count(),
                    "local_device_count": jax.local_device_count(), "platform": jax.devices()[0].platform},
            "weight_bytes": sum(a.nbytes for a in jax.live_arrays())}

def main(model, max_len, tokens, second_host_env):
    import ray
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "resources": {"TPU": 1}, "include_dashboard": False})
    saved = dict(os.environ)
    os.environ.update(second_host_env)  # the second raylet, and the workers it starts, see these
    cluster.add_node(num_cpus=1, resources={"TPU": 1})
    os.environ.clear()
    os.environ.update(saved)
    cluster.wait_for_nodes()
    os.environ["RAY_ADDRESS"] = cluster.address
    ray.init(address=cluster.address)
    print("NODES", json.dumps([{"node": n["NodeID"], "TPU": n["Resources"].get("TPU"), "alive": n["Alive"]}
                               for n in ray.nodes()]), flush=True)
    cfg = json.load(open(os.path.join(model, "maxtext_config.json")))
    cfg.update(max_target_length=max_len, max_prefill_predict_length=max_len - 4,
               load_parameters_path=os.path.join(model, "checkpoint"))
    from vllm import LLM, SamplingParams
    llm = None
    try:
        llm = LLM(model=model, dtype="float32", max_model_len=max_len, max_num_seqs=1, max_num_batched_tokens=max_len,
                  additional_config={"maxtext_config": cfg, "maxtext_compat": {"strict": False}})
        print("STATES", json.dumps(llm.collective_rpc(plugin_state)), flush=True)
        out = llm.generate(["Seattle is a"], SamplingParams(max_tokens=tokens, temperature=0))
        print("TOKENS", json.dumps(list(out[0].outputs[0].token_ids)), flush=True)
    except Exception as exc:
        print("FAILED", json.dumps(f"{type(exc).__name__}: {exc}"[:3000]), flush=True)
        raise
    finally:
        shutdown = getattr(getattr(getattr(llm, "llm_engine", None), "engine_core", None), "shutdown", None)
        if shutdown is not None:  # the engine core (and its Ray workers) before the cluster goes
            shutdown()
        del llm
        gc.collect()
        ray.shutdown()
        cluster.shutdown()

if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]))
"""
ENV = {"TPU_MULTIHOST_BACKEND": "ray", "VLLM_WORKER_MULTIPROC_METHOD": "spawn", "NEW_MODEL_DESIGN": "1",
       "SKIP_JAX_PRECOMPILE": "1", "TPU_NAME": "cpu-test", "TPU_WORKER_ID": "0", "TPU_ACCELERATOR_TYPE": "cpu",
       "JAX_PLATFORMS": "cpu", "MAXTEXT_COMPAT_CPU_HBM_GB": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "RAY_USAGE_STATS_ENABLED": "0",
       "RAY_agent_register_timeout_ms": "600000",  # a loaded 2-core machine: the agents start slowly
       "RAY_memory_monitor_refresh_ms": "0",  # Ray's OOM killer counts the shared machine's other processes too
       "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}  # collective_rpc of a function (pickled), on loopback  # fmt: skip


def _ray_sessions(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("session_2*")} if folder.is_dir() else set()


def _run(
    model_dir: Any, work: Any, second_host_env: dict[str, str], env_more: dict[str, str] | None = None
) -> dict[str, Any]:
    """One run of RUN (a fresh two-node cluster); its reports: NODES, STATES, TOKENS (or FAILED), its log, and
    where Ray kept its session files: a folder of the run's own (RAY_TMPDIR; short, as the raylets' socket paths
    must be), removed with everything in it when the run ends, instead of Ray's default /tmp/ray, which outlives it."""
    script = work / "ray_run.py"
    script.write_text(RUN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAXTEXT_COMPAT_") or k == "MAXTEXT_COMPAT_ENV"}
    argv = [sys.executable, str(script), str(model_dir.out), "32", str(TOKENS), json.dumps(second_host_env)]
    default = Path(tempfile.gettempdir()) / "ray"
    before = _ray_sessions(default)
    ray_tmp = Path(tempfile.mkdtemp(prefix="mcray-"))
    try:
        run_env = {**env, **ENV, **(env_more or {}), "RAY_TMPDIR": str(ray_tmp)}
        out = subprocess.run(argv, cwd=work, env=run_env, capture_output=True, text=True, timeout=1200, check=False)
        sessions = _ray_sessions(ray_tmp / "ray")
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    log = out.stdout + out.stderr
    (work / "ray_run.log").write_text(log)
    got: dict[str, Any] = {"log": log, "returncode": out.returncode, "ray_sessions": sessions,
                           "new_default_sessions": _ray_sessions(default) - before, "ray_tmp": ray_tmp}  # fmt: skip
    for line in out.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key in ("NODES", "STATES", "TOKENS", "FAILED"):
            got[key] = json.loads(value)
    print(f"\n[ray] exit {out.returncode}; log {work / 'ray_run.log'}", file=sys.stderr)
    return got


@pytest.fixture(scope="module")
def ray_run(smollm2_dir, tmp_path_factory) -> dict[str, Any]:
    return _run(smollm2_dir, tmp_path_factory.mktemp("ray"), {})


def _states(ray_run: dict[str, Any]) -> list[dict[str, Any]]:
    assert "STATES" in ray_run, (ray_run.get("FAILED"), ray_run["log"][-4000:])
    return list(ray_run["STATES"])


def test_two_raylets_each_declare_the_tpu_resource(ray_run):
    nodes = ray_run.get("NODES")
    assert nodes and len(nodes) == 2 and all(n["alive"] and n["TPU"] == 1.0 for n in nodes), ray_run["log"][-3000:]


def test_one_worker_per_node_each_registered_the_same_row_and_shims(ray_run):
    _same_row_and_shims_on_each_node(ray_run)


def _same_row_and_shims_on_each_node(ray_run: dict[str, Any]) -> None:
    states = _states(ray_run)
    assert len(states) == 2 and len({s["node"] for s in states}) == 2, states  # one worker on each raylet
    assert {s["node"] for s in states} == {n["node"] for n in ray_run["NODES"]}
    assert all(s["role"] == "worker" for s in states), states  # the plugin loaded in init_worker, config at hand
    assert (
        len({s["reason"] for s in states}) == 1 and f"MaxText {INSTALLED} via backend 'native'" in states[0]["reason"]
    )
    assert len({tuple(s["profiles"]) for s in states}) == 1, states
    assert {"cpu-serving", "serving-requests", "plugin-config"} <= set(states[0]["profiles"]), states[0]


def test_every_worker_agrees_with_the_engine_and_holds_the_configs_setting(ray_run):
    states = _states(ray_run)
    engine = states[0]["engine_fingerprint"]
    assert engine and all(s["fingerprint"] == engine == s["engine_fingerprint"] for s in states), states
    assert all(s["settings"].get("strict") is False for s in states), states  # given only in additional_config
    log = ray_run["log"]
    assert log.count("agrees with the engine's") >= 2 and "engine fingerprint" in log, log[-3000:]


def test_the_answer_equals_transformers(ray_run, reference):
    assert ray_run.get("TOKENS") == reference.greedy[0][:TOKENS], (ray_run.get("FAILED"), ray_run["log"][-3000:])


def test_the_cpu_wall_each_worker_runs_the_whole_model_in_its_own_jax(ray_run):
    """Recorded, not wished away: on a slice the TPU runtime makes the workers one jax program; on CPU each worker's
    jax is a process of its own, holding the whole model (SmolLM2's float32 weights, ~0.5 GB, in each)."""
    for s in _states(ray_run):
        assert s["jax"]["process_count"] == 1 and s["jax"]["platform"] == "cpu", s
        assert s["jax"]["device_count"] == s["jax"]["local_device_count"], s  # no device of the other worker
        assert s["weight_bytes"] > 400e6, s


def test_ray_kept_its_files_in_the_runs_folder_and_nothing_is_left(ray_run):
    """Ray wrote its session (logs, sockets) where the run said, not into /tmp/ray, and the folder is gone."""
    assert ray_run["ray_sessions"], f"no Ray session under {ray_run['ray_tmp']}: RAY_TMPDIR was not used"
    assert not ray_run["new_default_sessions"], ray_run["new_default_sessions"]
    assert not ray_run["ray_tmp"].exists()


@pytest.mark.extended
def test_a_host_set_up_differently_stops_start_up_naming_it(smollm2_dir, tmp_path):
    """The second host's environment sets the RPA kernel (its raylet and its worker see it; the engine's host does
    not): that worker's plugin differs from the engine's fingerprint and stops start-up with PluginMismatchError
    naming the host, the setting and both values, through tpu-inference's Ray executor."""
    got = _run(smollm2_dir, tmp_path, {"MAXTEXT_COMPAT_RPA_KERNEL": "pallas"})
    log = got["log"]
    assert got["returncode"] != 0 and "STATES" not in got and "FAILED" in got, log[-3000:]
    assert "PluginMismatchError" in log and "settings.rpa_kernel: engine None, here 'pallas'" in log, log[-4000:]
    assert f"on host {socket.gethostname()}" in log and "--additional-config" in log, log[-4000:]


@pytest.mark.extended
def test_tpu_inferences_first_ray_executor_serves_alike(smollm2_dir, tmp_path, reference):
    """VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0: tpu-inference's RayDistributedExecutor (the one before V2, vLLM's default
    now) places the workers: one per node, the same row, shims and fingerprint as the engine's, the same answer."""
    got = _run(smollm2_dir, tmp_path, {}, {"VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "0"})
    log = got["log"]
    assert "Force using RayDistributedExecutor for JAX on multihost" in log, log[-3000:]
    _same_row_and_shims_on_each_node(got)
    engine = _states(got)[0]["engine_fingerprint"]
    assert engine and all(s["fingerprint"] == engine for s in _states(got)), _states(got)
    assert got.get("TOKENS") == reference.greedy[0][:TOKENS], (got.get("FAILED"), log[-3000:])
    assert got["ray_sessions"] and not got["ray_tmp"].exists()
