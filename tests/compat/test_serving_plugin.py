"""The vLLM plugin and the model class without a server.

- `register()` in a fresh process (as vLLM calls it: twice) registers our MaxTextForCausalLM with
  tpu-inference's and vLLM's registries, passes tpu-inference's interface validation, and installs
  the CPU serving shim;
- `MaxTextForCausalLM.__call__` names the runner's positional extras, maps KV caches to layers
  through `layer_name_to_kvcache_index` (not by position) and returns the matrix's arity.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from typing import Any

import pytest

pytestmark = [pytest.mark.envs("maxtext-0.2.5", "maxtext-0.1.0-jax011")]

# The plugin as vLLM loads it in a fresh process: registered twice, its state read. Sets `plugin`.
REGISTER = r"""
import json, inspect
from maxtext_compat.serve import vllm_plugin
vllm_plugin.register()
vllm_plugin.register()  # vLLM may load plugins twice per process
from tpu_inference.models.common import model_loader as ml
from vllm.model_executor.models.registry import ModelRegistry
from maxtext_compat.serving.model import MaxTextForCausalLM
from maxtext_compat.patching.ledger import active_patches
ml._validate_model_interface(MaxTextForCausalLM)
st = vllm_plugin.state()
plugin = {
    "registered": st.registered, "model": st.model, "reason": st.reason, "cpu_shim": st.cpu_shim,
    "ours": ml._MODEL_REGISTRY.get("MaxTextForCausalLM") is MaxTextForCausalLM,
    "vllm_knows": "MaxTextForCausalLM" in ModelRegistry.get_supported_archs(),
    "profiles": sorted({p.profile for p in active_patches()}),
}
"""
PLUGIN_SCRIPT = REGISTER + "print(json.dumps(plugin))\n"


def _run(script: str, **env: str) -> dict[str, Any]:
    full_env = {**os.environ, "JAX_PLATFORMS": "cpu", "TPU_NAME": "cpu-test", "TPU_WORKER_ID": "0",
                "TPU_ACCELERATOR_TYPE": "cpu", **env}  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=full_env, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_register_is_idempotent_and_installs_ours_with_the_cpu_shim(registered: dict[str, Any]) -> None:
    r = registered["plugin"]
    assert r["registered"] and r["model"] == "compat" and r["ours"] and r["vllm_knows"]
    assert r["cpu_shim"].startswith("installed (mesh, hbm, compiler_options, rpa, host_copy) [")
    assert {"cpu-serving", "cpu-rpa"} <= set(r["profiles"])


# Every target a shim declares passes through the engine's transaction (`patching.apply`): a spy there reads each
# one from its module or class (inspect.getattr_static: the raw object, not the engine's memory of it) before the
# first write, and the same reading after `shims.uninstall()` must find that very object again.
WATCH = r"""
import importlib, inspect, json
from maxtext_compat import patching
MISSING = object()
def raw(target):
    module, _, path = target.partition(":")
    obj = importlib.import_module(module)
    *owners, attr = path.split(".")
    for owner in owners:
        obj = inspect.getattr_static(obj, owner)
    return inspect.getattr_static(obj, attr, MISSING)
seen, real_apply = {}, patching.apply
def spy(name, specs, *, stack=False, settings=None):
    for s in specs:
        seen.setdefault(("spec", s.target), (name, raw(s.target)))
    for s in settings or ():
        seen.setdefault(("setting", s.slot.target), (name, s.slot, s.slot.read()))
    return real_apply(name, specs, stack=stack, settings=settings)
patching.apply = spy
"""
# Then, after REGISTER: every shim uninstalled, each watched target read again. Prints both readings.
UNDO = r"""
from maxtext_compat import shims
from maxtext_compat.kernel import interpret
from maxtext_compat.patching import shim
from maxtext_compat.patching.ledger import active_patches
listed = {p.target.split(" ")[0] for p in active_patches()}
patched = {t for (kind, t), v in seen.items() if kind == "spec" and raw(t) is not v[1]}
hook_set = interpret.interpret_mode() is not None
removed = shims.uninstall()
def same(a, b):
    return a is b or (type(a) is type(b) and isinstance(a, (str, int, float, tuple)) and a == b)
wrong = sorted(t for (kind, t), v in seen.items() if kind == "spec" and raw(t) is not v[1])
wrong += sorted(t for (kind, t), v in seen.items() if kind == "setting" and not same(v[1].read(), v[2]))
uninstall = {
    "profiles": sorted({v[0] for v in seen.values()}), "specs": sum(k == "spec" for k, _ in seen),
    "settings": sum(k == "setting" for k, _ in seen), "patched": len(patched),
    "unlisted": sorted(t for (k, t) in seen if k == "spec" and t not in listed), "hook_set": hook_set,
    "removed": removed, "wrong": wrong, "left": [p.target for p in active_patches()],
    "hook_left": interpret.interpret_mode() is not None,
    "statuses": {s.name: s.active for s in shim.statuses()},
}
print(json.dumps({"plugin": plugin, "uninstall": uninstall}))
"""


@pytest.fixture(scope="module")
def registered() -> dict[str, Any]:
    """One fresh process for the two tests that read it (vLLM's and tpu-inference's imports take ~20 s each): the
    engine's transaction watched, the plugin registered as vLLM does, then every shim uninstalled."""
    return _run(WATCH + REGISTER + UNDO)


