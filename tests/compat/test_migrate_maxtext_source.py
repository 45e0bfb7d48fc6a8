"""`maxtext-compat migrate` on code no one here wrote: MaxText 0.1.0's installed source (before PR #2616).

A copy of the installed `MaxText` package is migrated with `--to kv_return`. The call sites found are the
ones MaxText itself rewrote when it adopted the convention (every decoder layer's `attention_layer(...)`
call, MLA's in deepseek.py, the Transformer's `self.decoder(...)`) plus Gemma 3's vision-encoder attention,
which PR #2616 missed and MaxText later fixed by hand the same way (`y, _ = ...`). The decoder layers the
matrix lists are defined there; PR #2616 also changed their signatures and returns and the Decoder's layer
loop, which calls them through classes chosen at run time: migrate lists those four definitions as manual.
Counts on 0.1.0 (MaxText/layers, 28 files; the package's other 185 files hold no site): 16 call sites
rewritten, 4 decoder-layer definitions manual.

The round trip: the migrated copy, imported ahead of the installed package in MaxText 0.1.0's own
environment with the kernel (maxtext-0.1.0-jax011) and run under the vllm-backport shim, computes what the
unmigrated package computes there: the same weights from the same seed, old calls' logits (the dense
greedy loop) and new calls' logits (ragged prefill + decode through the paged KV cache) and every KV page
read back, all bit for bit.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.envs("maxtext-0.1.0")]  # the source is the same in both 0.1.0 envs

pytest.importorskip("libcst")

from helpers import crossrun as cr  # noqa: E402
from helpers.partner_env import require_env  # noqa: E402
from maxtext_compat.migrate import files  # noqa: E402
from maxtext_compat.testing import tiny  # noqa: E402

# Written out from MaxText 0.1.0's source (file: call sites), not from the codemod's output.
CALLS = {
    "layers/decoders.py": 1, "layers/deepseek.py": 1, "layers/gemma.py": 1, "layers/gemma2.py": 2,
    "layers/gemma3.py": 2, "layers/gpt_oss.py": 1, "layers/llama2.py": 1, "layers/llama4.py": 2,
    "layers/mistral.py": 1, "layers/mixtral.py": 1, "layers/models.py": 2, "layers/qwen3.py": 1,
}  # fmt: skip
# The matrix's decoder-layer classes defined in it: all four left to a human (the Decoder's layer loop
# calls them through get_decoder_layers(), which no codemod can follow).
LAYERS = {
    "MaxText.layers.llama2.LlamaDecoderLayer": "manual", "MaxText.layers.gemma3.Gemma3DecoderLayer": "manual",
    "MaxText.layers.decoders.DecoderLayer": "manual", "MaxText.layers.qwen3.Qwen3DecoderLayer": "manual",
}  # fmt: skip
KERNEL_ENV = "maxtext-0.1.0-jax011"  # the same MaxText 0.1.0 source, with tpu-inference for the new calls


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    from maxtext_compat.resolution.probes import package_dir

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
    assert "attention_lnx, _ = attention_layer(" in llama
    assert "        kv_cache=None,\n        attention_metadata=None,\n    )" in llama
    assert "      return layer_output, None\n    else:\n      return layer_output\n" in llama  # left whole


def test_a_second_run_changes_nothing(migrated):
    copy, _ = migrated
    again = files.run([copy / "layers"], "kv_return", write=False)
    assert not any(r.changed for r in again)
    changes = [s.change for r in again for s in r.sites]
    assert changes.count("manual") == 4 and changes.count("rewritten") == 0


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


ROUND_TRIP_PROMPTS = (
    (7, 3, 250, 9, 41, 18, 77, 5, 12, 190, 64, 33, 2, 8, 99, 140, 21, 6, 13),
    (5, 17, 230, 4, 66),
    (1,),
)
ROUND_TRIP_FAMILIES = ("default", "qwen3")  # LlamaDecoderLayer; Qwen3DecoderLayer (attention through a helper)


@pytest.mark.extended  # two runs of two families in the backport's environment (~5 min); the rewrite is checked above
def test_the_migrated_package_under_the_shim_computes_what_the_original_computes(migrated, tmp_path):
    """Old and new calls, two families: logits and KV pages bit for bit (tolerance 0: same ops, same weights)."""
    import numpy as np

    require_env(KERNEL_ENV)
    copy, _ = migrated

    def specs(side: str, profile: str | None) -> list:
        out = [tmp_path / f"{side}-{family}.npz" for family in ROUND_TRIP_FAMILIES]
        return [cr.RunSpec(family, ROUND_TRIP_PROMPTS, 4, read_kv=True, profile=profile, weights_out=str(path))
                for family, path in zip(ROUND_TRIP_FAMILIES, out, strict=True)]  # fmt: skip

    original = cr.start_in_env(KERNEL_ENV, specs("original", None), workdir=tmp_path / "original")
    moved = cr.start_in_env(KERNEL_ENV, specs("migrated", "vllm-backport"), workdir=tmp_path / "migrated",
                            import_first=copy.parent)  # fmt: skip
    for family, want, got in zip(ROUND_TRIP_FAMILIES, original.results(), moved.results(), strict=True):
        assert "vllm-backport" in got.meta["profiles"] and "vllm-backport" not in want.meta["profiles"], got.meta
        assert got.meta["maxtext_file"].startswith(str(copy)) and not want.meta["maxtext_file"].startswith(str(copy))
        a, b = np.load(tmp_path / f"original-{family}.npz"), np.load(tmp_path / f"migrated-{family}.npz")
        assert sorted(a.files) == sorted(b.files) and all(np.array_equal(a[k], b[k]) for k in a.files), family
        for path in ("dense", "paged"):  # old calls, new calls
            w, g = getattr(want, path), getattr(got, path)
            assert len(g.steps) == len(w.steps) == 5 and g.tokens() == w.tokens(), (family, path)  # prefill + 4
            for k, (ws, gs) in enumerate(zip(w.steps, g.steps, strict=True)):
                for i, rows in enumerate(ws.logits):
                    np.testing.assert_array_equal(gs.logits[i], rows, err_msg=f"{family} {path} step {k} prompt {i}")
        assert want.kv.keys() == got.kv.keys() and len(want.kv) >= 2 * len(ROUND_TRIP_PROMPTS)
        for key, (k, v) in want.kv.items():
            np.testing.assert_array_equal(got.kv[key][0], k, err_msg=f"{family} K {key}")
            np.testing.assert_array_equal(got.kv[key][1], v, err_msg=f"{family} V {key}")
