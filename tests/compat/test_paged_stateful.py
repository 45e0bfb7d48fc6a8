"""Every KV write lands where the metadata says: a hypothesis state machine over the real RPA kernel.

Requests are started (prefill), extended (chunked prefill), decoded, freed and their pages reused, in
ragged multi-request steps, through maxtext_compat.paged (allocator + metadata) and maxtext_compat.kernel.rpa
(the real tpu-inference kernel on CPU). The oracle is independent of both: it keeps, per live request,
the K/V rows it wrote at each position, reads the cache back by the layout's definition (page
pages[p // page_size], slot p % page_size, combined row 2h = K of head h, 2h + 1 = V), and computes each
new token's attention output in float64 with numpy. After every step every live request's whole history
must read back exactly, and every output must match within f32 tolerance. A slice of a freed request
must be refused.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.envs("maxtext-0.2.5", "maxtext-0.2.1", "maxtext-0.1.0-jax011")]

jax = pytest.importorskip("jax")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule  # noqa: E402

from maxtext_compat import paged  # noqa: E402
from maxtext_compat.cpu import rpa as cpu_rpa  # noqa: E402
from maxtext_compat.errors import StaleSliceError  # noqa: E402
from maxtext_compat.kernel import rpa  # noqa: E402

PAGES, PAGE, TOKENS, SEQS, PER_SEQ = 12, 8, 32, 4, 4  # fixed padded shapes: one compile for the whole run
KV_HEADS, Q_HEADS, HEAD_DIM = 2, 4, 128
SCALE = HEAD_DIM**-0.5
TOL = 2e-5  # f32 kernel vs float64 oracle (measured max ~3e-6)


def _read(cache: np.ndarray, pages: list[int], n: int) -> tuple[np.ndarray, np.ndarray]:
    """The oracle's reader: K and V [n, KV_HEADS, HEAD_DIM] of positions 0..n-1, by the layout's definition."""
    pos = np.arange(n)
    page, slot = np.asarray(pages)[pos // PAGE], pos % PAGE
    rows = cache[page, slot, :, 0, :HEAD_DIM]  # [n, 2 * KV_HEADS, HEAD_DIM], f32 has packing 1
    return rows[:, 0::2], rows[:, 1::2]


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, first: int) -> np.ndarray:
    """float64 causal GQA attention of new tokens at positions first.. over k/v of positions 0.."""
    group = Q_HEADS // KV_HEADS
    out = np.empty(q.shape, np.float64)
    for t in range(q.shape[0]):
        end = first + t + 1
        for h in range(Q_HEADS):
            logits = (k[:end, h // group] @ q[t, h]) * SCALE
            w = np.exp(logits - logits.max())
            out[t, h] = (w / w.sum()) @ v[:end, h // group]
    return out


class KVMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.layout = paged.KVCacheLayout(PAGES, PAGE, KV_HEADS, HEAD_DIM, "float32")
        self.mesh = paged.make_mesh(1)
        self.alloc = paged.PageAllocator(PAGES, PAGE, seed=7)
        self.cache = jax.device_put(self.layout.allocate(1)[0], self.layout.sharding(self.mesh))
        self.kv: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # request -> K, V written so far (float64)
        self.freed_slices: list[paged.SequenceSlice] = []
        self.next_id = 0
        self.rng = np.random.default_rng(0)

    @rule(plan=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 9)), min_size=1, max_size=SEQS))
    def step(self, plan: list[tuple[int, int]]) -> None:
        """One ragged step: each entry starts a request (0) or adds q_len tokens to live request k-1."""
        live = sorted(self.kv)
        chosen: dict[int, int] = {}
        budget, free_pages = TOKENS, self.alloc.num_free
        for which, q_len in plan:
            rid = live[which - 1] if 0 < which <= len(live) else None
            if rid is None:
                rid, self.next_id = self.next_id, self.next_id + 1
            have = self.alloc.num_tokens(rid)
            held = len(self.alloc.pages(rid)) if rid in self.kv else 0
            new_pages = -(-(have + q_len) // PAGE) - held
            if rid in chosen or q_len > budget or have + q_len > PER_SEQ * PAGE or new_pages > free_pages:
                continue
            chosen[rid] = q_len
            budget, free_pages = budget - q_len, free_pages - new_pages
        if not chosen:
            return
        seqs = [self.alloc.append(rid, q_len) for rid, q_len in chosen.items()]
        md = paged.build_metadata(seqs, self.layout, max_num_tokens=TOKENS, max_num_seqs=SEQS, pages_per_seq=PER_SEQ)
        n = md.num_tokens
        q = self.rng.standard_normal((n, Q_HEADS, HEAD_DIM)).astype(np.float32)
        k = self.rng.standard_normal((n, KV_HEADS, HEAD_DIM)).astype(np.float32)
        v = self.rng.standard_normal((n, KV_HEADS, HEAD_DIM)).astype(np.float32)
        out, self.cache = rpa.ragged_paged_attention(
            md.to_kernel_order(q), md.to_kernel_order(k), md.to_kernel_order(v), self.cache, md,
            mesh=self.mesh, sm_scale=SCALE,
        )  # fmt: skip
        got = md.from_kernel_order(np.asarray(out))
        start = 0
        for s in seqs:
            rows = slice(start, start + s.q_len)
            old_k, old_v = self.kv.get(s.request_id, (np.zeros((0, KV_HEADS, HEAD_DIM)),) * 2)
            all_k = np.concatenate([old_k, k[rows].astype(np.float64)])
            all_v = np.concatenate([old_v, v[rows].astype(np.float64)])
            self.kv[s.request_id] = (all_k, all_v)
            want = _attend(q[rows].astype(np.float64), all_k, all_v, s.kv_len - s.q_len)
            np.testing.assert_allclose(got[rows], want, atol=TOL, rtol=0)
            start += s.q_len

    @precondition(lambda self: bool(self.kv))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.kv)))
        if self.alloc.num_free:  # a slice cut, then its request freed
            self.freed_slices.append(self.alloc.append(rid, 1))
        self.alloc.free(rid)
        del self.kv[rid]

    @precondition(lambda self: bool(self.freed_slices))
    @rule()
    def reuse_a_freed_slice(self) -> None:
        stale = self.freed_slices[-1]
        with pytest.raises(StaleSliceError):
            paged.build_metadata([stale], self.layout, max_num_tokens=TOKENS, max_num_seqs=SEQS,
                                 pages_per_seq=PER_SEQ)  # fmt: skip

    @invariant()
    def every_live_request_reads_back_exactly(self) -> None:
        cache = np.asarray(self.cache)
        for rid, (k, v) in self.kv.items():
            got_k, got_v = _read(cache, list(self.alloc.pages(rid)), len(k))
            np.testing.assert_array_equal(got_k, k.astype(np.float32))
            np.testing.assert_array_equal(got_v, v.astype(np.float32))


@pytest.fixture(scope="module", autouse=True)
def kernel_on_cpu():
    assert cpu_rpa.install().active


def test_kv_writes_land_where_the_metadata_says():
    budget = settings(max_examples=8, stateful_step_count=6, deadline=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))  # fmt: skip
    hypothesis.stateful.run_state_machine_as_test(KVMachine, settings=budget)
