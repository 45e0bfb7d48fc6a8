"""The call convention: what a call to a MaxText layer means, and what it gets back, on each release.

One rule serves both deliveries (the `adapters` wrappers and the `shims` profiles): `kinds` says per
layer kind how its KV arguments are named and what its old and new returns are; `signature` reads a
release's real signature; `binding` binds a call to it at the speed of a Python call; `translate` maps a
call onto it; `returns` shapes the result; `policy` applies deprecation and strict mode; `callers` holds
the caller convention a user declared and tells MaxText's own calls apart; `rule` decides, per call,
which convention it is and runs it (a writing call's checks and the 0.1.0 backport reach it from above,
as the call site's write path). Importing this package imports neither jax nor MaxText.
"""
