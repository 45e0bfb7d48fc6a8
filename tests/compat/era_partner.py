"""Run one era's attention test body natively, on given weights, in this environment.

test_both_eras.py starts this in the environment of the release a body was written for (the new-era body on
MaxText 0.2.5, the old-era body on 0.1.0), so the body's declared run on another release can be compared with
its native run where it belongs. Not collected by pytest (no test_ prefix); runs as a script:

    python tests/compat/era_partner.py REQUEST.json

REQUEST: {"era": "old" | "new", "runs": [{"variant": ..., "weights": IN.npz, "out": OUT.npz}, ...]}.
Each OUT holds full, prefill and decoded (float32), written to a temporary name and renamed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from maxtext_compat.atomic_file import replacing


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    request = json.loads(Path(argv[0]).read_text())
    sys.path.insert(0, str(Path(__file__).parent))
    import test_both_eras as eras  # the bodies and the Attention recipe, exactly as the test runs them

    if request["era"] != eras.NATIVE_ERA:
        print(f"this release runs the {eras.NATIVE_ERA}-era body natively, not {request['era']!r}", file=sys.stderr)
        return 2
    for run in request["runs"]:
        _, result = eras._run(run["variant"], request["era"], weights_in=run["weights"])
        out = Path(run["out"])
        with replacing(out) as tmp, open(tmp, "wb") as f:  # two environments may write the same answer
            arrays = dict(zip(("full", "prefill", "decoded"), result, strict=True))
            np.savez(f, **{k: np.asarray(a, np.float32) for k, a in arrays.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
