"""`maxtext-compat facts` on trees written here: each rule of the reader, and the bad inputs it refuses.

The real releases are read in tests/compat/test_facts.py (every environment with MaxText); here a tiny MaxText
of a few files, built as a wheel and as a source tree, shows the edge cases a real release does not: a renamed
kv_cache parameter, an added keyword-only argument, returns inside nested functions, the curried RPA call.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from maxtext_compat import cli
from maxtext_compat.errors import InvalidArgumentError
from maxtext_compat.matrix import load_matrix
from maxtext_compat.matrix.facts import differences, read_facts, row_facts

pytestmark = pytest.mark.envs("unit")

ATTENTION = """
class Attention:
  def __call__(self, inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, out_sharding=None, *,
               model_mode="train", deterministic=False, rope_kwargs=None, kv_cache=None, attention_metadata=None,
               shared_key=None, shared_value=None{extra}):
    if self.config.attention in ("vllm_rpa", "vllm_batched_rpa"):
      out, kv_cache = self.forward_serve_vllm(q, k, v, kv_cache, attention_metadata)
    def helper():
      return 1, 2, 3
    return out, kv_cache

  def forward_serve_vllm(self, query, key, value, rpa_kv_cache=None, rpa_metadata=None):
    from tpu_inference.layers.common.attention_interface import sharded_ragged_paged_attention as rpa_ops
    if rpa_kv_cache is None:
      return query, []
    {call}
    return output, kv_cache
