"""`maxtext_compat.convert.convert`: SmolLM2 -> a model directory the installed MaxText and vLLM read.

The checkpoint is restored by the release's *own* loader from `load_parameters_path` (0.2.5: `from_pretrained`;
0.1.0: `setup_decode_state` with its Linen Transformer, as its MaxEngine does), scanned and unscanned, and
greedy-decodes exactly what transformers decodes reading the GGUF file itself. A Hugging Face safetensors
directory converts to the same tensors; failures leave nothing that looks like a model directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

from maxtext_compat import convert  # noqa: E402
from maxtext_compat.decode.greedy import greedy_decode  # noqa: E402
from maxtext_compat.errors import InvalidArgumentError, WeightsMismatchError  # noqa: E402
from maxtext_compat.testing import real_model as rm  # noqa: E402

# In the backport's environment make test-extended's: make test converts there through the trained checkpoint
# (test_serve_trained_checkpoint) and runs this file on 0.2.5 (and its scanned case on 0.2.4).
pytestmark = [
    pytest.mark.needs_maxtext,
    pytest.mark.envs("maxtext-0.2.5", "maxtext-0.1.0-jax011"),
    pytest.mark.extended_in("maxtext-0.1.0-jax011"),
]

MODEL_FILES = {"checkpoint", "config.json", "generation_config.json", "maxtext_config.json", "tokenizer.json",
               "tokenizer_config.json"}  # fmt: skip


# The scanned checkpoint runs in maxtext-0.2.4, in make test-extended (maxtext-0.2.5's pins; 0.2.x loads it alike;
# make test holds the unscanning through the trained checkpoint, test_serve_trained_checkpoint):
# the unscanned one is the session's conversion that maxtext-0.2.5's and the backport's servers read anyway.
@pytest.fixture(
    scope="module",
    params=[False, pytest.param(True, marks=[pytest.mark.envs("maxtext-0.2.4"), pytest.mark.extended])],
    ids=["unscanned", "scanned"],
)
def converted(request, tmp_path_factory):
    if not request.param:
        return request.getfixturevalue("smollm2_dir"), False  # the session's conversion (serving tests share it)
    out = tmp_path_factory.mktemp("smollm2-scanned") / "model"
    return convert.convert(rm.smollm2_gguf(), out, scan_layers=True), True


def test_the_directory_holds_what_vllm_and_maxtext_read(converted, smollm2):
    result, scanned = converted
    out = Path(result.out)
    assert set(result.files) == MODEL_FILES == {p.name for p in out.iterdir()}
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no staging left behind
    cfg = json.loads((out / "config.json").read_text())
    s = smollm2[0].shape
    assert cfg["architectures"] == ["MaxTextForCausalLM"]
    sizes = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")
    assert [cfg[k] for k in sizes] == [s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.vocab]
    assert cfg["rope_theta"] == s.rope_theta and cfg["tie_word_embeddings"] is True
    mt = json.loads((out / "maxtext_config.json").read_text())
    assert mt["load_parameters_path"] == f"{out}/checkpoint" and mt["scan_layers"] is scanned
    assert "max_target_length" not in mt  # the server's lengths come from its own command
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen == {"bos_token_id": s.bos_token_id, "eos_token_id": s.eos_token_id}


def test_transformers_reads_the_tokenizer_files_as_it_reads_the_gguf_file(converted, reference):
    """vLLM loads the tokenizer through transformers: the written files give the reference's ids and text."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(converted[0].out)
    assert [tok(p).input_ids for p in rm.PROMPTS] == reference[2]
    assert tok.decode(reference[1][1]).startswith(" Paris")
    assert tok.eos_token == "<|im_end|>" and tok.chat_template


def test_maxtexts_own_loader_greedy_decodes_the_reference(converted, reference):
    result, scanned = converted
    cfg, logits = rm.loaded_by_maxtext(result.out)
    assert bool(cfg.scan_layers) is scanned and cfg.load_parameters_path == result.checkpoint
    got = greedy_decode(logits, reference[2], rm.NEW_TOKENS, length=int(cfg.max_target_length))
    for prompt, ours, want in zip(rm.PROMPTS, got, reference[1], strict=True):
        assert ours == want, f"{prompt!r}: {ours} vs reference {want}"


# ------------------------------------------------------------------ a Hugging Face directory

# The converter's own file handling: the same on every release, so once, where it adds the least load.
ONE_RELEASE = pytest.mark.envs("maxtext-0.2.4")


