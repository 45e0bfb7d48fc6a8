"""The environments that run tpu-inference's real RPA kernel through the dispatcher: one per tpu-inference
range installed (0.32.0 in maxtext-0.2.5 and the backport's, 0.19.0 in maxtext-0.2.1, and every kernel-only
environment of the matrix, read from it so a new one cannot be left out)."""

from helpers.shipped import shipped_matrix

_KERNEL_TESTS = "tests/compat/test_paged_rpa.py"

REAL_KERNEL_ENVS: tuple[str, ...] = (
    "maxtext-0.2.5",
    "maxtext-0.2.1",
    "maxtext-0.1.0-jax011",
    *(name for name, spec in shipped_matrix().environments.items() if _KERNEL_TESTS in spec.tests),
)
