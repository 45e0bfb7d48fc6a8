"""vLLM itself with the plugin on the chip, in-process (`vllm.LLM(...).generate`: no socket can listen on the TPU
machine), serving the converted SmolLM2 through MaxText: its ids must equal transformers' greedy ids.

The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0: no ZeroMQ socket between the front end and
the engine core). Where this machine has no IP socket (the TPU machine, or tools/tpu/nosocket.c on a CPU), the two
things that still need one are replaced for the run (tests/helpers/socketless_launch.py: gloo's process groups of one
process by torch's `fake` backend, the executor's unused port lookup by 0), and the record names that launch. Any
failure fails the test: the launch is a test fixture, not a configuration a user sets, so there is no expected
failure left to record.
"""

from __future__ import annotations

import contextlib
import errno
import os
import traceback
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest

pytestmark = [pytest.mark.tpu, pytest.mark.pallas]

NEW_TOKENS = 16
MAX_LEN = 32
SEQS = 8  # requests at once on the chip
# errno of a refused, unroutable or unbindable IP socket
SOCKET_ERRNOS = {errno.EAFNOSUPPORT, errno.EPERM, errno.EACCES, errno.EADDRNOTAVAIL, errno.ENETUNREACH,
                 errno.EPROTONOSUPPORT, errno.ESOCKTNOSUPPORT}  # fmt: skip
GLOO_WORDS = ("Cannot resolve", "gloo", "127.0.0.1", "address")


def _ip_sockets() -> str | None:
    """None where an IP socket can be made here; else why not (the TPU machine: errno 97)."""
    import socket

    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return None


@contextlib.contextmanager
def _plain_launch() -> Iterator[dict[str, int]]:
    yield {}


def _socket_blocked(exc: BaseException) -> str | None:
    """Which socket constraint stopped vLLM, or None for any other failure."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in SOCKET_ERRNOS:
            frames = "".join(traceback.format_tb(e.__traceback__))
            if "socket" in frames:
                return f"no IP socket: {type(e).__name__}: {e} (in {_last_vllm_frame(e)})"
        if isinstance(e, RuntimeError) and any(w in str(e) for w in GLOO_WORDS):
            return f"no IP socket for gloo: RuntimeError: {e} (in {_last_vllm_frame(e)})"
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in out:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def _last_vllm_frame(exc: BaseException) -> str:
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if "/vllm/" in f.filename or "tpu_inference" in f.filename
    ]
    f = frames[-1] if frames else traceback.extract_tb(exc.__traceback__)[-1]
    return f"{f.filename.rsplit('site-packages/', 1)[-1].rsplit('tpu-site/', 1)[-1]}:{f.lineno} {f.name}"


def test_vllm_llm_in_process_serves_smollm2_through_maxtext(tier, tmp_path_factory):
    from helpers import torchvision_placeholder
    from helpers.socketless_launch import LAUNCH, socketless_launch
    from maxtext_compat import convert
    from maxtext_compat.serving.serve_inputs import read_maxtext_config
    from maxtext_compat.testing import real_model as rm

    # on the chip: every prompt of the seed, repeated to 8 requests at once over a prefix cache (a repeat's prompt is
    # a cached prefix); a dry run on a CPU: one prompt
    base = list(rm.PROMPTS if tier.tpu else rm.PROMPTS[:1])
    prompts = (base * SEQS)[:SEQS] if tier.tpu else base
    new = NEW_TOKENS if tier.tpu else 4
    out = convert.convert(rm.smollm2_gguf(), tmp_path_factory.mktemp("smollm2-vllm") / "model").out
    maxtext = {**(read_maxtext_config(out) or {}), "max_target_length": MAX_LEN,
               "max_prefill_predict_length": MAX_LEN - 4}  # fmt: skip
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "NEW_MODEL_DESIGN": "1", "SKIP_JAX_PRECOMPILE": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # fmt: skip
    report: dict[str, Any] = {"env": env, "attempts": []}
    placeholder = torchvision_placeholder.install()
    report["torchvision"] = "importable" if placeholder is None else f"placeholder ({placeholder})"
    try:
        with mock.patch.dict(os.environ, env):
            from vllm import LLM, SamplingParams

            blocked_here = _ip_sockets()
            report["ip_sockets"] = blocked_here or "available"
            launch = socketless_launch if blocked_here else _plain_launch
            name = LAUNCH if blocked_here else "in-process engine core"
            try:
                with launch() as replaced:
                    llm = LLM(model=out, additional_config={"maxtext_config": maxtext}, max_model_len=MAX_LEN,
                              max_num_batched_tokens=MAX_LEN, max_num_seqs=SEQS, tensor_parallel_size=1,
                              enable_prefix_caching=True, dtype=str(maxtext.get("dtype", "float32")))  # fmt: skip
                    answers = llm.generate(prompts, SamplingParams(max_tokens=new, temperature=0))
            except Exception as exc:
                report["attempts"].append({"name": name, "error": f"{type(exc).__name__}: {exc}",
                                           "blocked_by": _socket_blocked(exc),
                                           "traceback": traceback.format_exc()[-4000:]})  # fmt: skip
                raise
            got = [list(a.outputs[0].token_ids) for a in answers]
            greedy = rm.hf_reference(rm.smollm2_gguf(), tier.cache).greedy
            want = [greedy[rm.PROMPTS.index(p)][:new] for p in prompts]
            report["attempts"].append({"name": name, "replaced": dict(replaced), "served": got, "reference": want})
            assert got == want, f"vllm.LLM ({name}) served {got}, transformers {want}"
            if blocked_here:
                assert replaced["init"] >= 1, f"{LAUNCH} was in but vLLM made no process group through it"
    finally:
        torchvision_placeholder.uninstall()
        tier.record("vllm-llm", report)
