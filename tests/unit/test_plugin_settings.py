"""Settings travel with the engine, and hosts must agree (issue 40, item 3), without vLLM or MaxText.

- the registry knows every MAXTEXT_COMPAT_* setting the serving path reads, each with its reader's parser;
- `--additional-config '{"maxtext_compat": {...}}'` values apply in the process, with typed errors for an unknown
  key, a bad value, and a value the environment contradicts;
- the fingerprint is stable (same state, same digest; host and pid left out) and sensitive (one setting changes it);
- a worker whose fingerprint differs from the engine's is refused, naming the host, the setting and both values;
- the plugin finds vLLM's config in its caller's frame (EngineCore.__init__, WorkerWrapperBase.init_worker).
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from maxtext_compat.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    PluginMismatchError,
    ServingConfigError,
)
from maxtext_compat.serving import fingerprint, settings

pytestmark = pytest.mark.envs("unit")

PARTS = dict(rows={"maxtext": "0.2.5", "tpu_inference": ">=0.32.0"}, versions={"maxtext": "0.2.5", "vllm": "0.32.0"},
             profiles=["cpu-serving", "serving-requests"])  # fmt: skip


def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every setting unset, and restored after the test even where settings.apply() writes os.environ itself
    (a delenv of an absent variable records nothing: the set first makes monkeypatch remember it)."""
    for name in settings.ENV_NAMES:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def test_the_registry_names_every_setting_the_serving_path_reads() -> None:
    from maxtext_compat import platforms, switches
    from maxtext_compat.convention import callers, policy
    from maxtext_compat.matrix.values import MATRIX_ENV_VAR
    from maxtext_compat.serving_fixes import request_defects as serving_requests

    names = set(settings.ENV_NAMES)
    readers = {callers.ENV, policy.POLICY_ENV, policy.STRICT_ENV, MATRIX_ENV_VAR, platforms.KERNEL_ENV,
               platforms.DISABLE_ENV, platforms.HBM_ENV, serving_requests.DISABLE_ENV, settings.MODEL_ENV,
               "MAXTEXT_COMPAT_TRACED_KV_CHECKS", switches.FORCE_SHIMS_ENV}  # fmt: skip
    assert names == readers and len(names) == len(settings.SETTINGS)
    for s in settings.SETTINGS:
        assert s.env == "MAXTEXT_COMPAT_" + s.key.upper() or s.key == "vllm_model"
        assert s.meaning


def test_effective_values_are_canonical(monkeypatch: pytest.MonkeyPatch) -> None:
    _clean(monkeypatch)
    assert set(settings.effective().values()) == {None}
    env = {"MAXTEXT_COMPAT_STRICT": "TRUE", "MAXTEXT_COMPAT_RPA_KERNEL": "XLA",
           "MAXTEXT_COMPAT_DISABLE_CPU_SHIM": "rpa, hbm", "MAXTEXT_COMPAT_CPU_HBM_GB": "2"}  # fmt: skip
    got = settings.effective(env)
    assert got["strict"] is True and got["rpa_kernel"] == "xla" and got["disable_cpu_shim"] == ["hbm", "rpa"]
    assert got["cpu_hbm_gb"] == 2 << 30
    with pytest.raises(InvalidArgumentError, match="MAXTEXT_COMPAT_STRICT"):
        settings.effective({"MAXTEXT_COMPAT_STRICT": "y"})


def test_config_values_apply_in_the_process() -> None:
    env: dict[str, str] = {}
    config = {"maxtext_compat": {"rpa_kernel": "pallas", "disable_request_shim": True, "cpu_hbm_gb": 2,
                                 "disable_cpu_shim": ["rpa", "hbm"], "convention": None}}  # fmt: skip
    applied = settings.apply(config, env)
    assert env == applied == {"MAXTEXT_COMPAT_RPA_KERNEL": "pallas", "MAXTEXT_COMPAT_DISABLE_REQUEST_SHIM": "1",
                              "MAXTEXT_COMPAT_CPU_HBM_GB": "2",
                              "MAXTEXT_COMPAT_DISABLE_CPU_SHIM": "rpa,hbm"}  # fmt: skip
    assert settings.apply({"maxtext_config": {"x": 1}}, env) == {}  # no maxtext_compat section: nothing to do
    assert settings.apply(None, env) == {}
    env2 = {"MAXTEXT_COMPAT_DISABLE_REQUEST_SHIM": "true"}  # the same on/off value as true: agrees
    assert settings.apply({"maxtext_compat": {"disable_request_shim": True}}, env2)
    assert env2["MAXTEXT_COMPAT_DISABLE_REQUEST_SHIM"] == "1"


def test_an_unknown_key_is_refused_naming_the_keys_known() -> None:
    with pytest.raises(InvalidArgumentError) as err:
        settings.apply({"maxtext_compat": {"rpa_kernal": "xla"}}, {})
    assert err.value.argument == "additional_config['maxtext_compat']['rpa_kernal']"
    assert "rpa_kernel" in str(err.value.expected) and err.value.fix


