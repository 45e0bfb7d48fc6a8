"""Pure logic of the serving layer: runner arguments, config derivation, weights plan, greedy loop,
config.json, the `serve` command line, backend selection, the CPU shim's switches, the plugin's skip.

No jax, MaxText, tpu-inference or vLLM needed (runs in the light `unit` environment too).
"""

from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest

from maxtext_compat.errors import (
    BackendUnavailableError,
    InvalidArgumentError,
    ServingConfigError,
    ServingError,
    WeightsUnavailableError,
)

# --------------------------------------------------------------------------------- runner_args


def test_runner_args_by_release_layout() -> None:
    from maxtext_compat.serving.runner_args import split_runner_args

    lm = (("layer.0", 0), ("layer.1", 1))
    new = split_runner_args(["emb", "pos", lm, None, None, True, True], {"shared_attention_metadata": None})
    assert (new.inputs_embeds, new.input_positions, new.layer_name_to_kvcache_index) == ("emb", "pos", lm)
    old = split_runner_args([None, lm, None], {})
    assert old.layer_name_to_kvcache_index == lm and old.input_positions is None
    assert split_runner_args([], {}).layer_name_to_kvcache_index is None


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ([None, None, None, "lora"], {}, "LoRA"),
        ([None, None, None, None, None, True, False], {}, "pipeline"),
        ([None] * 8, {}, "more positional"),
        ([], {"spec_step_idx": 3}, "spec_step_idx"),
    ],
)
def test_runner_args_refuse_what_the_model_would_ignore(args: list, kwargs: dict, match: str) -> None:
    from maxtext_compat.serving.runner_args import split_runner_args

    with pytest.raises(ServingError, match=match):
        split_runner_args(args, kwargs)


def test_layer_cache_indices_gather_scatter() -> None:
    from maxtext_compat.serving.runner_args import gather, layer_cache_indices, scatter

    idx = layer_cache_indices((("layer.1", 0), ("layer.0", 2), ("aux", 1)), 2, 3)
    assert idx == [2, 0]
    phys = ["p0", "p1", "p2"]
    assert gather(phys, idx) == ["p2", "p0"]
    assert scatter(phys, ["L0", "L1"], idx) == ["L1", "p1", "L0"]
    assert layer_cache_indices(None, 2, 2) == [0, 1]
    assert layer_cache_indices({"layer.0": 0, "layer.1": 0}, 2, 1) == [0, 0]  # KV sharing


@pytest.mark.parametrize(
    ("layer_map", "layers", "caches", "match"),
    [
        (None, 2, 3, "wrong length"),
        ((("layer.0", 0),), 2, 2, "missing \\[1\\]"),
        ((("layer.0", 0), ("layer.1", 5)), 2, 2, "outside"),
        ((("layer.0", 0), ("layer.1", 1), ("layer.2", 1)), 2, 2, "extra \\[2\\]"),
    ],
)
def test_layer_cache_indices_errors(layer_map: object, layers: int, caches: int, match: str) -> None:
    from maxtext_compat.serving.runner_args import layer_cache_indices

    with pytest.raises(ServingError, match=match):
        layer_cache_indices(layer_map, layers, caches)


# --------------------------------------------------------------------------------- config


def test_kv_heads_padded_to_tp_like_maxtext() -> None:
    from maxtext_compat.serving.config import padded_kv_heads

    assert padded_kv_heads(1, 2) == 2
    assert padded_kv_heads(2, 8) == 8
    assert padded_kv_heads(4, 4) is None
    assert padded_kv_heads(3, 2) is None  # not a multiple: left to tpu-inference's own check
    assert padded_kv_heads(8, 1) is None


