"""The per-layer paged KV-cache layout tpu-inference's RPA kernels read and write.

Why a layout object: the kernel validates the cache shape against its own formula and fails
deep inside a trace when it differs; tensor parallelism changes the formula (tpu-inference
sizes the combined-head axis per shard and multiplies by the shard count); and head_dim 64
goes to a different kernel with a different layout. One object that knows all of it lets us
allocate the right array, check a user's array before the kernel runs, and find a token's
K/V in the cache for read-back.

Layouts (packing = 32 // dtype bits, `align(x, n)` rounds x up to a multiple of n):
* v3 (head_dim != 64): [pages, page_size, align(2*H, packing)//packing, packing, align(head_dim, 128)]
  with K and V interleaved per head on the combined axis (row 2h = K of head h, 2h+1 = V),
  zero padding to the packing multiple and to 128 lanes (tpu-inference `merge_kv`).
* hd64 (head_dim == 64, tpu-inference >= 0.12): [pages, page_size, align(H, packing)//packing,
  packing, 128], K in lanes 0..63 and V in lanes 64..127 of the head's row.
* Tensor parallelism `tp`: H is first made shardable exactly as tpu-inference does
  (`get_num_kv_heads_by_tp`): when H < tp the KV heads are repeated up to tp
  (`jnp.repeat`, so cache head e holds model head e // (tp // H)); otherwise H must divide
  by tp. Each shard holds H/tp heads laid out as above, and the global combined axis is the
  shards' axes concatenated (`shape[2] *= tp` in tpu-inference's `get_kv_cache_shape_with_mesh`).
  For tp == 1 this is the kernel's own formula.

Pure python (no numpy/jax at import) so the unit environment can test the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from maxtext_compat.contract import Array, NonNegativeInt, PositiveInt, Rule, checked
from maxtext_compat.errors import InvalidArgumentError

if TYPE_CHECKING:
    from jax.sharding import Mesh

LANES = 128
HD64 = 64

# Floating dtypes the kernel accepts (it refuses integer caches; quantise outside the kernel).
FLOAT_BITS: dict[str, int] = {
    "float32": 32,
    "bfloat16": 16,
    "float16": 16,
    "float8_e4m3fn": 8,
    "float8_e5m2": 8,
    "float8_e4m3fnuz": 8,
    "float8_e5m2fnuz": 8,
    "float8_e4m3b11fnuz": 8,
}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def align(x: int, n: int) -> int:
    return cdiv(x, n) * n


def dtype_name(dtype: Any) -> str:
    """Canonical dtype name from a str, numpy/jax dtype, scalar type or array."""
    if isinstance(dtype, str):
        return {"bf16": "bfloat16", "f32": "float32", "fp32": "float32", "f16": "float16"}.get(dtype, dtype)
    inner = getattr(dtype, "dtype", None)
    if inner is not None and hasattr(inner, "name"):
        return str(inner.name)
    if hasattr(dtype, "name") and isinstance(dtype.name, str) and not isinstance(dtype, type):
        return dtype.name
    import numpy as np

    return np.dtype(dtype).name


def dtype_bits(dtype: Any, *, argument: str = "dtype") -> int:
    name = dtype_name(dtype)
    if name not in FLOAT_BITS:
        raise InvalidArgumentError(
            "the RPA kernel only accepts a floating-point KV cache",
            argument=argument,
            expected=f"one of {sorted(FLOAT_BITS)}",
            found=name,
            fix="quantise outside the kernel and keep the cache in float32 or bfloat16",
        )
    return FLOAT_BITS[name]


def _dtype_like(x: object) -> bool:
    return isinstance(x, (str, type)) or hasattr(x, "name") or hasattr(x, "dtype")


# A dtype or its name; which dtypes the kernel takes is a value check (dtype_bits names them).
DType = Annotated[
    Any,
    Rule("a dtype or its name ('float32', 'bfloat16', jnp.float32, ...)", _dtype_like,
         "pass {name} as a dtype name such as 'float32' or 'bfloat16'", is_type=True),
]  # fmt: skip


@checked
def kv_heads_for_tp(num_kv_heads: PositiveInt, tp: PositiveInt) -> int:
    """KV heads the cache holds under tensor parallelism (tpu-inference `get_num_kv_heads_by_tp`)."""
    if tp <= num_kv_heads:
        if num_kv_heads % tp:
            raise InvalidArgumentError(
                "KV heads cannot be split evenly over the tensor-parallel shards",
                argument="tp",
                expected=f"a divisor of num_kv_heads={num_kv_heads}, or a multiple of it",
                found=tp,
                fix=f"use tp in {[d for d in range(1, num_kv_heads + 1) if num_kv_heads % d == 0]} "
                "or a multiple of num_kv_heads (heads are then replicated)",
            )
        return num_kv_heads
    if tp % num_kv_heads:
        raise InvalidArgumentError(
            "KV heads can only be replicated up to a tensor-parallel degree that is a multiple of them",
            argument="tp",
            expected=f"a multiple of num_kv_heads={num_kv_heads}",
            found=tp,
            fix=f"use tp={num_kv_heads * (tp // num_kv_heads or 1)} or another multiple of {num_kv_heads}",
        )
    return tp


@checked
@dataclass(frozen=True)
class KVCacheLayout:
    """Geometry of one layer's paged KV cache for the installed RPA kernel.

    num_kv_heads / head_dim are the model's; `tp` the tensor-parallel degree the cache is
    sharded over; `hd64` None picks the head_dim-64 kernel layout when head_dim == 64 (what
    tpu-inference >= 0.12 does; 0.11.x has no hd64 kernel: pass hd64=False).
    """

    num_pages: PositiveInt
    page_size: PositiveInt
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    dtype: DType = "float32"  # kept as its name
    tp: PositiveInt = 1
    hd64: bool | None = None
    _resolved_hd64: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("num_pages", "page_size", "num_kv_heads", "head_dim", "tp"):
            object.__setattr__(self, name, int(getattr(self, name)))  # numpy integers become ints
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        bits = dtype_bits(self.dtype)
        packing = 32 // bits
        if self.page_size % packing:
            raise InvalidArgumentError(
                "page_size must be a multiple of the dtype packing (the kernel writes whole packed rows)",
                argument="page_size",
                expected=f"a multiple of {packing} for {self.dtype}",
                found=self.page_size,
                fix=f"use page_size={align(self.page_size, packing)}",
            )
        hd64 = self.head_dim == HD64 if self.hd64 is None else bool(self.hd64)
        if hd64 and self.head_dim != HD64:
            raise InvalidArgumentError(
                "the hd64 layout is only for head_dim 64",
                argument="hd64",
                expected=f"False (or None) for head_dim {self.head_dim}",
                found=f"hd64=True with head_dim {self.head_dim}",
                fix="leave hd64=None to pick the layout from head_dim, or pass hd64=False; hd64=True needs head_dim 64",
            )
        object.__setattr__(self, "_resolved_hd64", hd64)
        kv_heads_for_tp(self.num_kv_heads, self.tp)  # raises on an impossible split

    # -- derived geometry ----------------------------------------------------------------------

    @property
    def kernel(self) -> str:
        """'hd64' or 'v3': which tpu-inference kernel this layout feeds."""
        return "hd64" if self._resolved_hd64 else "v3"

    @property
    def bits(self) -> int:
        return FLOAT_BITS[self.dtype]

    @property
    def packing(self) -> int:
        return 32 // self.bits

    @property
    def cache_kv_heads(self) -> int:
        """KV heads stored (>= num_kv_heads: repeated up to tp when num_kv_heads < tp)."""
        return kv_heads_for_tp(self.num_kv_heads, self.tp)

    @property
    def replication(self) -> int:
        """How many cache heads hold each model head."""
        return self.cache_kv_heads // self.num_kv_heads

    @property
    def heads_per_shard(self) -> int:
        return self.cache_kv_heads // self.tp

    @property
    def rows_per_shard(self) -> int:
        """Combined-axis rows (K/V slots incl. packing padding) of one shard."""
        per = self.heads_per_shard if self._resolved_hd64 else 2 * self.heads_per_shard
        return align(per, self.packing)

    @property
    def lanes(self) -> int:
        return LANES if self._resolved_hd64 else align(self.head_dim, LANES)

    @property
    def padded_head_dim(self) -> int:
        return self.lanes

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        combined = self.tp * self.rows_per_shard // self.packing
        return (self.num_pages, self.page_size, combined, self.packing, self.lanes)

    @property
    def shard_shape(self) -> tuple[int, int, int, int, int]:
        p, s, c, k, d = self.shape
        return (p, s, c // self.tp, k, d)

    @property
    def bytes_per_token(self) -> int:
        _, _, c, k, d = self.shape
        return c * k * d * self.bits // 8

    @property
    def bytes_per_page(self) -> int:
        return self.page_size * self.bytes_per_token

    @property
    def nbytes(self) -> int:
        return self.num_pages * self.bytes_per_page

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    def pages_for(self, num_tokens: NonNegativeInt) -> int:
        return cdiv(num_tokens, self.page_size)

    def with_tp(self, tp: PositiveInt) -> KVCacheLayout:
        return KVCacheLayout(
            self.num_pages, self.page_size, self.num_kv_heads, self.head_dim, self.dtype, tp, self._resolved_hd64
        )

    # -- where a head lives ---------------------------------------------------------------------

    def slots(self, head: int, kind: str) -> list[tuple[int, int]]:
        """(combined row, first lane) of every cache copy of model head `head`'s K or V.

        The combined row indexes the cache's axes 2 and 3 flattened (row // packing, row % packing).
        """
        if kind not in ("k", "v"):
            raise InvalidArgumentError(
                "kind is 'k' or 'v'",
                argument="kind",
                expected="'k' or 'v'",
                found=repr(kind),
                fix="pass kind='k' or kind='v'",
            )
        if not 0 <= head < self.num_kv_heads:
            raise InvalidArgumentError(
                "head out of range",
                argument="head",
                expected=f"0 <= head < {self.num_kv_heads}",
                found=head,
                fix=f"pass a model KV head index from 0 to {self.num_kv_heads - 1} (num_kv_heads={self.num_kv_heads})",
            )
        out = []
        for r in range(self.replication):
            cache_head = head * self.replication + r
            shard, local = divmod(cache_head, self.heads_per_shard)
            base = shard * self.rows_per_shard
            if self._resolved_hd64:
                out.append((base + local, 0 if kind == "k" else self.head_dim))
            else:
                out.append((base + 2 * local + (0 if kind == "k" else 1), 0))
        return out

    # -- arrays (need jax) ----------------------------------------------------------------------

    def check_cache(self, kv_cache: Array, *, argument: str = "kv_cache") -> None:
        """Raise a typed error unless `kv_cache` has exactly this layout's shape and dtype."""
        shape = tuple(getattr(kv_cache, "shape", ()))
        found_dtype = dtype_name(getattr(kv_cache, "dtype", "?")) if hasattr(kv_cache, "dtype") else "?"
        if shape != self.shape:
            raise InvalidArgumentError(
                "the KV cache does not have the layout the installed RPA kernel expects",
                argument=argument,
                expected=f"shape {self.shape} ({self.describe()})",
                found=f"shape {shape}",
                fix="allocate it with maxtext_compat.paged.KVCacheLayout(...).allocate(...)",
            )
        if found_dtype != self.dtype:
            raise InvalidArgumentError(
                "the KV cache dtype differs from the layout's (the kernel needs cache, k and v in one dtype)",
                argument=argument,
                expected=self.dtype,
                found=found_dtype,
                fix=f"allocate the cache in {self.dtype} or cast k/v to the cache dtype",
            )

    def sharding(self, mesh: Mesh) -> Any:
        """NamedSharding that puts the combined-head axis on the mesh's model axis."""
        from maxtext_compat.paged.sharding import head_parallelism, kv_cache_sharding

        if head_parallelism(mesh) != self.tp:
            raise InvalidArgumentError(
                "the mesh's model-axis size differs from the layout's tp",
                argument="mesh",
                expected=f"model axis of size {self.tp}",
                found=f"mesh {dict(mesh.shape)}",
                fix="use layout.with_tp(<model axis size>) or a mesh from maxtext_compat.paged.make_mesh(tp)",
            )
        return kv_cache_sharding(mesh)

    def allocate(self, num_layers: PositiveInt = 1, *, mesh: Mesh | None = None) -> list[Any]:
        """Zeroed caches, one per layer; sharded on `mesh` when given (as tpu-inference allocates)."""
        import jax
        import jax.numpy as jnp

        if mesh is None:
            return [jnp.zeros(self.shape, self.dtype) for _ in range(num_layers)]
        make = jax.jit(lambda: jnp.zeros(self.shape, self.dtype), out_shardings=self.sharding(mesh))
        return [make() for _ in range(num_layers)]

    def describe(self) -> str:
        rep = f", KV heads repeated x{self.replication} for tp={self.tp}" if self.replication > 1 else ""
        return (
            f"{self.kernel} layout: {self.num_pages} pages x {self.page_size} tokens, {self.num_kv_heads} KV heads"
            f" x head_dim {self.head_dim} -> {self.lanes} lanes, {self.dtype} (packing {self.packing}), "
            f"tp={self.tp}{rep}"
        )


@checked
def layout_for(
    *,
    kv_cache_shape: tuple[int, ...],
    kv_cache_dtype: DType,
    num_kv_heads: PositiveInt,
    head_dim: PositiveInt,
    tp: PositiveInt,
    hd64_kernel: bool = True,
) -> KVCacheLayout:
    """The layout the kernel will check a given cache against (pages and page size from the array)."""
    if len(kv_cache_shape) != 5:
        raise InvalidArgumentError(
            "the KV cache must be 5-D [pages, page_size, combined heads, packing, lanes]",
            argument="kv_cache",
            expected="a 5-D shape",
            found=f"shape {tuple(kv_cache_shape)}",
            fix="allocate it with maxtext_compat.paged.KVCacheLayout(...).allocate(...)",
        )
    return KVCacheLayout(
        num_pages=int(kv_cache_shape[0]),
        page_size=int(kv_cache_shape[1]),
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype_name(kv_cache_dtype),
        tp=tp,
        hd64=(head_dim == HD64) and hd64_kernel,
    )
