"""The cached reference is transformers' own reading, bit for bit: a hit gives the tensors and answers of the miss.

The `reference` fixture and the demo keep transformers' reading of SmolLM2's GGUF file between environments
(testing.real_model.hf_reference). This checks, in one environment off the suite's critical path, that what
comes back from the cache is exactly what transformers returned when it read the file.
"""

from __future__ import annotations

import importlib.metadata

import pytest

np = pytest.importorskip("numpy")  # the unit environment has none

from maxtext_compat.testing import real_model as rm  # noqa: E402

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.envs("maxtext-0.2.2")]


def test_a_hit_returns_exactly_what_transformers_read(tmp_path):
    import torch

    path = rm.smollm2_gguf()
    read = rm.hf_reference(path, tmp_path)  # a miss: transformers reads the file
    (entry,) = tmp_path.glob("*.safetensors")
    before = entry.stat().st_mtime_ns
    kept = rm.hf_reference(path, tmp_path)  # a hit
    assert kept.model is not read.model and entry.stat().st_mtime_ns >= before
    want, got = read.model.state_dict(), kept.model.state_dict()
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert got[name].dtype == torch.float32 and torch.equal(got[name], tensor), name
    assert kept.greedy == read.greedy and kept.prompt_ids == read.prompt_ids
    assert len(kept.greedy) == len(rm.PROMPTS) and all(len(g) == rm.NEW_TOKENS for g in kept.greedy)
    ids = read.prompt_ids[1]
    np.testing.assert_array_equal(rm.hf_logits(kept.model, ids), rm.hf_logits(read.model, ids))
    assert list(tmp_path.iterdir()) == [entry]  # no partial file left behind


def test_a_new_reader_release_is_a_new_entry(monkeypatch):
    path = rm.smollm2_gguf()
    key = rm._reference_key(path)
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda n: "0.0.1" if n == "transformers" else real(n))
    assert rm._reference_key(path) != key
    monkeypatch.setattr(importlib.metadata, "version", real)
    monkeypatch.setattr(rm, "NEW_TOKENS", rm.NEW_TOKENS + 1)
    assert rm._reference_key(path) != key


def test_the_demo_takes_a_stored_answer_without_transformers(reference, monkeypatch):
    """`make demo` checks one prompt against transformers in five environments: a cache entry that holds that
    prompt's answer gives it from the file's header (no model loaded, no torch); one it lacks is decoded."""
    from maxtext_compat.runner.caches import hf_reference_dir

    cache = hf_reference_dir()
    if cache is None:
        pytest.skip("the caches are off (MAXTEXT_COMPAT_COMPILE_CACHE is empty)")
    path = rm.smollm2_gguf()
    ids = reference.prompt_ids[0]

    def no_transformers(*args, **kwargs):
        raise AssertionError("a stored answer was decoded again")

    with monkeypatch.context() as m:
        for name in ("hf_from_gguf", "_load_reference", "hf_greedy"):
            m.setattr(rm, name, no_transformers)
        assert rm.reference_greedy(path, ids, rm.NEW_TOKENS, cache) == reference.greedy[0]
        assert rm.reference_greedy(path, ids, 4, cache) == reference.greedy[0][:4]  # greedy: the same start
    other = [*ids, ids[-1]]  # a prompt the entry does not hold
    assert rm.reference_greedy(path, other, 4, cache) == rm.hf_greedy(reference.model, [other], 4)[0]
