"""Hosts must agree: a worker whose plugin is set up differently from the engine's stops start-up (issue 40, item 3).

Two fresh processes stand for two hosts, no server started: the "head" registers the plugin with
MAXTEXT_COMPAT_RPA_KERNEL=pallas and writes its fingerprint into a config, as the engine core does before the
executor starts the workers; the "worker" host has =xla in its environment and runs vLLM's own worker start-up
(`WorkerWrapperBase.init_worker`, which loads the plugins with the config at hand). The plugin there refuses with
PluginMismatchError naming the host, the setting and both values, before the worker class is even resolved.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

pytestmark = [pytest.mark.envs("maxtext-0.2.0")]  # the shortest environment with vLLM: make test pays little

HEAD = r"""
import json, types
from maxtext_compat.serve import vllm_plugin
vllm_plugin.register()
config = types.SimpleNamespace(additional_config={"maxtext_compat": {"strict": True}})
from maxtext_compat.serving import settings
settings.apply(config.additional_config)
vllm_plugin.join_engine(config, "engine", model=vllm_plugin.state().model)
print(json.dumps(config.additional_config))
"""

WORKER = r"""
import json, sys, types
from maxtext_compat.errors import PluginMismatchError
from vllm.v1.worker.worker_base import WorkerWrapperBase
config = types.SimpleNamespace(additional_config=json.loads(sys.argv[1]),
                               enable_trace_function_call_for_thread=lambda: None)
try:
    WorkerWrapperBase(rpc_rank=0).init_worker([{"vllm_config": config}])
except PluginMismatchError as err:
    print(json.dumps({"refused": True, "host": err.host, "differences": err.differences, "message": str(err)}))
else:
    print(json.dumps({"refused": False}))
"""


def _run(script: str, *args: str, **env: str) -> dict[str, Any]:
    full_env = {**os.environ, "JAX_PLATFORMS": "cpu", "TPU_NAME": "cpu-test", "TPU_WORKER_ID": "0",
                "TPU_ACCELERATOR_TYPE": "cpu", **env}  # fmt: skip
    for name in [k for k in full_env if k.startswith("MAXTEXT_COMPAT_") and k not in env and k != "MAXTEXT_COMPAT_ENV"]:
        del full_env[name]
    out = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, env=full_env, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_worker_host_set_up_differently_is_refused_at_start_up() -> None:
    additional = _run(HEAD, MAXTEXT_COMPAT_RPA_KERNEL="pallas")
    engine = additional["maxtext_compat_engine"]
    assert engine["settings"]["rpa_kernel"] == "pallas" and engine["settings"]["strict"] is True
    assert "cpu-serving" in engine["profiles"] and engine["rows"]["maxtext"]
    r = _run(WORKER, json.dumps(additional), MAXTEXT_COMPAT_RPA_KERNEL="xla")
    assert r["refused"], r
    assert ["settings.rpa_kernel", "pallas", "xla"] in r["differences"]
    assert f"host {r['host']}" in r["message"] and "--additional-config" in r["message"]


FORKED = r"""
import json, multiprocessing, types
from maxtext_compat.serve import vllm_plugin
from maxtext_compat.errors import ServingConfigError
vllm_plugin.register()  # the parent, set up from its environment without a config (as `vllm serve`'s API server)
from vllm.v1.engine.core import EngineCore

def engine_core(additional, queue):  # what vLLM's engine core process runs first, started by fork
    config = types.SimpleNamespace(additional_config=additional)
    try:
        EngineCore(vllm_config=config, executor_class=None, log_stats=False)
    except ServingConfigError as err:
        queue.put({"refused": str(err), "argument": err.argument})
    except Exception as err:  # past the plugin: vLLM's own start-up stops on the stand-in config
        state = vllm_plugin.state()
        queue.put({"role": state.role, "fingerprint": state.fingerprint, "past": type(err).__name__,
                   "engine": config.additional_config.get("maxtext_compat_engine")})

out = []
for given in ("xla", "pallas"):
    queue = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(
        target=engine_core, args=({"maxtext_compat": {"rpa_kernel": given}}, queue))
    child.start()
    out.append(queue.get(timeout=300))
    child.join()
print(json.dumps(out))
"""


def test_an_engine_core_started_by_fork_refuses_settings_its_parent_was_not_set_up_with() -> None:
    """vLLM's `fork` start method (its default outside `vllm serve`): the engine core inherits the parent's patches
    and vLLM does not load the plugin again. The plugin's hook in EngineCore.__init__ refuses a config setting the
    parent was not set up with, and where they agree writes the forked engine's fingerprint for the workers."""
    got: Any = _run(FORKED, MAXTEXT_COMPAT_RPA_KERNEL="pallas", VLLM_WORKER_MULTIPROC_METHOD="fork")
    refused, agreed = got
    assert refused["argument"] == "additional_config['maxtext_compat']['rpa_kernel']", refused
    assert "'pallas'" in refused["refused"] and "'xla'" in refused["refused"] and "spawn" in refused["refused"]
    assert agreed["role"] == "engine" and agreed["past"] == "AttributeError", agreed
    engine = agreed["engine"]
    assert engine["digest"] == agreed["fingerprint"] and engine["settings"]["rpa_kernel"] == "pallas"
