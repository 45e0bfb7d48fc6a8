"""`maxtext-compat migrate`: every recognised pattern on small fixtures written for these tests.

The expected rewrites are written out by hand below (what MaxText PR #2616 did to its own call sites), not
produced by the code under test. The class lists come from the shipped compat_matrix.yaml.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

libcst = pytest.importorskip("libcst")

from maxtext_compat.cli import main  # noqa: E402
from maxtext_compat.migrate import files  # noqa: E402
from maxtext_compat.migrate.callees import from_matrix  # noqa: E402
from maxtext_compat.migrate.codemod import migrate_source  # noqa: E402

pytestmark = pytest.mark.envs("unit")  # the codemod reads the shipped matrix, not the installed release: once per run

CALLEES = from_matrix()


def _migrate(code: str, target: str = "kv_return"):
    return migrate_source(textwrap.dedent(code), CALLEES, target)


def _changes(result):
    return [(s.line, s.kind, s.change) for s in result.sites]


def test_the_matrix_supplies_classes_and_their_linen_factories_under_both_package_names():
    kinds = CALLEES.kinds
    assert kinds["MaxText.layers.attentions.Attention"] == "attention"
    assert kinds["maxtext.layers.attentions.Attention"] == "attention"
    assert kinds["MaxText.layers.attentions.attention_as_linen"] == "attention"
    assert kinds["MaxText.layers.attention_mla.mla_as_linen"] == "attention"
    assert kinds["MaxText.layers.llama2.LlamaDecoderLayer"] == "decoder_layer"
    assert kinds["maxtext.layers.nnx_decoders.NNXDecoder"] == "decoder"
    assert kinds["MaxText.layers.models.transformer_as_linen"] == "transformer"


def test_nnx_attention_assigned_in_init_under_an_alias():
    result = _migrate(
        """\
        from MaxText.layers.attentions import Attention as Attn


        class Block:
            def __init__(self, cfg):
                self.self_attention = Attn(config=cfg)  # built once

            def __call__(self, x, pos):
                # a comment the rewrite keeps
                x = self.self_attention(x, x, pos, model_mode="train")
                return x
        """
    )
    assert (
        '        x, _ = self.self_attention(x, x, pos, model_mode="train", kv_cache=None, attention_metadata=None)\n'
        in result.code
    )
    assert "# a comment the rewrite keeps" in result.code and "# built once" in result.code
    assert _changes(result) == [(10, "attention", "rewritten")]


def test_a_decoder_layer_that_takes_the_kv_arguments_threads_them():
    result = _migrate(
        """\
        import maxtext.layers.attentions as att


        class Layer:
            def setup(self):
                self.attn = att.Attention(config=None)

            def __call__(self, x, pos, kv_cache=None, attention_metadata=None):
                y = self.attn(x, x, pos)
                return y, kv_cache
        """
    )
    assert (
        "        y, kv_cache = self.attn(x, x, pos, kv_cache=kv_cache, attention_metadata=attention_metadata)\n"
        in result.code
    )


def test_linen_factory_called_in_compact_style_and_tolinen_wrapper():
    result = _migrate(
        """\
        from MaxText.layers import attentions
        from MaxText.layers import nnx_wrappers
        from MaxText.layers.attentions import Attention


        def block(cfg, x, pos):
            layer = attentions.attention_as_linen(config=cfg, name="self_attention")
            out = layer(x, x, pos)
            wrapped = nnx_wrappers.ToLinen(Attention, kwargs={})
            out2 = wrapped(x, x, pos)
            return out + out2
        """
    )
    assert "    out, _ = layer(x, x, pos, kv_cache=None, attention_metadata=None)\n" in result.code
    assert "    out2, _ = wrapped(x, x, pos, kv_cache=None, attention_metadata=None)\n" in result.code


def test_decoder_three_tuple_and_kv_caches_threaded():
    result = _migrate(
        """\
        from maxtext.layers.decoders import Decoder


        class Model:
            def __init__(self, cfg):
                self.decoder = Decoder(config=cfg)

            def __call__(self, tokens, pos, kv_caches=None, attention_metadata=None):
                logits, hidden = self.decoder(self.embed, tokens, pos)
                return logits


        def train_step(cfg, tokens, pos):
            logits, hidden = Decoder(config=cfg)(None, tokens, pos)
            return logits
        """
    )
    assert (
        "        logits, hidden, kv_caches = self.decoder(self.embed, tokens, pos, kv_caches=kv_caches, "
        "attention_metadata=attention_metadata)\n" in result.code
    )
    assert (
        "    logits, hidden, _ = Decoder(config=cfg)(None, tokens, pos, kv_caches=None, attention_metadata=None)\n"
        in result.code
    )


def test_decoder_layers_called_in_a_loop():
    result = _migrate(
        """\
        from MaxText.layers.llama2 import LlamaDecoderLayer


        def decode(cfg, y, pos):
            for i in range(cfg.num_layers):
                y = LlamaDecoderLayer(config=cfg, name=f"layers_{i}")(y, None, pos, True, "train")
            return y
        """
    )
    call = 'LlamaDecoderLayer(config=cfg, name=f"layers_{i}")(y, None, pos, True, "train"'
    want = f"        y, _ = {call}, kv_cache=None, attention_metadata=None)\n"
    assert want in result.code


def test_bindings_are_scoped_to_their_class_and_function():
    """Another class's `self.attn`, or a same-named local elsewhere, is another object: never a site."""
    code = textwrap.dedent(
        """\
        from MaxText.layers.attentions import Attention


        class VisionAttention:
            def __init__(self):
                self.attn = Attention()

            def __call__(self, x):
                y = self.attn(x, x, None)
                return y


        class VisionBlock:
            def __init__(self):
                self.attn = VisionAttention()

            def __call__(self, x):
                y = self.attn(x)
                return y


        def build(x):
            attn = Attention()

            def inner(z):
                out = attn(z, z, None)
                return out

            return inner(x)


        def elsewhere(attn, x):
            out = attn(x)
            return out
        """
    )
    result = migrate_source(code, CALLEES, "kv_return")
    assert [(s.line, s.change) for s in result.sites] == [(9, "rewritten"), (26, "rewritten")]
    assert "        y = self.attn(x)\n" in result.code and "    out = attn(x)\n" in result.code