def test_overrides_copy_pad_and_dummy() -> None:
    from maxtext_compat.serving.config import ServingShape, overrides_from

    mc = {"model_name": "default", "load_parameters_path": "/ckpt"}
    shape = ServingShape("dummy", tp=2, num_kv_heads=1, additional_config={"maxtext_config": mc})
    ov = overrides_from(shape)
    assert ov.values == {"model_name": "default", "load_parameters_path": "", "base_num_kv_heads": 2}
    assert mc["load_parameters_path"] == "/ckpt"  # vLLM's dict is not mutated
    assert any("ignoring load_parameters_path" in n for n in ov.notes)
    assert overrides_from(ServingShape("auto")).values == {}
    with pytest.raises(ServingConfigError, match="JSON object"):
        overrides_from(ServingShape("auto", additional_config={"maxtext_config": [1]}))


def _facts(**kw: object) -> dict:
    base = {"num_decoder_layers": 2, "num_kv_heads": 2, "head_dim": 128, "vocab_size": 256, "dtype": "float32"}
    return {**base, **kw}


def test_config_json_and_maxtext_must_agree() -> None:
    from maxtext_compat.serving.config import check_consistency

    hf = {"num_hidden_layers": 2, "num_key_value_heads": 1, "head_dim": 128, "vocab_size": 256}
    check_consistency(maxtext=_facts(), hf=hf, tp=2, cache_dtype="float32")
    with pytest.raises(ServingConfigError, match=r"layers.*KV heads"):
        check_consistency(maxtext=_facts(num_decoder_layers=3), hf=hf, tp=1, cache_dtype=None)
    with pytest.raises(ServingConfigError, match="--dtype float32"):
        check_consistency(maxtext=_facts(), hf=hf, tp=2, cache_dtype="bfloat16")


def test_dtype_names() -> None:
    from maxtext_compat.serving.config import dtype_name

    assert dtype_name("torch.bfloat16") == "bfloat16"
    assert dtype_name("float32") == "float32"
    assert dtype_name(types.SimpleNamespace(name="float16")) == "float16"
    assert dtype_name("int8") is None and dtype_name(None) is None


# --------------------------------------------------------------------------------- weights


def test_weights_plan(tmp_path: Path) -> None:
    from maxtext_compat.serving.weights import plan

    assert plan("dummy", "/nowhere").kind == "random"
    with pytest.raises(WeightsUnavailableError, match="no weights"):
        plan("auto", "")
    with pytest.raises(WeightsUnavailableError, match="does not exist"):
        plan("auto", str(tmp_path / "missing"))
    with pytest.raises(WeightsUnavailableError, match="not an orbax checkpoint"):
        plan("auto", str(tmp_path))
    (tmp_path / "_METADATA").write_text("{}")
    assert plan("auto", str(tmp_path)).kind == "checkpoint"
    assert plan("auto", "gs://bucket/ckpt/0/items").path == "gs://bucket/ckpt/0/items"


# --------------------------------------------------------------------------------- reference


def test_greedy_decode_feeds_back_its_tokens() -> None:
    from maxtext_compat.decode.greedy import greedy_decode

    vocab = 10
    calls = []

    def logits_fn(batch: list[list[int]]) -> list:
        calls.append([list(r) for r in batch])
        # next token = (token at this position + 1) % vocab
        return [[[1.0 if v == (t + 1) % vocab else 0.0 for v in range(vocab)] for t in row] for row in batch]

    out = greedy_decode(logits_fn, [[3], [7, 8]], 3, length=6)
    assert out == [[4, 5, 6], [9, 0, 1]]
    assert all(len(r) == 6 for b in calls for r in b)
    with pytest.raises(InvalidArgumentError, match="too short"):
        greedy_decode(logits_fn, [[1, 2, 3, 4, 5]], 3, length=6)


# --------------------------------------------------------------------------------- model dir


def test_model_dir_config_json(tmp_path: Path) -> None:
    from maxtext_compat.serving.model_dir import hf_config, write_model_dir
    from maxtext_compat.testing.tiny import TINY

    write_model_dir(str(tmp_path), TINY)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["MaxTextForCausalLM"] and cfg["model_type"] == "llama"
    assert (cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["vocab_size"]) == (2, 1, 256)
    with pytest.raises(InvalidArgumentError, match="missing"):
        hf_config({"vocab_size": 3})


