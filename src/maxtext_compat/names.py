"""Every shim's name, and the few MaxText words the package matches on, written once.

Why one module: a name is what `shims.install(name)` takes, what `doctor` and the ledger list and what the
patched classes' markers carry; spelled in one place, a module that installs a shim and one that asks about it
cannot drift apart.
"""

from __future__ import annotations

# MaxText's shims (maxtext_compat.shims)
VLLM_BACKPORT = "vllm-backport"  # new calls on a pre-#2616 release: the call rule, its KV session, RPA
KNOWN_DEFECTS = "known-defects"  # the fixes a MaxText row lists
CALL_RULE = "call-rule"  # the call rule in the classes of a release with the KV parameters
BACKPORT_HOOKS = "backport-hooks"  # the backport's hooks alone, inert outside a KV session

# the TPU-only pieces on a CPU (maxtext_compat.cpu)
CPU_RPA = "cpu-rpa"
CPU_SERVING = "cpu-serving"

# the serving stack (maxtext_compat.serving_fixes, maxtext_compat.serve.vllm_plugin)
SERVING_REQUESTS = "serving-requests"
SERVING_OUTPUT_HEAD = "serving-output-head"
PLUGIN_CONFIG = "plugin-config"

# The releases the shims were verified on, as requirement strings (`Shim.verified_for`, checked before install):
# the spans the compat matrix's rows cover (tests/unit/test_shim_verified_ranges.py holds them to the matrix).
MAXTEXT_RELEASES = "maxtext>=0.1.0,<0.3"
TPU_INFERENCE_RELEASES = "tpu-inference>=0.11.1,<0.33"
CPU_JAX_RELEASES = "jax>=0.7.2,<0.13"  # the CPU kernel stand-in patches jax's private Pallas TPU interpreter

TRAIN = "train"  # MaxText's MODEL_MODE_TRAIN, the same word in every release