def test_a_linen_layer_bridged_to_nnx_is_still_that_layer():
    result = _migrate(
        """\
        from flax import nnx
        from MaxText.layers import nnx_wrappers
        from MaxText.layers.decoders import Decoder


        class Transformer(nnx.Module):
            def __init__(self, cfg, rngs):
                decoder_linen = Decoder(config=cfg)
                self.decoder = nnx_wrappers.ToNNX(decoder_linen, rngs=rngs)

            def __call__(self, tokens, pos):
                logits, hidden = self.decoder(None, tokens, pos)
                return logits
        """
    )
    assert [(s.line, s.kind, s.change) for s in result.sites] == [(12, "decoder", "rewritten")]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("return self.attn(x, x, pos)", "returned directly"),
        ("y = f(self.attn(x, x, pos))", "passed on as an argument"),
        ("y = self.attn(x, x, pos) + x", "inside an expression"),
        ("y = [*self.attn(x, x, pos)]", "starred"),
        ("y = z = self.attn(x, x, pos)", "several targets"),
        ("a, b, c = self.attn(x, x, pos)", "unpacks 3 values"),
        ("*a, b = self.attn(x, x, pos)", "starred or nested"),
    ],
)
def test_uses_it_cannot_rewrite_safely_are_listed_as_manual_never_guessed(line, reason):
    code = f"""\
        from MaxText.layers.attentions import Attention


        class Block:
            def __init__(self):
                self.attn = Attention()

            def __call__(self, x, pos):
                {line}
                return x
        """
    result = _migrate(code)
    assert result.code == textwrap.dedent(code)  # untouched
    manual = [s for s in result.sites if s.change == "manual"]
    assert len(manual) == 1 and reason in manual[0].detail and manual[0].line == 9


