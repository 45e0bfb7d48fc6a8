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
from maxtext_compat import vllm_plugin
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