@pytest.fixture(scope="module")
def hf_dir(reference, tmp_path_factory):
    """The reference model saved by transformers itself (safetensors), its tokenizer beside it."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("hf")
    # A GGUF-loaded model refuses save_pretrained (quantization config): the same weights in a plain model.
    cfg = {k: v for k, v in reference[0].config.to_dict().items() if k != "quantization_config"}
    plain = LlamaForCausalLM(LlamaConfig(**cfg))
    plain.load_state_dict(reference[0].state_dict())
    plain.save_pretrained(out)
    path = rm.smollm2_gguf()
    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(out)
    return out


@ONE_RELEASE
def test_a_safetensors_directory_reads_as_the_same_tensors(hf_dir, smollm2):
    ckpt = convert.read_hf_dir(hf_dir)
    assert ckpt.shape.layers == 30 and ckpt.shape.tied_embeddings
    assert set(ckpt.tensors) == set(smollm2[0].tensors)
    for name, want in smollm2[0].tensors.items():
        np.testing.assert_array_equal(ckpt.tensors[name], want, err_msg=name)


@ONE_RELEASE
def test_a_safetensors_directory_converts_with_its_own_tokenizer(hf_dir, tmp_path, reference):
    result = convert.convert(hf_dir, tmp_path / "m", checkpoint=False)
    assert result.checkpoint is None and "checkpoint" not in result.files
    assert "tokenizer.json" in result.files
    from transformers import AutoTokenizer

    assert [AutoTokenizer.from_pretrained(result.out)(p).input_ids for p in rm.PROMPTS] == reference[2]
    assert "load_parameters_path" not in json.loads((tmp_path / "m" / "maxtext_config.json").read_text())


def _copy_hf(hf_dir, dst, **tensors):
    """A copy of the directory with some tensors replaced (None: removed)."""
    import shutil

    from safetensors.numpy import load_file, save_file

    shutil.copytree(hf_dir, dst)
    (file,) = dst.glob("*.safetensors")
    state = load_file(str(file))
    for name, value in tensors.items():
        if value is None:
            del state[name]
        else:
            state[name] = value
    save_file(state, str(file))
    return dst


@ONE_RELEASE
def test_a_tensor_that_does_not_fit_is_named_and_nothing_is_written(hf_dir, tmp_path):
    bad = _copy_hf(hf_dir, tmp_path / "bad", **{"model.layers.3.self_attn.k_proj.weight": np.zeros((64, 576), "f4")})
    with pytest.raises(WeightsMismatchError) as err:
        convert.convert(bad, tmp_path / "out")
    msg = str(err.value)
    assert "model.layers.3.self_attn.k_proj.weight" in msg and "(192, 576)" in msg and "(64, 576)" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]


@ONE_RELEASE
def test_an_output_head_that_is_not_the_tied_embedding_is_refused(hf_dir, tmp_path):
    bad = _copy_hf(hf_dir, tmp_path / "bad", **{"lm_head.weight": np.ones((49152, 576), "f4")})
    with pytest.raises(InvalidArgumentError, match=r"lm_head\.weight"):
        convert.read_hf_dir(bad)


@ONE_RELEASE
def test_a_failure_midway_leaves_no_directory_and_keeps_the_old_one(tmp_path, mocker):
    """Fault injected after the checkpoint is written: no partial OUT, no staging dir; an existing OUT survives."""
    from maxtext_compat.convert import vllm_dir

    out = tmp_path / "model"
    convert.convert(rm.smollm2_gguf(), out, checkpoint=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    mocker.patch.object(vllm_dir, "write_model_files", side_effect=OSError("disk full"))
    with pytest.raises(OSError, match="disk full"):
        convert.convert(rm.smollm2_gguf(), out, force=True, checkpoint=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@ONE_RELEASE
def test_an_earlier_conversion_is_replaced_only_with_force(tmp_path):
    out = tmp_path / "model"
    convert.convert(rm.smollm2_gguf(), out, checkpoint=False)
    (out / "stale.txt").write_text("from before")
    with pytest.raises(InvalidArgumentError, match="not empty") as err:
        convert.convert(rm.smollm2_gguf(), out, checkpoint=False)
    assert "--force" in str(err.value) and (out / "stale.txt").is_file()
    result = convert.convert(rm.smollm2_gguf(), out, checkpoint=False, force=True)
    assert "stale.txt" not in result.files and not (out / "stale.txt").exists() and (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


@ONE_RELEASE
@pytest.mark.parametrize("where", ["a directory of your own", "the source's directory"])
def test_force_never_replaces_a_directory_a_conversion_did_not_write(tmp_path, where):
    """`--force` on the wrong path must not delete a user's directory (or the source inside it)."""
    import shutil

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    src = rm.smollm2_gguf()
    if where == "the source's directory":
        src = mine / "model.gguf"
        shutil.copy(rm.smollm2_gguf(), src)
    with pytest.raises(InvalidArgumentError) as err:
        convert.convert(src, mine, checkpoint=False, force=True)
    assert err.value.argument == "out"
    assert (mine / "notes.txt").read_text() == "keep" and sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


