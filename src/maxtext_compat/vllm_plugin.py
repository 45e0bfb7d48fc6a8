"""vLLM general plugin entry point (filled in by the serving work)."""

from __future__ import annotations


def register() -> None:
    """Called by vLLM in every process; must be idempotent."""