# --------------------------------------------------------------------------------- serve CLI

SEED_FLAGS = [
    "/models/llama",
    "--additional-config",
    json.dumps(
        {
            "maxtext_config": {
                "model_name": "llama3.1-8b",
                "max_prefill_predict_length": 28,
                "max_target_length": 32,
                "ici_tensor_parallelism": 4,
                "load_parameters_path": "gs://bucket/ckpt/0/items",
            }
        }
    ),
]


def _cmd(argv: list[str], environ: dict[str, str]) -> object:
    from maxtext_compat.serve import command as serve_cli

    ns, rest = serve_cli.build_parser().parse_known_args(["--vllm-bin", "vllm", *argv])
    return serve_cli.build_command(ns, rest, environ=environ)


@pytest.fixture
def seed_flags(tmp_path: Path) -> list[str]:
    """SEED_FLAGS with a real model directory (serve checks its config.json before starting vLLM)."""
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["MaxTextForCausalLM"]}))
    return [str(model), *SEED_FLAGS[1:]]


def test_serve_accepts_the_seed_flags_unchanged(seed_flags: list[str]) -> None:
    cmd = _cmd(seed_flags, {"JAX_PLATFORMS": "cpu"})
    assert cmd.argv[:3] == ["vllm", "serve", seed_flags[0]]
    assert cmd.argv[3:5] == SEED_FLAGS[1:3]  # passed through verbatim
    assert cmd.argv[cmd.argv.index("--tensor-parallel-size") + 1] == "4"
    assert cmd.argv[cmd.argv.index("--host") + 1] == "127.0.0.1"
    assert cmd.env_changes["NEW_MODEL_DESIGN"] == "1"
    assert cmd.env_changes["XLA_FLAGS"] == "--xla_force_host_platform_device_count=4"
    assert cmd.env_changes["TPU_ACCELERATOR_TYPE"] == "cpu"


def test_serve_user_values_win_and_tpu_hosts_get_no_cpu_env(seed_flags: list[str]) -> None:
    cmd = _cmd([*seed_flags, "--host=0.0.0.0", "-tp", "2"], {"NEW_MODEL_DESIGN": "0"})
    assert "--tensor-parallel-size" not in cmd.argv and "127.0.0.1" not in cmd.argv
    assert cmd.env_changes == {}


def test_serve_tiny_writes_the_model_dir(tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    extra = '{"maxtext_config": {"vocab_size": 512}}'
    cmd = _cmd([str(model), "--tiny", "--port", "8123", "--additional-config", extra], {"JAX_PLATFORMS": "cpu"})
    cfg = json.loads((model / "config.json").read_text())
    assert cfg["vocab_size"] == 512 and cfg["architectures"] == ["MaxTextForCausalLM"]
    argv = cmd.argv
    mc = json.loads(argv[argv.index("--additional-config") + 1])["maxtext_config"]
    assert mc["vocab_size"] == 512 and mc["model_name"] == "default" and mc["dtype"] == "float32"
    for flag in ("--load-format", "--skip-tokenizer-init", "--num-gpu-blocks-override", "--max-model-len"):
        assert flag in argv
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert cmd.env_changes["HF_HUB_OFFLINE"] == "1"


def _converted_dir(tmp_path: Path, maxtext: object) -> Path:
    """What `maxtext-compat convert` writes that `serve` reads (config.json + maxtext_config.json)."""
    model = tmp_path / "smollm2"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["MaxTextForCausalLM"]}))
    (model / "maxtext_config.json").write_text(maxtext if isinstance(maxtext, str) else json.dumps(maxtext))
    return model


