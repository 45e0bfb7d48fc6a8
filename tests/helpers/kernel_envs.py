"""The environments that run tpu-inference's real RPA kernel through the dispatcher: one per tpu-inference
range installed (0.32.0 in maxtext-0.2.5 and the backport's, 0.19.0 in maxtext-0.2.1, and the kernel-only
ones). Their `pytest.mark.envs` lists name each of them once, here."""

REAL_KERNEL_ENVS = (
    "maxtext-0.2.5", "maxtext-0.2.1", "maxtext-0.1.0-jax011",
    "tpu-inference-0.22.1", "tpu-inference-0.26.0", "tpu-inference-0.27.0",
)  # fmt: skip
