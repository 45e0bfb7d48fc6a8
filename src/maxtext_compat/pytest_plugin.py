"""pytest plugin (entry point `pytest11`) for downstream users of maxtext-compat.

Loaded by pytest in every environment that installs maxtext-compat, so it must stay
light: no jax or MaxText import until a fixture is used.
"""

from __future__ import annotations