def test_serve_takes_a_converted_models_maxtext_config_and_yours_win(tmp_path: Path) -> None:
    model = _converted_dir(tmp_path, {"base_emb_dim": 576, "dtype": "float32", "load_parameters_path": "/a/ckpt"})
    extra = '{"maxtext_config": {"load_parameters_path": "/b/ckpt", "max_target_length": 32}}'
    cmd = _cmd([str(model), "--additional-config", extra], {"JAX_PLATFORMS": "cpu"})
    mc = json.loads(cmd.argv[cmd.argv.index("--additional-config") + 1])["maxtext_config"]
    assert mc == {"base_emb_dim": 576, "dtype": "float32", "load_parameters_path": "/b/ckpt", "max_target_length": 32}
    assert cmd.argv.count("--additional-config") == 1
    assert cmd.argv[cmd.argv.index("--dtype") + 1] == "float32"  # the KV cache must match MaxText's dtype
    assert any("maxtext_config.json" in n for n in cmd.notes)
    given = _cmd([str(model), "--dtype", "bfloat16"], {"JAX_PLATFORMS": "cpu"})
    assert given.argv.count("--dtype") == 1 and given.argv[given.argv.index("--dtype") + 1] == "bfloat16"


@pytest.mark.parametrize(
    ("tokenizer_file", "flags", "skipped"),
    [(None, [], True), ("tokenizer.json", [], False), ("tokenizer.model", [], False),
     (None, ["--tokenizer", "/t"], False), (None, ["--tokenizer=/t"], False), (None, ["--skip-tokenizer-init"], True)],
)  # fmt: skip
def test_serve_skips_the_tokenizer_only_where_there_is_none(tmp_path: Path, tokenizer_file, flags, skipped) -> None:
    """A model directory without a tokenizer (a trained checkpoint converted without --tokenizer) serves token ids;
    a tokenizer in the directory or named by --tokenizer is never switched off."""
    model = _converted_dir(tmp_path, {"dtype": "float32"})
    if tokenizer_file:
        (model / tokenizer_file).write_text("{}")
    argv = _cmd([str(model), *flags], {"JAX_PLATFORMS": "cpu"}).argv
    assert argv.count("--skip-tokenizer-init") == (1 if skipped else 0), argv


@pytest.mark.parametrize("content", ["{not json", "[1, 2]"])
def test_serve_refuses_a_broken_maxtext_config_json(tmp_path: Path, content: str) -> None:
    model = _converted_dir(tmp_path, content)
    with pytest.raises(InvalidArgumentError) as err:
        _cmd([str(model)], {"JAX_PLATFORMS": "cpu"})
    assert err.value.argument == "maxtext_config.json" and "convert" in str(err.value)


def test_serve_refuses_an_unknown_rpa_kernel_before_starting(seed_flags: list[str]) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        _cmd(seed_flags, {"JAX_PLATFORMS": "cpu", "MAXTEXT_COMPAT_RPA_KERNEL": "Pallas "})
    assert err.value.argument == "MAXTEXT_COMPAT_RPA_KERNEL" and "'Pallas '" in str(err.value)


def test_rpa_kernel_choice() -> None:
    from maxtext_compat import platforms

    assert platforms.kernel_choice("") is None
    assert platforms.kernel_choice("XLA") == "xla" and platforms.kernel_choice("pallas") == "pallas"
    for bad in ("fast", "1", "xla,pallas"):
        with pytest.raises(InvalidArgumentError, match="names no RPA kernel"):
            platforms.kernel_choice(bad)


def test_serve_tiny_refuses_to_overwrite_another_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(InvalidArgumentError, match="overwrite"):
        _cmd([str(tmp_path), "--tiny"], {})


def test_serve_needs_a_model() -> None:
    with pytest.raises(InvalidArgumentError, match="no model"):
        _cmd(["--port", "1"], {})


# --------------------------------------------------------------------------------- backends


def _row(vllm: bool) -> object:
    return types.SimpleNamespace(name="9.9.9", vllm=object() if vllm else None)


def test_backend_selection_by_row() -> None:
    from maxtext_compat.serving import backend

    assert backend.entry_for(_row(True)).name == "native"
    assert backend.entry_for(_row(False)).name == "backport"
    try:
        import maxtext_compat.serving.backport_backend  # noqa: F401
    except ImportError:
        with pytest.raises(BackendUnavailableError, match="backport"):
            backend.backend_for(_row(False))


