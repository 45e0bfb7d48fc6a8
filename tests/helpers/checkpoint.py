"""Write a small MaxText checkpoint that `load_parameters_path` restores (tests, demos, users).

Why: serving tests must compare vLLM's tokens with MaxText's own decode of the *same* weights,
and no model hub is reachable; a random-weight checkpoint written by the installed release's
backend in the layout its loader restores gives both sides identical weights.
"""

from __future__ import annotations

from typing import Any

from maxtext_compat.matrix import MaxTextRow


def write_checkpoint(cfg: Any, path: str, *, seed: int = 0, mesh: Any = None, row: MaxTextRow | None = None) -> str:
    """Random weights of `cfg`'s model at `path`; returns the `load_parameters_path` to serve with."""
    from maxtext_compat.resolution.installed import installed_row
    from maxtext_compat.serving.backend import backend_for

    return backend_for(row or installed_row()).save_checkpoint(cfg, path, seed, mesh)