def test_several_attention_calls_in_a_function_that_takes_kv_cache_are_manual():
    result = _migrate(
        """\
        from MaxText.layers.attentions import Attention


        class Layer:
            def __init__(self):
                self.a = Attention()
                self.b = Attention()

            def __call__(self, x, kv_cache=None, attention_metadata=None):
                x = self.a(x, x, None)
                x = self.b(x, x, None)
                return x
        """
    )
    assert [s.change for s in result.sites] == ["manual", "manual"]
    assert "several attention calls" in result.sites[0].detail


def test_layers_under_nn_scan_are_manual_and_unrelated_calls_are_ignored():
    result = _migrate(
        """\
        import flax.linen as nn
        from MaxText.layers.llama2 import LlamaDecoderLayer
        from mylib import Attention


        def stack(cfg, y):
            scanned = nn.scan(LlamaDecoderLayer, length=2)(config=cfg)
            mine = Attention()
            z = mine(y)
            y = scanned(y)
            return y
        """
    )
    assert [(s.kind, s.change) for s in result.sites] == [("scanned", "manual")]


def test_a_second_run_changes_nothing_and_legacy_reverses_it():
    code = textwrap.dedent(
        """\
        from MaxText.layers.attentions import Attention
        from MaxText.layers.decoders import Decoder


        def run(x, pos, tokens):
            out = Attention()(x, x, pos)
            logits, hidden = Decoder()(None, tokens, pos)
            return out, logits
        """
    )
    new = migrate_source(code, CALLEES, "kv_return")
    assert new.changed
    assert migrate_source(new.code, CALLEES, "kv_return").code == new.code
    back = migrate_source(new.code, CALLEES, "legacy")
    assert back.code == code
    assert migrate_source(back.code, CALLEES, "legacy").code == code


def test_legacy_keeps_a_used_kv_cache_as_manual():
    code = textwrap.dedent(
        """\
        from MaxText.layers.attentions import Attention


        def layer(x, pos, kv_cache, attention_metadata):
            y, kv_cache = Attention()(x, x, pos, kv_cache=kv_cache, attention_metadata=attention_metadata)
            return y, kv_cache
        """
    )
    result = migrate_source(code, CALLEES, "legacy")
    assert result.code == code
    assert [(s.change, s.detail) for s in result.sites] == [
        ("manual", "the KV result is used (legacy code has no KV cache)")
    ]


# ----------------------------------------------------------------------------------------------
# The command: --check, --diff, --write, --json; files it cannot read
# ----------------------------------------------------------------------------------------------

OLD = "from MaxText.layers.attentions import Attention\n\n\ndef f(x):\n    y = Attention()(x, x, None)\n    return y\n"


def test_check_lists_sites_and_exits_1_write_rewrites_and_a_second_check_exits_0(tmp_path, capsys):
    src = tmp_path / "pkg" / "mod.py"
    src.parent.mkdir()
    src.write_text(OLD)
    assert main(["migrate", str(tmp_path), "--check", "--diff"]) == 1
    out = capsys.readouterr().out
    assert (
        f"{src}:5:5: MaxText.layers.attentions.Attention (attention): would rewrite: unpacks (…, _); "
        "passes kv_cache=None and attention_metadata=None" in out
    )
    assert (
        "-    y = Attention()(x, x, None)\n+    y, _ = Attention()(x, x, None, kv_cache=None, attention_metadata=None)"
        in out
    )
    assert src.read_text() == OLD  # --check never writes
    assert main(["migrate", str(src), "--write"]) == 0
    assert src.read_text() == OLD.replace(
        "    y = Attention()(x, x, None)", "    y, _ = Attention()(x, x, None, kv_cache=None, attention_metadata=None)"
    )
    capsys.readouterr()
    assert main(["migrate", str(tmp_path), "--check"]) == 0
    assert "0 to rewrite, 0 manual, 1 unchanged" in capsys.readouterr().out