def test_register_backend_overrides_builtin() -> None:
    from maxtext_compat.serving import backend

    class Fake(backend.ServingBackend):
        name = "fake"
        load_config = create_model = forward = compute_logits = embed = embedding_table = None  # type: ignore[assignment]
        save_checkpoint = dense_logits_fn = None  # type: ignore[assignment]

    Fake.__abstractmethods__ = frozenset()
    try:
        backend.register_backend("fake", Fake, applies=lambda row: row.vllm is None)
        assert isinstance(backend.backend_for(_row(False)), Fake)
    finally:
        backend._ENTRIES[:] = [e for e in backend._ENTRIES if e.name != "fake"]
        backend.reset_backends(["fake"])


# --------------------------------------------------------------------------------- CPU shim switches


def test_cpu_shim_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    from maxtext_compat import platforms
    from maxtext_compat.cpu import serving as cpu_serving

    assert platforms.disabled_parts("") == ()
    assert platforms.disabled_parts("1") == platforms.PARTS
    assert platforms.disabled_parts("rpa, hbm") == ("rpa", "hbm")
    with pytest.raises(InvalidArgumentError, match="unknown parts"):
        platforms.disabled_parts("kernel")
    monkeypatch.setattr(platforms, "configured_platforms", lambda: ("tpu",))
    status = cpu_serving.install()
    assert not status.active and "not cpu" in status.reason and not cpu_serving.installed()


def test_plugin_skips_cleanly_without_the_serving_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from maxtext_compat.serve import vllm_plugin

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "tpu_inference" else real(n, *a))
    monkeypatch.setattr(vllm_plugin, "_STATE", None)
    vllm_plugin.register()
    st = vllm_plugin.state()
    assert st is not None and not st.registered and "tpu_inference" in st.reason and st.pid == os.getpid()
    with pytest.raises(InvalidArgumentError, match="MAXTEXT_COMPAT_VLLM_MODEL"):
        monkeypatch.setenv("MAXTEXT_COMPAT_VLLM_MODEL", "other")
        vllm_plugin.model_choice()


def test_doctor_shows_the_rpa_kernel_or_the_bad_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from maxtext_compat import doctor

    monkeypatch.delenv("MAXTEXT_COMPAT_RPA_KERNEL", raising=False)
    line = [ln for ln in doctor.render(doctor.collect()).splitlines() if "RPA kernel" in ln]
    assert line == [line[0]] and "xla where tpu-inference (a checked release) binds the v3 kernels" in line[0]
    monkeypatch.setenv("MAXTEXT_COMPAT_RPA_KERNEL", "pallas")
    assert "RPA kernel on CPU servers: pallas" in doctor.render(doctor.collect())
    monkeypatch.setenv("MAXTEXT_COMPAT_RPA_KERNEL", "fast")
    report = doctor.collect()
    assert report["rpa_kernel"]["error"]["type"] == "InvalidArgumentError"
    assert "RPA kernel on CPU: ERROR InvalidArgumentError" in doctor.render(report)


@pytest.mark.parametrize("raw", ["0", "-1", "two", "nan", "inf", "1e400", str(2**21)])
def test_a_cpu_hbm_size_that_is_not_gib_is_refused(raw):
    from maxtext_compat import platforms

    with pytest.raises(InvalidArgumentError, match=platforms.HBM_ENV) as e:
        platforms.cpu_hbm_bytes(raw)
    assert repr(raw) in str(e.value) and "Fix:" in str(e.value)


def test_the_cpu_hbm_size_defaults_to_2_gib_and_takes_fractions(monkeypatch):
    from maxtext_compat import platforms

    monkeypatch.delenv(platforms.HBM_ENV, raising=False)
    assert platforms.cpu_hbm_bytes() == platforms.cpu_hbm_bytes("") == 2 << 30
    assert platforms.cpu_hbm_bytes("0.5") == 1 << 29
    monkeypatch.setenv(platforms.HBM_ENV, "1")
    assert platforms.cpu_hbm_bytes() == 1 << 30
