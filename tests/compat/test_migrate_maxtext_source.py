"""`maxtext-compat migrate` on code no one here wrote: MaxText 0.1.0's installed source (before PR #2616).

A copy of the installed `MaxText` package is migrated with `--to kv_return`. The call sites found are the
ones MaxText itself rewrote when it adopted the convention (every decoder layer's `attention_layer(...)`
call, MLA's in deepseek.py, the Transformer's `self.decoder(...)`) plus Gemma 3's vision-encoder attention,
which PR #2616 missed and MaxText later fixed by hand the same way (`y, _ = ...`). A second run changes
nothing, and the migrated package still imports (in a fresh interpreter, from the copy). Counts on 0.1.0
(MaxText/layers, 28 files; the package's other 185 files hold no site): 16 call sites rewritten; of the
matrix's 4 decoder-layer classes defined there, 2 rewritten and 2 left manual (with the reason).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.envs("maxtext-0.1.0")]  # the source is the same in both 0.1.0 envs

pytest.importorskip("libcst")

from maxtext_compat.migrate import files  # noqa: E402
from maxtext_compat.testing import tiny  # noqa: E402

# Written out from MaxText 0.1.0's source (file: call sites), not from the codemod's output.
CALLS = {
    "layers/decoders.py": 1, "layers/deepseek.py": 1, "layers/gemma.py": 1, "layers/gemma2.py": 2,
    "layers/gemma3.py": 2, "layers/gpt_oss.py": 1, "layers/llama2.py": 1, "layers/llama4.py": 2,
    "layers/mistral.py": 1, "layers/mixtral.py": 1, "layers/models.py": 2, "layers/qwen3.py": 1,
}  # fmt: skip
# The matrix's decoder-layer classes defined in it: rewritten as PR #2616 did (kv_cache=/attention_metadata=
# taken, the attention call threads them, `return y` -> `return y, kv_cache`), or left to a human: the generic
# DecoderLayer returns `(y, None if scan else y)`, Qwen3DecoderLayer calls its attention through a helper.
LAYERS = {
    "MaxText.layers.llama2.LlamaDecoderLayer": "rewritten", "MaxText.layers.gemma3.Gemma3DecoderLayer": "rewritten",
    "MaxText.layers.decoders.DecoderLayer": "manual", "MaxText.layers.qwen3.Qwen3DecoderLayer": "manual",
}  # fmt: skip


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    from maxtext_compat.probes import package_dir

    source = package_dir(tiny.installed_row().import_root)
    copy = tmp_path_factory.mktemp("mt") / "MaxText"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
    reports = files.run([copy / "layers"], "kv_return", write=True)  # every call site of 0.1.0 is in layers/
    return copy, reports


def test_the_call_sites_maxtext_itself_rewrote_are_found_and_rewritten(migrated):
    copy, reports = migrated
    assert not [r.path for r in reports if r.skipped]
    calls: dict[str, int] = {}
    layers: dict[str, str] = {}
    for r in reports:
        for s in r.sites:
            if s.kind == "decoder_layer":
                layers[s.callee] = s.change
                continue
            assert s.change == "rewritten", (r.path, s)
            key = str(r.path.relative_to(copy))
            calls[key] = calls.get(key, 0) + 1
    assert calls == CALLS
    assert layers == LAYERS
    llama = (copy / "layers" / "llama2.py").read_text()
    assert "      kv_cache=None,\n      attention_metadata=None,\n  ):" in llama
    assert "attention_lnx, kv_cache = attention_layer(" in llama
    assert "        kv_cache=kv_cache,\n        attention_metadata=attention_metadata,\n    )" in llama
    assert "      return layer_output, None\n    else:\n      return layer_output, kv_cache" in llama


def test_a_second_run_changes_nothing(migrated):
    copy, _ = migrated
    again = files.run([copy / "layers"], "kv_return", write=False)
    assert not any(r.changed for r in again)
    changes = [s.change for r in again for s in r.sites]
    assert changes.count("manual") == 2 and changes.count("rewritten") == 0


def test_the_migrated_package_imports_from_the_copy(migrated):
    copy, _ = migrated
    code = (
        f"import sys; sys.path.insert(0, {str(copy.parent)!r}); sys.argv = ['x']\n"
        "import MaxText.layers.models, MaxText.layers.llama2, MaxText.layers.deepseek\n"
        f"assert MaxText.__file__.startswith({str(copy)!r}), MaxText.__file__\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
    assert "attention_lnx, _ = attention_layer(" in (copy / "layers" / "mistral.py").read_text()
    assert "logits, hidden_state, _ = self.decoder(" in (copy / "layers" / "models.py").read_text()


def test_path_inputs_that_do_not_exist_are_reported(tmp_path):
    reports = files.run([tmp_path / "missing.py"], "kv_return", write=False)
    assert reports[0].skipped and "unreadable" in reports[0].skipped
    assert files.exit_code(reports, check=True) == 2