@ONE_RELEASE
@pytest.mark.parametrize("kind", ["text file", "missing", "output is a file"])
def test_a_source_or_output_of_the_wrong_kind_is_refused(tmp_path, kind):
    src, out = rm.smollm2_gguf(), tmp_path / "out"
    if kind == "text file":
        src = tmp_path / "model.gguf"
        src.write_text("not gguf")
    elif kind == "missing":
        src = tmp_path / "nothing"
    else:
        out.write_text("x")
    with pytest.raises(InvalidArgumentError) as err:
        convert.convert(src, out, checkpoint=False)
    assert err.value.argument == ("out" if kind == "output is a file" else "source")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        {"text file": ["model.gguf"], "missing": [], "output is a file": ["out"]}[kind]
    )


@ONE_RELEASE
def test_a_directory_without_a_tokenizer_or_a_bad_weight_dtype_is_refused(hf_dir, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(hf_dir, bare)
    for name in ("tokenizer.json", "tokenizer.model"):
        (bare / name).unlink(missing_ok=True)
    with pytest.raises(InvalidArgumentError, match="no tokenizer") as err:
        convert.convert(bare, tmp_path / "out", checkpoint=False)
    assert err.value.argument == "source" and not (tmp_path / "out").exists()
    with pytest.raises(InvalidArgumentError) as err:
        convert.convert(hf_dir, tmp_path / "out", weight_dtype="float16")
    assert err.value.argument == "weight_dtype" and "'float16'" in str(err.value)


@ONE_RELEASE
def test_a_directorys_own_chat_template_is_kept_and_a_given_one_replaces_it(hf_dir, tmp_path):
    """transformers saves the template as chat_template.jinja (4.43 and later): the conversion kept only the
    tokenizer files it named and dropped it, so the served directory had no template."""
    from transformers import AutoTokenizer

    own = AutoTokenizer.from_pretrained(hf_dir).chat_template
    assert own and "<|im_start|>" in own  # SmolLM2's, from its GGUF file
    kept = convert.convert(hf_dir, tmp_path / "kept", checkpoint=False)
    assert kept.chat_template_source == "file"
    assert AutoTokenizer.from_pretrained(kept.out).chat_template == own
    template = tmp_path / "turns.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}", encoding="utf-8")
    given = convert.convert(hf_dir, tmp_path / "given", checkpoint=False, chat_template=template)
    assert given.chat_template_source == "argument" and "in place of the source's own" in given.chat_template_note
    rendered = AutoTokenizer.from_pretrained(given.out).apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False
    )
    assert rendered == "[user] Hi\n"


@ONE_RELEASE
def test_the_cli_writes_the_given_chat_template_over_the_files_and_says_so(tmp_path):
    """SmolLM2's GGUF file carries its own template; `convert --chat-template` replaces it and the JSON names it."""
    import subprocess
    import sys

    template = tmp_path / "tokenizer_config.json"
    template.write_text(json.dumps({"chat_template": "{{ messages[0]['content'] }}"}), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "maxtext_compat.cli", "convert", str(rm.smollm2_gguf()), str(tmp_path / "m"),
         "--no-checkpoint", "--chat-template", str(template), "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["chat_template_source"] == "argument"
    assert "in place of the source's own" in result["chat_template_note"]
    written = json.loads((tmp_path / "m" / "tokenizer_config.json").read_text())
    assert written["chat_template"] == "{{ messages[0]['content'] }}"
    bad = subprocess.run(
        [sys.executable, "-m", "maxtext_compat.cli", "convert", str(rm.smollm2_gguf()), str(tmp_path / "n"),
         "--no-checkpoint", "--chat-template", str(tmp_path / "absent.jinja")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert bad.returncode != 0 and "chat_template" in bad.stderr and not (tmp_path / "n").exists(), bad.stderr[-2000:]