def test_a_bad_value_is_refused_where_it_was_given() -> None:
    env: dict[str, str] = {}
    with pytest.raises(InvalidArgumentError) as err:
        settings.apply({"maxtext_compat": {"rpa_kernel": "cuda"}}, env)
    assert err.value.argument == "additional_config['maxtext_compat']['rpa_kernel']"
    assert "xla" in str(err.value.expected) and err.value.found == "'cuda'" and env == {}
    with pytest.raises(InvalidArgumentTypeError, match="rpa_kernel"):
        settings.apply({"maxtext_compat": {"rpa_kernel": {"a": 1}}}, env)
    with pytest.raises(InvalidArgumentTypeError, match="JSON object"):
        settings.apply({"maxtext_compat": ["rpa_kernel"]}, env)
    with pytest.raises(InvalidArgumentError, match="strict"):
        settings.apply({"maxtext_compat": {"strict": "maybe"}}, env)


def test_config_and_environment_that_disagree_are_refused() -> None:
    env = {"MAXTEXT_COMPAT_RPA_KERNEL": "pallas"}
    with pytest.raises(ServingConfigError) as err:
        settings.apply({"maxtext_compat": {"rpa_kernel": "xla", "strict": True}}, env)
    text = str(err.value)
    assert "MAXTEXT_COMPAT_RPA_KERNEL='pallas'" in text and "'xla'" in text
    assert "unset MAXTEXT_COMPAT_RPA_KERNEL" in text
    assert env == {"MAXTEXT_COMPAT_RPA_KERNEL": "pallas"}  # nothing applied when one setting is refused


def test_the_fingerprint_is_stable_and_sensitive() -> None:
    a = fingerprint.compute(**PARTS, effective={"rpa_kernel": "xla", "strict": None})
    b = fingerprint.compute(**{**PARTS, "profiles": ["serving-requests", "cpu-serving", "cpu-serving"]},
                            effective={"strict": None, "rpa_kernel": "xla"})  # fmt: skip
    assert a.digest == b.digest and len(a.digest) == 16
    moved = fingerprint.Fingerprint.from_dict({**a.as_dict(), "host": "elsewhere", "pid": 1})
    assert moved.digest == a.digest  # host and pid are beside the hash, not in it
    assert fingerprint.Fingerprint.from_dict(a.as_dict()).as_dict() == a.as_dict()  # round trip through the config
    other = fingerprint.compute(**PARTS, effective={"rpa_kernel": "pallas", "strict": None})
    assert other.digest != a.digest
    assert fingerprint.differences(a, other) == [("settings.rpa_kernel", "xla", "pallas")]
    newer = fingerprint.compute(**{**PARTS, "versions": {"maxtext": "0.2.6", "vllm": "0.32.0"}},
                                effective={"rpa_kernel": "xla", "strict": None})  # fmt: skip
    assert fingerprint.differences(a, newer) == [("versions.maxtext", "0.2.5", "0.2.6")]


def test_a_worker_that_differs_from_the_engine_is_refused() -> None:
    engine = fingerprint.compute(**PARTS, effective={"rpa_kernel": "xla"})
    fingerprint.check_against(engine.as_dict(), fingerprint.compute(**PARTS, effective={"rpa_kernel": "xla"}))
    worker = fingerprint.Fingerprint(
        fingerprint.compute(**PARTS, effective={"rpa_kernel": None}).fields, host="worker-3", pid=7
    )
    with pytest.raises(PluginMismatchError) as err:
        fingerprint.check_against(engine.as_dict(), worker)
    e = err.value
    assert isinstance(e, ServingConfigError) and e.host == "worker-3"
    assert e.differences == [("settings.rpa_kernel", "xla", None)] and e.argument == "settings.rpa_kernel"
    text = str(e)
    assert "host worker-3" in text and "engine 'xla', here None" in text and engine.digest in text
    assert "--additional-config" in text and "MAXTEXT_COMPAT_RPA_KERNEL" in text


def _caller(module: str, name: str, config: Any) -> Any:
    """A function named like vLLM's caller, in a module named like its, that calls `engine_config_of_caller`."""
    from maxtext_compat.serve import vllm_plugin

    scope: dict[str, Any] = {"__name__": module, "plugin": vllm_plugin}
    exec(f"def {name}(vllm_config):\n    return (lambda: plugin.engine_config_of_caller())()", scope)
    return scope[name](config)


def test_the_plugin_finds_the_engine_config_in_vllms_callers() -> None:
    config = types.SimpleNamespace(additional_config={})
    assert _caller("vllm.v1.worker.worker_base", "init_worker", config) == (config, "worker")
    assert _caller("vllm.v1.engine.core", "__init__", config) == (config, "engine")
    assert _caller("vllm.entrypoints.cli", "init_worker", config) == (None, "")  # not vLLM's start-up caller