"""
FLAT = "output, kv_cache = rpa_ops(self.mesh, query, key, value, rpa_kv_cache, update_kv_cache=True)"
CURRIED = "kv_cache, output = rpa_ops(1.0, self.mesh)(query, key, value, rpa_kv_cache)"
FILES = {
    "maxtext/__init__.py": "",
    "maxtext/layers/attention_op.py": "class AttentionOp:\n  def __call__(self, query): return query\n",
    "maxtext/layers/attention_mla.py": "class MLA:\n  pass\n",
    "maxtext/layers/nnx_decoders.py": (
        "class NNXDecoderLayer:\n"
        "  def __call__(self, inputs, ids, pos, det, mode, kv_cache=None, attention_metadata=None):\n"
        "    return y, kv_cache\n"
        "class NNXDecoder:\n"
        "  def __call__(self, emb, tokens, pos, kv_caches=None, attention_metadata=None):\n"
        '    md = attention_metadata.get(f"layer.{i}")\n'
        "    return logits, hidden_state, kv_caches\n"
    ),
    "maxtext/models/llama2.py": (
        "class LlamaDecoderLayer:\n"
        "  def __call__(self, inputs, ids, pos, det, mode, kv_cache=None, attention_metadata=None):\n"
        "    if carry:\n      return (layer_output, stacked_kv_cache, layer_idx + 1), None\n"
        "    return layer_output, kv_cache\n"
    ),
    "maxtext/models/qwen3.py": "class Qwen3DecoderLayer:\n  def __call__(self, inputs):\n    return y, kv_cache\n",
    "maxtext/models/gemma3.py": (
        "class Gemma3DecoderLayer:\n  def __call__(self, inputs):\n    return (y, s, i + 1), None\n"
    ),
    "maxtext/models/models.py": (
        "class Transformer:\n  def __call__(self, tokens, kv_caches=None):\n"
        "    if vllm:\n      return hidden_state, kv_caches\n    return logits\n"
    ),
    "maxtext/configs/pyconfig.py": "def initialize(argv): pass\n",
    "maxtext/configs/base.yml": "pure_nnx_decoder: true\n",
    "maxtext/configs/inference/vllm.yml": "attention: vllm_rpa\n",
    "maxtext/integration/vllm/maxtext_vllm_adapter/adapter.py": (
        "class MaxTextForCausalLM:\n  def __call__(self, kv_caches, input_ids, md):\n"
        "    return kv_caches, hidden, [], None\n"
    ),
    "dependencies/extra_deps/post_train_github_deps.txt": (
        "tpu-inference @ https://github.com/vllm-project/tpu-inference/archive/" + "ab" * 20 + ".zip\n"
    ),
}
METADATA = (
    "Metadata-Version: 2.4\nName: maxtext\nVersion: 0.2.5\nProvides-Extra: tpu\n"
    "Requires-Dist: jax>=0.11.1; extra == 'tpu'\nRequires-Dist: numpy\n"
)


def _files(extra: str = "", call: str = FLAT, rename: str | None = None) -> dict[str, str]:
    text = ATTENTION.format(extra=extra, call=call)
    if rename:
        text = text.replace("kv_cache=None", f"{rename}=None")
    return {**FILES, "maxtext/layers/attentions.py": text}


def _wheel(folder: Path, files: dict[str, str]) -> Path:
    path = folder / "maxtext-0.2.5-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        zf.writestr("maxtext-0.2.5.dist-info/METADATA", METADATA)
    return path


def _tree(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "src" / name).write_text(text)
    (folder / "pyproject.toml").write_text(
        '[project]\nname = "maxtext"\nversion = "0.2.5"\ndependencies = ["numpy"]\n'
        '[project.optional-dependencies]\ntpu = ["jax>=0.11.1"]\n'
    )
    return folder


def test_a_tiny_release_reads_as_the_0_2_5_row_as_a_wheel_and_as_a_tree(tmp_path):
    """The tiny tree follows 0.2.5's code (generic NNX layer, no Linen decoder): its facts are that row's."""
    shipped = row_facts(load_matrix().row("0.2.5"))
    (tmp_path / "w").mkdir()
    for found in (read_facts(_wheel(tmp_path / "w", _files())), read_facts(_tree(tmp_path / "t", _files()))):
        assert differences(found.row, shipped) == {}, found.kind
        assert found.version == "0.2.5"
        assert found.requirements == ['jax>=0.11.1; extra == "tpu"']
        assert found.github_pins[0]["commit"] == "ab" * 20 and found.github_pins[0]["package"] == "tpu-inference"
    # the nested helper's 3-tuple is not Attention's return: its returns stay (out, kv_cache)
    assert found.row["returns"]["attention"] == "(out, kv_cache)"


def test_a_renamed_kv_cache_parameter_differs_from_the_row_by_that_parameter(tmp_path):
    found = read_facts(_wheel(tmp_path, _files(rename="kv_cache_in")))
    diff = differences(found.row, row_facts(load_matrix().row("0.2.5")))
    assert diff["params.attention"][1] == sorted([*diff["params.attention"][0], "kv_cache"])
    assert diff["convention"] == ("legacy", "kv_scan_carry")
    assert "kv_cache_in" in [p["name"] for p in found.signatures["attention"]]


def test_an_added_keyword_only_argument_leaves_the_code_facts_alone(tmp_path):
    found = read_facts(_wheel(tmp_path, _files(extra=", my_flag=False")))
    assert differences(found.row, row_facts(load_matrix().row("0.2.5"))) == {}
    assert {"name": "my_flag", "keyword_only": True, "has_default": True} in found.signatures["attention"]


def test_the_curried_entry_point_and_the_old_return_order_are_read(tmp_path):
    files = _files(call=CURRIED)
    files["maxtext/layers/attentions.py"] = files["maxtext/layers/attentions.py"].replace(
        "return output, kv_cache", "return kv_cache, output"
    )  # 0.2.0's order, before #3372
    vllm = read_facts(_wheel(tmp_path, files)).row["vllm"]
    assert (vllm["rpa_call_form"], vllm["serve_return_order"], vllm["update_kv_cache_kwarg"]) == (
        "curried", "(kv, out)", False,
    )  # fmt: skip


def test_the_cli_prints_a_draft_row_and_pin_set_and_json(tmp_path, capsys):
    wheel = _wheel(tmp_path, _files())
    assert cli.main(["facts", str(wheel)]) == 0
    out = capsys.readouterr().out
    assert '  - release: "0.2.5"' in out and "    convention: kv_scan_carry" in out
    assert "  maxtext-0.2.5:" in out and "      - jax>=0.11.1  # TODO" in out
    assert "tpu-inference: MaxText pins commit ababababa" in out
    assert cli.main(["facts", str(wheel), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["row"]["import_root"] == "maxtext"


@pytest.mark.parametrize(
    "make, found",
    [
        (lambda p: p / "missing.whl", "no such file or folder"),
        (lambda p: (p / "notes.txt").write_text("x") and p / "notes.txt", "notes.txt"),
        (lambda p: p, "holds no MaxText package"),
    ],
    ids=["missing", "not-a-wheel", "folder-without-maxtext"],
)
def test_a_source_that_is_no_release_is_a_typed_error(tmp_path, make, found):
    with pytest.raises(InvalidArgumentError) as err:
        read_facts(make(tmp_path))
    assert err.value.argument == "SOURCE" and err.value.fix
    assert found in str(err.value)


def test_a_wheel_without_the_layers_is_refused_by_name(tmp_path):
    with pytest.raises(InvalidArgumentError, match="holds no MaxText layers") as err:
        read_facts(_wheel(tmp_path, {"maxtext/__init__.py": ""}))
    assert "maxtext/layers/attentions.py" in str(err.value.expected)


def test_installed_without_maxtext_is_a_typed_error():
    """The unit environment has no MaxText."""
    with pytest.raises(InvalidArgumentError, match="not installed") as err:
        read_facts("installed")
    assert err.value.fix
