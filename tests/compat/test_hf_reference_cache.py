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
