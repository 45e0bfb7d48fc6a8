"""MaxText's own trainer -> its orbax checkpoint -> `convert --from-maxtext` -> `maxtext-compat serve`.

The claim: the checkpoint a MaxText team has (the full train state MaxText's trainer saves, scanned layers, as it
saves by default) is served by vLLM through our plugin with the ids MaxText's own decode gives for it.
- Trained here by train.py of the release's full set (synthetic data, checkpointing on): 0.2.5 in
  maxtext-0.2.5-full, which has vLLM too; 0.1.0 in maxtext-0.1.0-full (its era's pins), while the backport serves
  it from maxtext-0.1.0-jax011 (vLLM needs jax 0.11): the conversion and the server run there, as on a user's
  serving machine, reading what the training machine wrote.
- The reference is MaxText's own loader restoring the parameters of the *training* checkpoint from
  `load_parameters_path` (scanned, as trained; `from_pretrained` on 0.2.5, `setup_decode_state` on 0.1.0) and its
  dense forward, greedy, in the training environment: nothing of ours between the checkpoint and its logits but the
  greedy loop. float32 activations, so equal ids are decided by margins far above the paths' float noise (checked).
- A config that differs from the trained one in a single key is refused naming that key, and nothing is written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.maxtext_trainer import CHECKPOINTED, MODEL, STEPS, argument
from helpers.partner_env import require_env

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.slow,
              pytest.mark.envs("maxtext-0.2.5-full", "maxtext-0.1.0-full")]  # fmt: skip

TRAINED = {**MODEL, "dtype": CHECKPOINTED["dtype"]}  # the model as trained: what `--set` repeats
PROMPTS = ((1, 5, 7, 9, 11), (200, 3), (17, 34, 51, 68, 85, 102, 119, 136, 153), (250, 250, 250, 1))
NEW_TOKENS = 12
MAX_LEN = 32
MIN_MARGIN = 1e-3  # top-1 minus top-2 logit at every reference step: far above float32 path differences (~1e-6)
# 0.1.0 has no vLLM path of its own and its full set no vLLM: the backport's environment serves it.
SERVED_BY = {"0.1.0": "maxtext-0.1.0-jax011"}


def _release() -> str:
    from maxtext_compat.testing import tiny

    return tiny.installed_row().name


@pytest.fixture(scope="module")
def checkpoints(maxtext_trained) -> Path:
    rows, _, folder = maxtext_trained
    assert [r["step"] for r in rows] == list(range(STEPS)), rows
    assert (folder / str(STEPS - 1) / "items").is_dir(), sorted(p.name for p in folder.iterdir())
    return folder


@pytest.fixture(scope="module")
def serving_python() -> tuple[str, dict[str, str]]:
    """The interpreter that converts and serves, and what its environment needs beside ours."""
    partner = SERVED_BY.get(_release())
    if partner is None:
        return sys.executable, {}
    from maxtext_compat.runner.envs import env_python

    require_env(partner)
    return str(env_python(partner)), {"MAXTEXT_COMPAT_ENV": partner}


def _cli(python: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "JAX_PLATFORMS": "cpu", **env}
    return subprocess.run([python, "-m", "maxtext_compat.cli", *args], env=full, capture_output=True, text=True,
                          timeout=900, check=False)  # fmt: skip


def _sets(values: dict[str, object]) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", argument(k, v))]


@pytest.fixture(scope="module")
def converted(checkpoints, serving_python, tmp_path_factory) -> SimpleNamespace:
    python, env = serving_python
    out = tmp_path_factory.mktemp("served") / "model"
    proc = _cli(python, env, "convert", str(checkpoints), str(out), "--from-maxtext", *_sets(TRAINED), "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return SimpleNamespace(**json.loads(proc.stdout))


def test_the_latest_saved_step_is_converted_unscanned(converted, checkpoints):
    assert f"step {STEPS - 1} ({checkpoints / str(STEPS - 1) / 'items'})" in converted.chat_template_note
    keys = json.loads((Path(converted.out) / "maxtext_config.json").read_text(encoding="utf-8"))
    assert keys == {**TRAINED, "scan_layers": False, "weight_dtype": "float32",
                    "load_parameters_path": converted.checkpoint}  # fmt: skip
    cfg = json.loads((Path(converted.out) / "config.json").read_text(encoding="utf-8"))
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"], cfg["torch_dtype"]) == (
        MODEL["base_num_decoder_layers"],
        MODEL["base_emb_dim"],
        MODEL["vocab_size"],
        "float32",
    )


@pytest.fixture(scope="module")
def maxtext_decode(checkpoints) -> SimpleNamespace:
    """MaxText's own greedy decode of the training checkpoint, restored by its own loader: ids and the logits fn."""
    import numpy as np

    from maxtext_compat.decode.greedy import greedy_decode
    from maxtext_compat.testing.real_model import restored_by_maxtext

    items = checkpoints / str(STEPS - 1) / "items"
    _, logits_fn = restored_by_maxtext({**TRAINED, "load_parameters_path": str(items)}, max_len=MAX_LEN)
    ids = greedy_decode(lambda batch: np.asarray(logits_fn(np.asarray(batch, np.int32))), [list(p) for p in PROMPTS],
                        NEW_TOKENS, length=MAX_LEN)  # fmt: skip
    return SimpleNamespace(ids=ids, logits_fn=logits_fn)


