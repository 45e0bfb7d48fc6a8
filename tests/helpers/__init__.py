"""Fakes and harnesses shared by several test files, imported as `helpers` (see tests/conftest.py)."""