def test_the_engine_writes_its_fingerprint_and_a_differing_worker_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from maxtext_compat.serve import vllm_plugin

    _clean(monkeypatch)
    monkeypatch.setenv("MAXTEXT_COMPAT_RPA_KERNEL", "pallas")
    config = types.SimpleNamespace(additional_config={"maxtext_compat": {"strict": True}})
    settings.apply(config.additional_config)
    digest = vllm_plugin.join_engine(config, "engine", model="compat")
    engine = config.additional_config[fingerprint.ENGINE_KEY]
    assert engine["digest"] == digest and engine["settings"]["rpa_kernel"] == "pallas"
    assert vllm_plugin.join_engine(config, "worker", model="compat") == digest  # a worker set up alike
    monkeypatch.setenv("MAXTEXT_COMPAT_RPA_KERNEL", "xla")  # this host's environment differs from the head's
    with pytest.raises(PluginMismatchError, match=r"settings.rpa_kernel: engine 'pallas', here 'xla'"):
        vllm_plugin.join_engine(config, "worker", model="compat")
    del config.additional_config[fingerprint.ENGINE_KEY]
    vllm_plugin.join_engine(config, "worker", model="compat")  # no engine fingerprint: nothing to compare with


def test_doctor_json_has_the_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    from maxtext_compat import doctor

    _clean(monkeypatch)
    monkeypatch.setenv("MAXTEXT_COMPAT_STRICT", "1")
    report = doctor.collect()
    fp = report["fingerprint"]
    assert len(fp["digest"]) == 16 and fp["settings"]["strict"] is True and "versions" in fp and "rows" in fp
    assert f"plugin fingerprint: {fp['digest']}" in doctor.render(report)
    monkeypatch.setenv("MAXTEXT_COMPAT_STRICT", "y")
    assert doctor.collect()["fingerprint"]["error"]["type"] == "InvalidArgumentError"


def test_an_engine_core_forked_after_set_up_takes_the_config_only_where_it_agrees(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's fork start method: the engine core inherits the parent's patches and vLLM does not load the plugin in
    it again. The config's settings must then be what the parent set up with (ServingConfigError naming the setting,
    both values and the fix otherwise); when they are, the forked engine writes its fingerprint for the workers."""
    from maxtext_compat.serve import vllm_plugin

    _clean(monkeypatch)
    parent = vllm_plugin.PluginState(True, "compat", "set up", pid=1, settings=settings.effective())
    config = types.SimpleNamespace(additional_config={"maxtext_compat": {"rpa_kernel": "xla"}})
    with pytest.raises(ServingConfigError) as e:
        vllm_plugin.join_forked_engine(config, parent)
    assert e.value.argument == "additional_config['maxtext_compat']['rpa_kernel']" and e.value.found == "'xla'"
    assert "VLLM_WORKER_MULTIPROC_METHOD=spawn" in str(e.value) and "MAXTEXT_COMPAT_RPA_KERNEL=xla" in str(e.value)
    assert fingerprint.ENGINE_KEY not in config.additional_config
    monkeypatch.setenv("MAXTEXT_COMPAT_RPA_KERNEL", "xla")  # the parent was set up with it: the fork agrees
    parent = vllm_plugin.PluginState(True, "compat", "set up", pid=1, settings=settings.effective())
    monkeypatch.setattr(vllm_plugin, "_STATE", parent)
    digest = vllm_plugin.join_forked_engine(config, parent)
    assert config.additional_config[fingerprint.ENGINE_KEY]["digest"] == digest
    assert config.additional_config[fingerprint.ENGINE_KEY]["settings"]["rpa_kernel"] == "xla"
    assert vllm_plugin.state() == vllm_plugin.PluginState(True, "compat", "set up", pid=__import__("os").getpid(),
                                                          role="engine", fingerprint=digest,
                                                          settings=parent.settings)  # fmt: skip


def test_the_process_that_starts_the_engines_passes_the_configs_settings_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The API server (or the user's LLM process) makes the config's settings its environment before it starts the
    engine cores and API servers, which inherit it; a contradicting variable is refused as in any process."""
    import os

    from maxtext_compat.serve import vllm_plugin

    _clean(monkeypatch)
    monkeypatch.setattr(vllm_plugin, "_STATE", vllm_plugin.PluginState(True, "compat", "", pid=os.getpid(),
                                                                       settings=settings.effective()))  # fmt: skip
    config = types.SimpleNamespace(additional_config={"maxtext_compat": {"disable_request_shim": True}})
    assert vllm_plugin.frontend_settings(config) == {"MAXTEXT_COMPAT_DISABLE_REQUEST_SHIM": "1"}
    assert os.environ["MAXTEXT_COMPAT_DISABLE_REQUEST_SHIM"] == "1"
    monkeypatch.setenv("MAXTEXT_COMPAT_DISABLE_REQUEST_SHIM", "0")
    with pytest.raises(ServingConfigError, match="disagree"):
        vllm_plugin.frontend_settings(config)
