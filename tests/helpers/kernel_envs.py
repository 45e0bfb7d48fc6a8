"""The environments that run tpu-inference's real RPA kernel through the dispatcher: one per tpu-inference
release and jax installed (0.32.0 on jax 0.11.2 in maxtext-0.2.3, which shares maxtext-0.2.5's pins but not its
load, 0.19.0 in maxtext-0.2.1, and every kernel-only environment of tests/environments.yaml, read from it so a new
one cannot be left out)."""

from helpers.shipped import ci_matrix

_KERNEL_TESTS = "tests/compat/test_paged_rpa.py"

REAL_KERNEL_ENVS: tuple[str, ...] = (
    "maxtext-0.2.3",
    "maxtext-0.2.1",
    *(name for name, spec in ci_matrix().environments.items() if _KERNEL_TESTS in spec.tests),
)
# Where make test runs the kernel's whole sweep (every configuration, TP): the first and last form of each kernel
# generation (0.11's curried call, 0.19's flat one, 0.25 on Python 3.11, 0.32 on jax 0.12). Everywhere else make test
# calls the kernel through the range's own form on every batch shape (one configuration) and checks its refusals;
# the sweep there is make test-extended's.
SWEEP_ENVS: tuple[str, ...] = (
    "tpu-inference-0.11.1", "maxtext-0.2.1", "tpu-inference-0.25.0", "tpu-inference-0.32.0-jax012",
)  # fmt: skip
# (an environment make test leaves out whole, `extended: true`, runs everything in make test-extended)
_EXTENDED_WHOLE = {name for name, spec in ci_matrix().environments.items() if spec.extended}
SWEEP_ELSEWHERE_EXTENDED = tuple(name for name in REAL_KERNEL_ENVS if name not in {*SWEEP_ENVS, *_EXTENDED_WHOLE})


# -- facts read from the installed tpu-inference itself (independent of the code under test) ----------

V3_KERNEL = "tpu_inference.kernels.ragged_paged_attention.v3.kernel"
# The v3 kernel's block-size function: get_default_block_sizes from 0.18, get_tuned_block_sizes before.
V3_BLOCK_SIZE_FUNCTIONS = ("get_default_block_sizes", "get_tuned_block_sizes")


def installed_attention_interface():
    """tpu-inference's attention_interface module: layers.common from 0.12, layers.jax in 0.11."""
    import importlib

    for name in ("tpu_inference.layers.common.attention_interface", "tpu_inference.layers.jax.attention_interface"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise AssertionError("the installed tpu-inference has no attention_interface module")


def installed_v3_block_size_function() -> str:
    """The name of the function the installed v3 kernel sizes its blocks with."""
    import importlib

    kernel = importlib.import_module(V3_KERNEL)
    return next(name for name in V3_BLOCK_SIZE_FUNCTIONS if hasattr(kernel, name))


def installed_hd64_kernel() -> bool:
    """Whether the installed tpu-inference ships the head_dim-64 kernel (0.12 on)."""
    import importlib.util

    return importlib.util.find_spec("tpu_inference.kernels.ragged_paged_attention.v3.kernel_hd64") is not None


def jax_below(version: str) -> bool:
    """Whether the installed jax is older than `version`."""
    import jax
    from packaging.version import Version

    return Version(jax.__version__) < Version(version)