def test_json_output(tmp_path, capsys):
    (tmp_path / "m.py").write_text(OLD)
    assert main(["migrate", str(tmp_path), "--json"]) == 0
    [report] = json.loads(capsys.readouterr().out)
    assert report["changed"] is True and report["skipped"] is None
    detail = "unpacks (…, _); passes kv_cache=None and attention_metadata=None"
    assert report["sites"] == [{"line": 5, "column": 5, "callee": "MaxText.layers.attentions.Attention",
                                "kind": "attention", "change": "rewritten", "detail": detail}]  # fmt: skip


def test_unreadable_files_are_reported_skipped_and_the_exit_code_says_so(tmp_path, capsys):
    (tmp_path / "latin1.py").write_bytes("s = 'caf\xe9'\n".encode("latin-1"))
    (tmp_path / "blob.py").write_bytes(b"\x00\x01binary")
    (tmp_path / "broken.py").write_text("def f(:\n")
    (tmp_path / "good.py").write_text(OLD)
    assert main(["migrate", str(tmp_path), "--write"]) == 2
    out = capsys.readouterr().out
    assert "latin1.py: skipped (not UTF-8" in out and "blob.py: skipped (binary file)" in out
    assert "broken.py: skipped (does not parse: line 1" in out
    assert (tmp_path / "good.py").read_text() != OLD  # the others are still migrated
    assert (tmp_path / "broken.py").read_text() == "def f(:\n"


def test_a_failed_write_leaves_the_file_whole(tmp_path, monkeypatch):
    src = tmp_path / "m.py"
    src.write_text(OLD)

    def boom(a, b):
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        files.write_atomically(src, "new text")
    assert src.read_text() == OLD
    assert [p.name for p in tmp_path.iterdir()] == ["m.py"]  # no temporary file left behind


def test_pre_commit_hook_runs_check():
    import yaml

    hooks = yaml.safe_load((Path(__file__).resolve().parents[2] / ".pre-commit-hooks.yaml").read_text())
    [hook] = hooks
    assert hook["id"] == "maxtext-compat-migrate" and "--check" in hook["entry"]


# ----------------------------------------------------------------------------------------------
# A decoder layer the matrix lists, defined in the file being migrated (MaxText's own source, a fork)
# ----------------------------------------------------------------------------------------------

LAYER_010 = """\
from MaxText.layers.attentions import attention_as_linen


class LlamaDecoderLayer:
  def __call__(
      self,
      inputs,
      decoder_positions,
      previous_chunk=None,
  ):
    attention_layer = attention_as_linen(config=self.config)
    attention_lnx = attention_layer(
        inputs,
        inputs,
        decoder_positions,
        previous_chunk=previous_chunk,
    )
    if self.config.scan_layers:
      return attention_lnx, None
    else:
      return attention_lnx
"""

# What MaxText PR #2616 made of it (written by hand from the PR's diff of llama2.py).
LAYER_NEW = """\
from MaxText.layers.attentions import attention_as_linen


class LlamaDecoderLayer:
  def __call__(
      self,
      inputs,
      decoder_positions,
      previous_chunk=None,
      kv_cache=None,
      attention_metadata=None,
  ):
    attention_layer = attention_as_linen(config=self.config)
    attention_lnx, kv_cache = attention_layer(
        inputs,
        inputs,
        decoder_positions,
        previous_chunk=previous_chunk,
        kv_cache=kv_cache,
        attention_metadata=attention_metadata,
    )
    if self.config.scan_layers:
      return attention_lnx, None
    else:
      return attention_lnx, kv_cache
"""


def test_a_listed_decoder_layer_defined_here_is_left_whole_and_listed_its_attention_call_moves():
    """MaxText's Decoder calls this class through get_decoder_layers(): its return moves only with that loop."""
    result = migrate_source(LAYER_010, CALLEES, "kv_return", "MaxText.layers.llama2")
    want = LAYER_010.replace("    attention_lnx = attention_layer(", "    attention_lnx, _ = attention_layer(").replace(
        "        previous_chunk=previous_chunk,\n    )",
        "        previous_chunk=previous_chunk,\n        kv_cache=None,\n        attention_metadata=None,\n    )",
    )
    assert result.code == want
    assert [(s.kind, s.change) for s in result.sites] == [("decoder_layer", "manual"), ("attention", "rewritten")]
    assert "chosen at run time" in result.sites[0].detail and result.sites[0].line == 5
    assert migrate_source(want, CALLEES, "kv_return", "MaxText.layers.llama2").code == want
    assert migrate_source(want, CALLEES, "legacy", "MaxText.layers.llama2").code == LAYER_010
    # the same class in a module the matrix does not name is a user's own class: no definition site
    other = migrate_source(LAYER_010, CALLEES, "kv_return", "mypkg.llama2")
    assert other.code == want and [s.kind for s in other.sites] == ["attention"]


