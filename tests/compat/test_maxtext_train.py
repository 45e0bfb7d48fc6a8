"""MaxText's own training program, as its users run it, on a release's full pin set: with our shims and without.

The claim "every old call inside MaxText keeps its result, training included" made on MaxText's own program:
train.py (0.1.0: `MaxText.train`; 0.2.5: `maxtext.trainers.pre_train.train`) runs 3 steps of a tiny model on
synthetic data, once as is and once in a process where `maxtext_compat.shims.install()` ran first (0.1.0 gets the
vLLM backport, 0.2.5 the known-defects profile). The per-step losses, gradient and parameter norms MaxText writes to
its metrics file must be equal to the bit, and the shimmed run must really have had patches in it.
"""

from __future__ import annotations

import math

import pytest

from helpers.maxtext_trainer import CHECKPOINTED, STEPS, program, train

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.envs("maxtext-0.2.5-full", "maxtext-0.1.0-full")]

METRICS = ("learning/loss", "learning/grad_norm", "learning/raw_grad_norm", "learning/param_norm")


def test_train_runs_and_the_shims_leave_every_step_equal(maxtext_trained, tmp_path):
    plain = maxtext_trained[0]  # the session's plain run (its checkpoint is served by test_serve_trained_checkpoint)
    shimmed, log = train(tmp_path, CHECKPOINTED, steps=STEPS, shimmed=True)
    patches = int(log.split("maxtext-compat patches:", 1)[1].split()[0])
    assert patches > 0, "the shimmed run had no patch installed: it proves nothing"
    assert [r["step"] for r in plain] == list(range(STEPS)), plain
    losses = [r["learning/loss"] for r in plain]
    assert all(math.isfinite(x) and 0 < x < 2 * math.log(256) for x in losses), losses  # near log(vocab) untrained
    for name in METRICS:
        if name in plain[0]:
            assert [r[name] for r in shimmed] == [r[name] for r in plain], name  # equal to the bit
    print(f"\n[train] {program()[0]}: {patches} patches; losses {losses}, equal with and without the shims")
