"""The call convention: what a call to a MaxText layer means, and what it gets back, on each release.

One rule serves both deliveries (the `adapters` wrappers and the `shims` profiles): `kinds` says per
layer kind how its KV arguments are named and what its old and new returns are; `signature` reads a
release's real signature; `translate` maps a call onto it; `returns` shapes the result; `policy`
applies deprecation and strict mode; `declared` holds the caller convention a user declared; `rule`
decides, per call, which convention it is and runs it; `backport` runs new calls on releases that
predate them. Importing this package imports neither jax nor MaxText.
"""
