"""Test helpers shipped with the library: tiny MaxText models, references, fixtures.

Nothing here is on a product path; the pytest plugin and the project's own tests use it.
"""
