"""The serving entry points, beside `serving/` (what they start): `maxtext-compat serve` (`command`) and the vLLM
general plugin (`vllm_plugin:register`, named in pyproject.toml's `vllm.general_plugins`)."""
