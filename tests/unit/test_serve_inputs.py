"""`maxtext-compat serve` refuses bad flags, bad --additional-config and a bad model directory up front.

Found: these reached vLLM as raw ValueError/TypeError/RecursionError (or silently: `1.5` layers became 1, a
duplicated JSON key kept its last value), or as a raw traceback ~40 s into vLLM's start-up for a missing or
broken model directory. `build_command` starts nothing, so each case shows the refusal comes first.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from maxtext_compat.errors import InvalidArgumentError, InvalidArgumentTypeError
from maxtext_compat.serve import command as serve_cli
from maxtext_compat.serving.serve_inputs import check_model_dir, int_setting, parse_additional_config, positive_int

ARCH = {"architectures": ["MaxTextForCausalLM"]}


def _cmd(argv: list[str], environ: dict[str, str] | None = None) -> object:
    ns, rest = serve_cli.build_parser().parse_known_args(["--vllm-bin", "vllm", *argv])
    return serve_cli.build_command(ns, rest, environ=environ or {"JAX_PLATFORMS": "cpu"})


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(ARCH))
    return tmp_path


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("{not json", "Expecting property name"),
        ('{"a": 1, "a": 2}', "duplicate key 'a'"),
        ('{"x": NaN}', "NaN is not a JSON number"),
        ('{"x": 1e999}', "out of range"),
        ("[" * 100_000 + "]" * 100_000, "nested"),
        ('{"a": ' * 40 + "1" + "}" * 40, "nested 41 levels deep"),
    ],
    ids=["syntax", "duplicate-key", "nan", "infinite-float", "recursion", "too-deep"],
)
def test_bad_additional_config_json_is_refused(raw, words):
    with pytest.raises(InvalidArgumentError) as e:
        parse_additional_config(raw)
    assert e.value.argument == "--additional-config" and words in str(e.value)


@pytest.mark.parametrize(("raw", "found"), [("[1, 2]", "a JSON list"), ('{"maxtext_config": [1]}', "a JSON list")])
def test_additional_config_and_maxtext_config_must_be_objects(raw, found):
    with pytest.raises(InvalidArgumentTypeError, match=found):
        parse_additional_config(raw)


@pytest.mark.parametrize("value", [True, 1.5, "8", 0, -1])
def test_whole_number_settings_refuse_bools_floats_strings_and_small_values(value):
    with pytest.raises(InvalidArgumentError) as e:
        int_setting({"num_decoder_layers": value}, "num_decoder_layers")
    assert e.value.argument == "--additional-config maxtext_config.num_decoder_layers"
    assert json.dumps(value) in str(e.value)


@pytest.mark.parametrize("raw", ["0", "-2", "1.5", "２", " 2", "4097", ""])
def test_parallelism_flags_take_ascii_whole_numbers_in_range(raw):
    with pytest.raises(InvalidArgumentError, match="--tensor-parallel-size"):
        positive_int("--tensor-parallel-size", raw)
    assert positive_int("--tensor-parallel-size", "3") == 3


def test_a_flag_given_last_without_its_value_is_refused(model_dir):
    with pytest.raises(InvalidArgumentError, match="--additional-config is given without a value"):
        _cmd([str(model_dir), "--additional-config"])


def test_missing_model_dir_is_refused_before_vllm(tmp_path):
    with pytest.raises(InvalidArgumentError) as e:
        _cmd([str(tmp_path / "nope")])
    assert e.value.argument == "model" and "does not exist" in str(e.value)


@pytest.mark.parametrize(
    ("write", "words"),
    [
        (lambda d: None, "has no config.json"),
        (lambda d: (d / "config.json").write_text("{broken"), "not valid JSON"),
        (
            lambda d: (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]})),
            "does not name",
        ),
        (lambda d: (d / "config.json").write_text("[]"), "a JSON list"),
        (lambda d: (d / "config.json").write_bytes(b"\xff\xfe{}"), "not UTF-8"),
        (lambda d: (d / "config.json").mkdir(), "not a regular file"),
        (lambda d: os.mkfifo(d / "config.json"), "not a regular file"),
    ],
    ids=["missing", "broken-json", "other-architecture", "not-an-object", "not-utf8", "a-directory", "a-fifo"],
)
def test_broken_model_dir_is_refused_before_vllm(tmp_path, write, words):
    write(tmp_path)
    with pytest.raises(InvalidArgumentError) as e:
        check_model_dir(str(tmp_path))
    assert e.value.argument == "model" and words in str(e.value)


def test_empty_model_path_is_refused():
    with pytest.raises(InvalidArgumentError, match="the model path is empty"):
        _cmd(["  "])


def test_a_good_model_dir_passes(model_dir):
    assert check_model_dir(str(model_dir)) == ARCH