def test_served_ids_equal_maxtexts_own_decode_of_the_training_checkpoint(converted, maxtext_decode, serving_python,
                                                                          tmp_path_factory):  # fmt: skip
    from helpers.smollm2_server import serve
    from helpers.vllm_server import token_ids

    python, env = serving_python
    with serve(converted, tmp_path_factory.mktemp("logs"), seqs=4, max_len=MAX_LEN, python=python, env=env,
               label="trained") as srv:  # fmt: skip
        served = []
        for prompt in PROMPTS:
            status, body = srv.completion(list(prompt), max_tokens=NEW_TOKENS, timeout=300)
            assert status == 200, f"HTTP {status}: {body}\n{srv.log_tail()}"
            served.append(token_ids(body))
    print(f"\n[trained] served ids {served}", file=sys.stderr)
    assert served == maxtext_decode.ids


def test_the_reference_is_decisive(maxtext_decode):
    """Equal ids mean something only when no greedy step was a near tie: every read position's top-1/top-2 margin
    (prompt and generated tokens fed back, as the decode read them) exceeds MIN_MARGIN."""
    import numpy as np

    batch = np.zeros((len(PROMPTS), MAX_LEN), np.int32)
    for i, (p, gen) in enumerate(zip(PROMPTS, maxtext_decode.ids, strict=True)):
        seq = [*p, *gen]
        batch[i, : len(seq)] = seq
    out = np.asarray(maxtext_decode.logits_fn(batch), np.float64)
    margins = [float(np.diff(np.sort(out[i, len(p) - 1 + k])[-2:])[0])
               for i, p in enumerate(PROMPTS) for k in range(NEW_TOKENS)]  # fmt: skip
    print(f"\n[trained] smallest top-1/top-2 margin {min(margins):.3e}", file=sys.stderr)
    assert min(margins) > MIN_MARGIN, f"a greedy step is a near tie (margin {min(margins):.2e}): equal ids prove little"


@pytest.mark.parametrize(
    ("key", "value"),
    [("base_num_decoder_layers", 3), ("base_emb_dim", 128), ("vocab_size", 512), ("base_num_kv_heads", 1),
     ("base_num_query_heads", 4), ("head_dim", 16), ("base_mlp_dim", 256), ("scan_layers", False),
     ("logits_via_embedding", True)],
)  # fmt: skip
def test_a_config_that_differs_in_one_key_is_refused_naming_it(checkpoints, tmp_path, key, value):
    from maxtext_compat.convert.from_maxtext import convert_trained
    from maxtext_compat.errors import WeightsMismatchError

    out = tmp_path / "model"
    with pytest.raises(WeightsMismatchError) as info:
        convert_trained(checkpoints, out, {**TRAINED, key: value})
    assert info.value.argument == key, str(info.value)
    assert f"--set {key}=" in info.value.fix
    assert not out.exists() and list(tmp_path.iterdir()) == []  # nothing written, no staging left


def test_the_command_refuses_a_wrong_key_with_exit_2(checkpoints, serving_python, tmp_path):
    python, env = serving_python
    out = tmp_path / "model"
    wrong = {**TRAINED, "base_num_decoder_layers": 4}
    proc = _cli(python, env, "convert", str(checkpoints), str(out), "--from-maxtext", *_sets(wrong))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "WeightsMismatchError" in proc.stderr and "[base_num_decoder_layers]" in proc.stderr, proc.stderr[-3000:]
    assert "--set base_num_decoder_layers=2" in proc.stderr
    assert not out.exists()
