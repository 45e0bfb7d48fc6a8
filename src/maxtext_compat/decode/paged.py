"""Greedy generation through the paged-KV (vLLM) call of any release: ragged prefill, then decode steps.

Why an engine here: a serving runner (vLLM + tpu-inference) owns batching, pages and
metadata; to show on a plain CPU that the new call convention works the same on every
MaxText release, we need the same loop without vLLM: allocate pages, order the ragged
batch decode-first (`paged.build_metadata`), pad to fixed buckets so each phase compiles
once, call the wrapped Transformer the new way, and turn the pre-norm hidden state into
logits (`logits_from_hidden`, what MaxText's vLLM adapter does). On MaxText 0.1.0 the call
runs the backport; on 0.2.x MaxText's own vLLM path (config attention="vllm_rpa").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import numpy as np

from maxtext_compat.contract import PositiveInt, checked
from maxtext_compat.convention.kinds import KINDS
from maxtext_compat.decode.timing import TraceCountingJit, timed_call
from maxtext_compat.decode.types import Buckets, Generation, StepRecord, check_force, check_prompts, next_inputs
from maxtext_compat.errors import CacheCapacityError, InvalidArgumentError, InvalidArgumentTypeError
from maxtext_compat.paged import KVCacheLayout, PageAllocator, SequenceSlice, build_metadata, head_parallelism
from maxtext_compat.paged.layout import cdiv, dtype_name
from maxtext_compat.paged.metadata import next_pow2

if TYPE_CHECKING:
    from jax.sharding import Mesh

AUTOREGRESSIVE = "autoregressive"  # MaxText's MODEL_MODE_AUTOREGRESSIVE in every release


def _step(graphdef: Any, state: Any, tokens: Any, positions: Any, caches: list[Any], metadata: Any) -> Any:
    """One paged step of the wrapped Transformer: (logits [T, vocab], updated caches)."""
    from flax import nnx

    from maxtext_compat.convention.returns import logits_from_hidden

    model = nnx.merge(graphdef, state)
    hidden, new = model(tokens, positions, kv_caches=caches, attention_metadata=metadata, model_mode=AUTOREGRESSIVE)
    logits = logits_from_hidden(model, hidden, AUTOREGRESSIVE)
    return logits.reshape(logits.shape[0], logits.shape[-1]), list(new) if new is not None else None


def on_mesh(state: Any, mesh: Any) -> Any:
    """`state` with every array that is not laid out on `mesh` replicated over `mesh`.

    Why: MaxText 0.1.0 on flax 0.12 creates its parameters without sharding metadata, so a
    model built on a 4-device mesh holds them on one device, and a step whose KV caches are
    sharded over 4 devices refuses the mix. They must be replicated on the cache (RPA) mesh,
    not on MaxText's own mesh: on CPU, arguments on a mesh with a 'tensor' axis make XLA's SPMD
    partitioner reject the interpreted kernel's io_callback inside tpu-inference's shard_map
    ("side-effect HLO cannot have a replicated sharding"). Arrays already on `mesh` (0.2.x,
    whose cache mesh is the model's) keep their sharding.
    """
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = set(mesh.devices.flat)
    replicated = NamedSharding(mesh, P())

    def place(x: Any) -> Any:
        sharding = getattr(x, "sharding", None)
        if sharding is None:
            return x
        same = (
            isinstance(sharding, NamedSharding)
            and tuple(sharding.mesh.axis_names) == tuple(mesh.axis_names)
            and set(sharding.device_set) == devices
        )
        return x if same else jax.device_put(x, replicated)

    return jax.tree.map(place, state)


@checked
def cache_mesh_for(model: Any) -> Any:
    """The mesh the KV caches live on: the model's own (0.2.x, vllm.yml axes) or the backport's RPA mesh."""
    from maxtext_compat.paged.sharding import check_mesh

    mesh = getattr(model, "mesh", None)
    if mesh is None:
        raise InvalidArgumentError("the model has no mesh", argument="model.mesh", fix="build it with a mesh")
    if model._mc_row.has_kv_params:
        check_mesh(mesh, argument="model.mesh")
        return mesh
    from maxtext_compat.backport.attention import rpa_mesh_for

    return rpa_mesh_for(mesh)


@checked
def layout_for_model(
    model: Any, *, num_pages: PositiveInt, page_size: PositiveInt, mesh: Mesh | None = None
) -> KVCacheLayout:
    """The KV-cache layout of `model`'s attention (heads, head_dim, dtype, TP of the cache mesh)."""
    cfg = model.config
    tp = head_parallelism(mesh) if mesh is not None else 1
    return KVCacheLayout(num_pages, page_size, int(cfg.num_kv_heads), int(cfg.head_dim), dtype_name(cfg.dtype), tp)


@checked
def default_buckets(prompts: Sequence[Sequence[int]], num_steps: int, layout: KVCacheLayout) -> Buckets:
    """Power-of-two buckets that fit this batch (pass Buckets explicitly to pin shapes across batches)."""
    longest = max(len(p) for p in prompts) + num_steps
    return Buckets(
        max_num_tokens=max(8, next_pow2(sum(len(p) for p in prompts))),
        max_num_seqs=next_pow2(len(prompts)),
        pages_per_seq=next_pow2(cdiv(longest, layout.page_size)),
    )


@checked
class PagedEngine:
    """Greedy generation of a batch of prompts through a Transformer's paged-KV call.

    model: a MaxText Transformer (NNX) of the installed release, or `wrap(...)` of one. On
    0.2.x its config must say attention="vllm_rpa" (tiny_config(vllm=True)); on 0.1.0 any
    unscanned train-mode model works (the backport routes attention to RPA).
    layout: the cache layout (default: from the config, `num_pages` x `page_size`, TP = the
    cache mesh's model axis). buckets: fixed padded sizes (default: fitted per batch).
    context: a factory of the mesh context every call runs under (default: the release's).
    """

    def __init__(
        self,
        model: Any,
        *,
        layout: KVCacheLayout | None = None,
        num_pages: PositiveInt = 32,
        page_size: PositiveInt = 16,
        buckets: Buckets | None = None,
        context: Callable[[], AbstractContextManager[Any]] | None = None,
    ) -> None:
        from maxtext_compat.adapters import wrap

        if getattr(type(model), "_mc_native", None) is None:
            model = wrap(model)
        if not KINDS[model._mc_kind].is_model:
            raise InvalidArgumentTypeError(
                "the engine drives a whole Transformer",
                argument="model",
                expected="a MaxText Transformer (or wrap() of one)",
                found=f"{type(model).__qualname__} (kind {model._mc_kind})",
                fix="pass the whole MaxText Transformer (the model), not one of its layers",
            )
        self.model = model
        self.row = model._mc_row
        self.config = model.config
        self._check_config()
        self.cache_mesh = cache_mesh_for(model)
        self.layout = layout or layout_for_model(model, num_pages=num_pages, page_size=page_size, mesh=self.cache_mesh)
        tp = head_parallelism(self.cache_mesh)
        if self.layout.tp != tp:
            raise InvalidArgumentError(
                "the cache layout's tensor parallelism differs from the model's",
                argument="layout.tp",
                expected=tp,
                found=self.layout.tp,
                fix=f"use layout.with_tp({tp})",
            )
        self.buckets = buckets
        if context is None:
            from maxtext_compat.resolution.installed import mesh_context

            row, cfg, mesh = self.row, self.config, model.mesh
            context = lambda: mesh_context(cfg, mesh, row=row)  # noqa: E731
        self._context = context
        import functools

        from flax import nnx

        # The graph structure is fixed by construction (weights may change: state is split per run);
        # closed over rather than a static argument because some releases' GraphDefs are unhashable.
        self._graphdef = nnx.split(self.model)[0]
        self._step = TraceCountingJit(functools.partial(_step, self._graphdef))

    def _check_config(self) -> None:
        cfg = self.config
        if getattr(cfg, "scan_layers", False):
            raise InvalidArgumentError(
                "the paged path needs an unscanned decoder",
                argument="config.scan_layers",
                expected="False (MaxText's configs/inference/vllm.yml sets it)",
                found=True,
                fix="build the model with scan_layers=False and load "
                "maxtext_compat.serving.param_trees.unscan_params(...)",
            )
        modes = self.row.vllm.attention_modes if self.row.vllm else ()
        if self.row.has_kv_params and cfg.attention not in modes:
            raise InvalidArgumentError(
                f"MaxText {self.row.name} writes the paged KV cache only with attention in {list(modes)}",
                argument="config.attention",
                expected=f"one of {list(modes)}",
                found=repr(cfg.attention),
                fix="build the config from configs/inference/vllm.yml (testing.tiny.tiny_config(vllm=True))",
            )

    def allocate_caches(self) -> list[Any]:
        """Zeroed caches, one per layer, sharded as tpu-inference allocates them (no reshard at step 2)."""
        return self.layout.allocate(int(self.config.num_decoder_layers), mesh=self.cache_mesh)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        num_steps: int,
        *,
        force: Sequence[Sequence[int]] | None = None,
        allocator: PageAllocator | None = None,
        prefill_chunk: int | None = None,
    ) -> Generation:
        """One ragged prefill of all prompts, then `num_steps` decode steps of the whole batch.

        force: teacher forcing, force[i][k] is fed at decode step k+1 instead of the greedy
        token (compares two paths on identical inputs even where an argmax is a near-tie).
        allocator: where pages come from (default: a fresh one over the whole cache);
        requests are the prompts' indices and are freed at the end (their pages are in the result).
        prefill_chunk: feed each prompt at most this many tokens per call (vLLM's chunked prefill:
        later chunks attend to the cached earlier ones); only the last call, which ends every
        prompt, is a recorded step. Why: a kernel that gathers each query's whole context (the
        XLA RPA kernel) needs memory in proportion to tokens x context in one call.
        """
        from flax import nnx

        prompts_t = check_prompts(prompts, int(self.config.vocab_size))
        if num_steps < 0:
            raise InvalidArgumentError(
                "num_steps must be >= 0",
                argument="num_steps",
                found=num_steps,
                fix="pass num_steps >= 0 (the decode steps after the prefill; 0 runs the prefill only)",
            )
        forced = check_force(force, prompts_t, num_steps)
        buckets = self.buckets or default_buckets(prompts_t, num_steps, self.layout)
        alloc = allocator or PageAllocator(self.layout.num_pages, self.layout.page_size)
        rounds = prefill_rounds([len(p) for p in prompts_t], prefill_chunk)
        self._check_capacity(prompts_t, num_steps, buckets, alloc, max(sum(n for _, n in r) for r in rounds))
        state = on_mesh(nnx.split(self.model)[1], self.cache_mesh)
        caches = self.allocate_caches()
        gen = Generation("paged", prompts_t, layout=self.layout)
        ids = list(range(len(prompts_t)))
        try:
            fed = [0] * len(prompts_t)
            for r, parts in enumerate(rounds):
                seqs = [alloc.append(i, n) for i, n in parts]
                rows = [t for i, n in parts for t in prompts_t[i][fed[i] : fed[i] + n]]
                for i, n in parts:
                    fed[i] += n
                last = r == len(rounds) - 1
                caches = self._run(gen, "prefill", state, seqs, rows, buckets.max_num_tokens, buckets, caches,
                                   record=last)  # fmt: skip
            for k in range(num_steps):
                feed = next_inputs(gen.steps[-1], forced, k)
                seqs = [alloc.append(i, 1) for i in ids]
                caches = self._run(gen, "decode", state, seqs, feed, buckets.decode_rows, buckets, caches)
            gen.pages = tuple(alloc.pages(i) for i in ids)
        finally:
            for i in ids:
                if i in alloc.requests():
                    alloc.free(i)
        gen.caches = caches
        return gen

    def _check_capacity(
        self, prompts: tuple[tuple[int, ...], ...], num_steps: int, buckets: Buckets, alloc: PageAllocator,
        prefill_rows: int,
    ) -> None:  # fmt: skip
        """Refuse a run the buckets or the cache cannot finish before its first step runs (not at step k)."""
        size = self.layout.page_size
        longest = max(len(p) for p in prompts) + num_steps
        checks = [
            (prefill_rows <= buckets.max_num_tokens, "a prefill call has more tokens than the padded "
             "token capacity", "max_num_tokens", f">= {prefill_rows}", buckets.max_num_tokens),
            (len(prompts) <= min(buckets.max_num_seqs, buckets.decode_rows), "the batch has more sequences than "
             "the buckets hold", "max_num_seqs/decode_tokens", f">= {len(prompts)}",
             (buckets.max_num_seqs, buckets.decode_rows)),
            (cdiv(longest, size) <= buckets.pages_per_seq, "a sequence will need more pages than a block-table row "
             "holds", "pages_per_seq", f">= {cdiv(longest, size)} (longest prompt + num_steps = {longest} tokens)",
             buckets.pages_per_seq),
            (sum(cdiv(len(p) + num_steps, size) for p in prompts) <= alloc.num_free, "the KV cache has too few "
             "free pages for this run", "num_pages", f">= {sum(cdiv(len(p) + num_steps, size) for p in prompts)}"
             " free pages", f"{alloc.num_free} free"),
        ]  # fmt: skip
        for ok, message, argument, expected, found in checks:
            if not ok:
                raise CacheCapacityError(
                    message, argument=argument, expected=expected, found=found,
                    fix="raise the bucket / cache size, or run fewer or shorter prompts or steps",
                )  # fmt: skip

    def _run(
        self,
        gen: Generation,
        kind: str,
        state: Any,
        seqs: list[SequenceSlice],
        rows: list[int],
        num_rows: int,
        buckets: Buckets,
        caches: list[Any],
        *,
        record: bool = True,
    ) -> list[Any]:
        import jax.numpy as jnp

        md = build_metadata(
            seqs, self.layout, max_num_tokens=num_rows, max_num_seqs=buckets.max_num_seqs,
            pages_per_seq=buckets.pages_per_seq,
        )  # fmt: skip
        tokens = md.to_kernel_order(np.asarray(rows, np.int32))
        positions = np.asarray(md.input_positions, np.int32)
        args = (
            state,
            jnp.asarray(tokens)[:, None],
            jnp.asarray(positions)[:, None],
            caches,
            md.to_attention_metadata(),
        )
        with self._context():
            (logits, new), seconds, compile_s = timed_call(self._step, *args)
        if new is None or any(c is None for c in new):
            raise InvalidArgumentError(
                "the model returned no KV cache for a layer; the next step would lose the context",
                argument="model",
                expected=f"{len(caches)} updated caches",
                found=None if new is None else [i for i, c in enumerate(new) if c is None],
                fix="build the model with scan_layers=False (MaxText 0.2.x scanned llama2 drops its caches)",
            )
        if not record:  # an earlier chunk of a chunked prefill: only its KV cache writes matter
            return new
        host = md.from_kernel_order(np.asarray(logits))
        bounds = np.cumsum([0, *(s.q_len for s in seqs)])
        per_seq = tuple(host[bounds[i] : bounds[i + 1]] for i in range(len(seqs)))
        chosen = tuple(int(np.argmax(x[-1])) for x in per_seq)
        gen.steps.append(StepRecord(kind, per_seq, chosen, seconds))  # type: ignore[arg-type]
        gen.compile_seconds += compile_s
        gen.compiles += compile_s > 0
        return new


def prefill_rounds(lengths: Sequence[int], chunk: int | None) -> list[list[tuple[int, int]]]:
    """The prefill calls as [(prompt, tokens)] lists: one call with every prompt whole when `chunk` is None, else
    chunks of at most `chunk` tokens aligned to end together (every prompt's last chunk is in the last call)."""
    if chunk is None:
        return [[(i, n) for i, n in enumerate(lengths)]]
    if chunk < 1:
        raise InvalidArgumentError(
            "prefill_chunk must be positive", argument="prefill_chunk", expected=">= 1 or None", found=chunk,
            fix="pass the most tokens one prefill call may feed per prompt, or None for one call",
        )  # fmt: skip
    total = max(cdiv(n, chunk) for n in lengths)
    rounds: list[list[tuple[int, int]]] = [[] for _ in range(total)]
    for i, n in enumerate(lengths):
        k = cdiv(n, chunk)
        for j, size in enumerate([n - (k - 1) * chunk] + [chunk] * (k - 1)):
            rounds[total - k + j].append((i, size))
    return rounds