def test_uninstall_after_register_leaves_every_declared_target_original(registered: dict[str, Any]) -> None:
    """The plugin's shims (CPU serving and the CPU kernel included) all go through one lifecycle, so
    `shims.uninstall()` removes every one of them: each target holds its original object again, by identity."""
    r = registered["uninstall"]
    assert {"cpu-serving", "cpu-rpa", "serving-requests", "plugin-config"} <= set(r["profiles"]), r["profiles"]
    assert r["specs"] >= 8 and r["settings"] >= 4, r
    assert r["patched"] == r["specs"] and r["unlisted"] == [], r  # each declared callable was wrapped and listed
    assert r["hook_set"] and set(r["removed"]) == set(r["profiles"]), r
    assert r["wrong"] == [] and r["left"] == [] and not r["hook_left"], r
    assert not any(r["statuses"].values()), r["statuses"]


@pytest.mark.extended_in("maxtext-0.1.0-jax011")  # the platform gate reads no release: maxtext-0.2.5 proves it
def test_register_without_cpu_platform_patches_nothing() -> None:
    # JAX_PLATFORMS unset on this CPU-only box would let jax pick CPU too, but the shim must not
    # decide by initialising a backend: anything but exactly "cpu" means "not ours to patch".
    r = _run(PLUGIN_SCRIPT, JAX_PLATFORMS="cpu,tpu")
    assert r["registered"] and r["ours"]
    assert r["cpu_shim"].startswith("JAX_PLATFORMS is cpu,tpu, not cpu")
    assert "cpu-serving" not in r["profiles"] and "cpu-rpa" not in r["profiles"]


# ---------------------------------------------------------------------------------------------
# __call__ with a stub backend (no MaxText, no tpu-inference runner)


class _Backend:
    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}

    def forward(self, model: Any, cfg: Any, mesh: Any, **kw: Any) -> Any:
        from maxtext_compat.serving.backend import StepOutput

        self.seen = kw
        return StepOutput(hidden="H", kv_caches=[c + "'" for c in kw["kv_caches"]])


def _stub(arity: int) -> Any:
    return types.SimpleNamespace(
        backend=_Backend(), num_layers=2, maxtext_config=None, mesh=None, return_arity=arity, _require_model=lambda: "m"
    )


@pytest.mark.parametrize("arity", [3, 4])
def test_call_maps_caches_through_the_layer_map_and_returns_the_matrix_arity(arity: int) -> None:
    from maxtext_compat.serving.model import MaxTextForCausalLM

    stub = _stub(arity)
    md = types.SimpleNamespace(input_positions=types.SimpleNamespace(ndim=1))
    layer_map = (("layer.0", 1), ("layer.1", 0))  # physical order reversed
    # The 0.26-0.32 runner's positional call after (kv_caches, input_ids, md):
    out = MaxTextForCausalLM.__call__(
        stub, ["c0", "c1"], "ids", md, None, "pos", layer_map, None, None, True, True, shared_attention_metadata=None
    )
    assert stub.backend.seen["kv_caches"] == ["c1", "c0"]  # layer order
    assert stub.backend.seen["positions"] is md.input_positions
    assert out[0] == ["c0'", "c1'"]  # scattered back to the physical slots
    assert len(out) == arity and out[1] == "H" and out[2] == []


def test_call_accepts_the_0_11_runner_layout() -> None:
    from maxtext_compat.serving.model import MaxTextForCausalLM

    stub = _stub(3)
    md = types.SimpleNamespace(input_positions=types.SimpleNamespace(ndim=1))
    out = MaxTextForCausalLM.__call__(stub, ["c0", "c1"], "ids", md, None, (("layer.0", 0), ("layer.1", 1)), None)
    assert out == (["c0'", "c1'"], "H", [])


BACKPORT_SCRIPT = r"""
import json, importlib.util
from maxtext_compat.serve import vllm_plugin
from maxtext_compat.errors import BackendUnavailableError
from maxtext_compat.serving import runtime
from tpu_inference.models.common import model_loader as ml
vllm_plugin.register()
st = vllm_plugin.state()
try:
    rt = runtime.current()
    built = rt.describe()
except BackendUnavailableError as exc:
    built = "BackendUnavailableError: " + str(exc)
print(json.dumps({"registered": st.registered, "reason": st.reason, "built": built,
                  "in_registry": "MaxTextForCausalLM" in ml._MODEL_REGISTRY,
                  "backport": importlib.util.find_spec("maxtext_compat.backport") is not None}))
"""


@pytest.mark.envs("maxtext-0.1.0-jax011")
def test_release_without_a_backend_fails_only_when_a_maxtext_model_is_built() -> None:
    r = _run(BACKPORT_SCRIPT)
    assert r["registered"] and r["in_registry"]
    try:
        import maxtext_compat.serving.backport_backend  # noqa: F401

        has_backend = True
    except ImportError:
        has_backend = False
    if has_backend:
        assert "via backend 'backport'" in r["built"]
    else:
        assert r["built"].startswith("BackendUnavailableError") and "backport" in r["built"]
        assert "cannot be built in this environment" in r["reason"]