def test_a_new_convention_layer_defined_here_is_left_whole_under_legacy():
    result = migrate_source(LAYER_NEW, CALLEES, "legacy", "MaxText.layers.llama2")
    assert result.code == LAYER_NEW
    assert [(s.kind, s.change) for s in result.sites] == [("decoder_layer", "manual"), ("attention", "manual")]
    again = migrate_source(LAYER_NEW, CALLEES, "kv_return", "MaxText.layers.llama2")
    assert again.code == LAYER_NEW  # already the target: no definition site, the call unchanged
    assert [(s.line, s.kind, s.change) for s in again.sites] == [(14, "attention", "unchanged")]


def test_legacy_keeps_a_call_that_writes_a_cache_as_manual():
    code = textwrap.dedent(
        """\
        from MaxText.layers.attentions import Attention


        def step(x, pos, pages, metadata):
            y, _ = Attention()(x, x, pos, kv_cache=pages, attention_metadata=metadata)
            return y
        """
    )
    result = migrate_source(code, CALLEES, "legacy")
    assert result.code == code
    assert [(s.change, s.detail) for s in result.sites] == [
        ("manual", "passes kv_cache=pages, attention_metadata=metadata (a legacy call cannot write a KV cache)")
    ]


def test_a_single_line_call_stays_on_one_line():
    code = (
        "from MaxText.layers.attentions import Attention\n\n\nclass LlamaDecoderLayer:\n"
        "    def __call__(self, x, pos):\n        a = Attention()\n        y = a(x, x, pos)\n        return y\n"
    )
    result = migrate_source(code, CALLEES, "kv_return", "MaxText.layers.llama2")
    assert result.code == code.replace(
        "y = a(x, x, pos)", "y, _ = a(x, x, pos, kv_cache=None, attention_metadata=None)"
    )


@pytest.mark.parametrize(
    ("source", "module", "may"),
    [
        ("from MaxText.layers.attentions import Attention\n", "pkg.m", True),
        ("from MaxText.layers import attentions as a\n", None, True),
        ("import maxtext.layers.decoders\n", None, True),
        ("import MaxText\n", None, True),
        ("from MaxText.layers.attentions import *\n", None, True),
        ("from . import attentions\n", "MaxText.layers.llama2", True),  # relative, inside MaxText's package
        ("from ..layers import decoders\n", "MaxText.models.x", True),
        ("class LlamaDecoderLayer: ...\n", "MaxText.layers.llama2", True),  # defines a listed class
        ("from MaxText import max_utils\nAttention = 1\n", None, False),  # the word, but no path to a layer
        ("from maxtext.layers.attentions import attention_op_helper\n", None, False),
        ("from . import attentions\n", "mypkg.layers.x", False),
        ("# Attention, Decoder and Transformer\n", None, False),
    ],
)
def test_only_files_that_can_reach_a_layer_are_parsed_by_libcst(source, module, may):
    import ast

    assert files.may_name_a_layer(ast.parse(source), module, CALLEES) is may


def test_module_names_come_from_the_package_layout(tmp_path):
    (tmp_path / "MaxText" / "layers").mkdir(parents=True)
    (tmp_path / "MaxText" / "__init__.py").write_text("")
    (tmp_path / "MaxText" / "layers" / "__init__.py").write_text("")
    assert files.module_name(tmp_path / "MaxText" / "layers" / "llama2.py") == "MaxText.layers.llama2"
    assert files.module_name(tmp_path / "MaxText" / "layers" / "__init__.py") == "MaxText.layers"
    assert files.module_name(tmp_path / "script.py") is None
