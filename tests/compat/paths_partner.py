"""Run the drawn new calls of test_paths_agree.py in this environment, on the weights the test saved.

test_paths_agree.py (in maxtext-0.2.5) starts this in maxtext-0.1.0-jax011 so the backport answers the same
calls as the adapter there. Not collected by pytest (no test_ prefix); runs as a script:

    python tests/compat/paths_partner.py REQUEST.json

REQUEST: {"weights": DIR with attention.npz and transformer.npz, "ready": the file the test writes once they
are there, "parent": the test's pid, "cases": [...], "out": DIR}. The model is built while the test builds its
own; the weights are loaded once READY exists (an event: no deadline here, the test's timeout guards a hang,
and a test that is gone ends the wait). Writes OUT/outcomes.json (one outcome per case, in order) and
OUT/<i>.npz for each call that ran.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    request = json.loads(Path(argv[0]).read_text())
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent)]  # the test module, and tests/ for its helpers
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import numpy as np

    from maxtext_compat.cpu import rpa as cpu_rpa

    assert cpu_rpa.install().active  # before MaxText is imported and before the first trace
    import test_paths_agree as agree  # the cases run exactly as the test runs them

    out = Path(request["out"])
    out.mkdir(parents=True, exist_ok=True)
    world = agree.World()
    ready = Path(request["ready"])
    while not ready.exists():
        try:
            os.kill(request["parent"], 0)  # the test still runs
        except ProcessLookupError:
            return 3
        time.sleep(0.2)
    world.load(Path(request["weights"]))
    answers = []
    for i, case in enumerate(request["cases"]):
        answer, arrays = agree.outcome(world, case)
        if arrays:
            np.savez(out / f"{i}.npz", **arrays)
        answers.append(answer)
    (out / "outcomes.json").write_text(json.dumps(answers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
