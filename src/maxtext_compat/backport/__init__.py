"""The vLLM path for MaxText releases that predate it (0.1.0): KV sessions and what the hooks route to (the hooks
themselves are shims: `maxtext_compat.shims.backport_hooks`).

Why a session: a 0.1.0 decoder layer calls its Attention the old way (no KV arguments, a
bare `out` back), and its Decoder loops over layers that return bare `y`. Rather than
re-implementing each family's layer, the backport keeps MaxText's own code path and routes
only the attention op: an active `KVSession` hands each Attention, in call order, its
layer's paged KV cache and the batch metadata; the op runs tpu-inference's ragged paged
attention on the q/k/v the layer computed itself (projections, qk-norm, RoPE, scalars) and
the session collects the updated caches. Outside a session the hooks do nothing.
"""
