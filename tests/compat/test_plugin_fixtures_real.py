"""The pytest plugin's fixtures against the real MaxText of each environment.

The project's own paged tests use the plugin here: the hand-built ragged step of
test_adapters_new_call.py (layout, caches, allocator, metadata, token order) is one
`attention_metadata_for(...)` call, and the model call one `paged_call(...)`. Prefill and
decode use the same padded shapes, so the kernel compiles once per environment. numpy is
imported inside the tests, so the unit environment deselects them instead of skipping the module.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.shipped import ci_matrix
from maxtext_compat.testing import tiny

pytestmark = pytest.mark.needs_maxtext
pytest_plugins = ["pytester"]

ENV = os.environ.get("MAXTEXT_COMPAT_ENV", "")
KERNEL_ENVS = ("maxtext-0.2.5", "maxtext-0.2.1", "maxtext-0.1.0-jax011")
PAGED = {"family": "default", "paged": True}
PAD = {"max_num_tokens": 40, "max_num_seqs": 4, "pages_per_seq": 2}  # one compiled shape for every step
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_TAG = "<!-- example: tests/compat/test_plugin_fixtures_real.py runs this block -->"


def test_maxtext_row_is_the_installed_release(maxtext_row):
    assert maxtext_row == tiny.installed_row()
    if ENV:
        assert maxtext_row.name == ci_matrix().environment(ENV).maxtext


@pytest.mark.parametrize("tiny_maxtext_config", ["qwen3"], indirect=True)
def test_family_by_indirect_param_and_a_cache_shaped_for_it(tiny_maxtext_config, paged_kv_cache, tiny_maxtext):
    assert "qwen3" in tiny_maxtext_config.model_name
    assert tiny_maxtext.config("qwen3") is tiny_maxtext_config  # one config per spec for the session
    layout = paged_kv_cache.layout
    assert (layout.num_kv_heads, layout.head_dim) == (tiny_maxtext_config.num_kv_heads, tiny_maxtext_config.head_dim)
    assert paged_kv_cache.num_layers == tiny_maxtext_config.num_decoder_layers


@pytest.mark.needs_tpu_inference  # MaxText 0.2.x builds a vllm_rpa model only with tpu-inference importable
@pytest.mark.parametrize("tiny_maxtext_model", [PAGED], indirect=True)
def test_the_paged_model_also_takes_the_old_call(tiny_maxtext_model):
    """The session shares this model with the paged test below: one build, both conventions."""
    import numpy as np

    inp = tiny_maxtext_model.inputs(batch=1, seq=8)
    logits = tiny_maxtext_model.old_call(inp["tokens"])
    assert logits.shape == (1, 8, tiny_maxtext_model.vocab_size)
    assert np.isfinite(np.asarray(logits)).all()


@pytest.mark.envs(*KERNEL_ENVS)
@pytest.mark.parametrize("tiny_maxtext_model", [PAGED], indirect=True)
def test_prefill_then_decode_through_the_paged_fixtures(tiny_maxtext_model, paged_kv_cache, attention_metadata_for):
    import numpy as np

    model, cache = tiny_maxtext_model, paged_kv_cache
    assert cache.layout.num_kv_heads == model.num_kv_heads and cache.num_layers == model.num_layers

    prefill = attention_metadata_for({"a": 20, "b": 13}, **PAD)
    hidden, kvs = model.paged_call(prefill.tokens(np.arange(33) % model.vocab_size), prefill)
    assert len(kvs) == model.num_layers and all(a is b for a, b in zip(cache.caches, kvs, strict=True))  # stored back
    assert prefill.from_kernel_order(np.asarray(hidden)[:, 0]).shape[0] == 33
    k_a, _ = cache.read("a")
    assert k_a.shape[0] == 20 and (np.abs(k_a).reshape(20, -1).max(axis=1) > 0).all()  # every token written
    used = {*cache.allocator.pages("a"), *cache.allocator.pages("b")}
    untouched = [p for p in range(cache.layout.num_pages) if p not in used]
    assert not np.asarray(kvs[0])[untouched].any()  # nothing outside the requests' pages

    decode = attention_metadata_for({"a": 1, "b": 1}, **PAD)
    assert decode.metadata.kv_lens[:2] == (21, 14) and decode.metadata.num_decode == 2
    hidden, kvs = model.paged_call(decode.tokens([5, 7]), decode)
    k_a2, _ = cache.read("a")
    np.testing.assert_array_equal(k_a2[:20], k_a)  # the prefill's tokens stay
    assert np.abs(k_a2[20]).max() > 0 and np.isfinite(np.asarray(hidden)[:2]).all()


@pytest.mark.envs("maxtext-0.1.0")
def test_without_tpu_inference_the_step_names_the_missing_kernel(attention_metadata_for):
    from maxtext_compat.errors import KernelUnavailableError

    step = attention_metadata_for([(4, 4)])
    assert step.positions.shape == (step.max_num_tokens, 1)  # everything but the kernel's own class works
    with pytest.raises(KernelUnavailableError, match="tpu-inference"):
        _ = step.attention_metadata


def test_marker_and_forced_rows_against_the_real_install(pytester, monkeypatch):
    """One pytester run with MaxText installed: the marker sees the real version; a forced other row refuses models."""
    installed = tiny.installed_row().name
    other = "0.2.3" if installed != "0.2.3" else "0.2.4"
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.maxtext_release("=={installed}")
        def test_here(maxtext_row):
            assert maxtext_row.name == "{installed}"

        @pytest.mark.maxtext_release("!={installed}")
        def test_elsewhere():
            pass
        """
    )
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # other plugins would re-import on every run
    run = ("-p", "maxtext_compat.pytest_plugin", "-p", "no:cacheprovider")
    result = pytester.runpytest_inprocess(*run, "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    assert f"needs MaxText !={installed}; MaxText {installed} is installed (row {installed})" in result.stdout.str()
    pytester.makepyfile(test_model="def test_model(tiny_maxtext_model):\n    pass\n")
    forced = pytester.runpytest_inprocess(*run, "--maxtext-compat-row", other, "test_model.py")
    forced.assert_outcomes(errors=1)
    assert f"--maxtext-compat-row {other} forces a mocked row (MaxText {installed} is installed" in forced.stdout.str()


def _documented_example() -> str:
    """The example block of the plugin docs (docs/pytest-plugin.md, or the README once merged)."""
    for doc in (ROOT / "docs" / "pytest-plugin.md", ROOT / "README.md"):
        text = doc.read_text(encoding="utf-8") if doc.is_file() else ""
        if EXAMPLE_TAG in text:
            return text.split(EXAMPLE_TAG, 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    raise AssertionError(f"no block tagged {EXAMPLE_TAG!r} in docs/pytest-plugin.md or README.md")


@pytest.mark.envs("maxtext-0.2.5")
def test_the_documented_example_passes(pytester, monkeypatch):
    """The one pytester run that builds a real model: the docs' example, as a user would run it."""
    code = _documented_example()
    assert len([line for line in code.splitlines() if line.strip()]) <= 10
    pytester.makepyfile(test_example=code)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    result = pytester.runpytest_inprocess("-p", "maxtext_compat.pytest_plugin", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
