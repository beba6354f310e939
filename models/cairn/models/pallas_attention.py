"""Pallas TPU attention kernels behind one dispatcher, for every model family.

`attention_implementation` (a field of every family's config):

* None (automatic): the Pallas kernel when running on TPU and the call is one the kernel
  supports (`unsupported_reason` is None), XLA's einsum attention otherwise;
* "xla": XLA's einsum attention;
* "pallas": the kernel, on TPU compiled by Mosaic, elsewhere run by Pallas's interpreter
  (slow: for tests); a call it does not support is a `ValueError` naming why;
* "cudnn": never the kernel (cuDNN's fused attention on GPU: `cairn.models.gpu_attention`,
  which the families ask when the kernel does not run; with None it runs on GPU).

Decode-mode (cached) steps always take the XLA path. Two kernels of
`jax.experimental.pallas.ops.tpu` are used:

* `splash_attention` (Llama): JAX's splash attention (a static causal or full mask, packed
  segment ids, grouped-query heads natively; `q` pre-scaled), vmapped over the batch;
* `flash_attention` (the T5 families): JAX's flash attention with an additive bias `ab`
  (T5's relative position bias, a prefix LM's mask), segment ids and causal masking. The bias
  may be shared by the batch (`[1, heads, q, k]`): the kernel is vmapped over the batch with
  the bias unbatched, so it is never broadcast to the batch; its gradient is summed over it.

Both take the models' token-major layout (`q` `[b, q_len, heads, head_dim]`, `k`, `v`
`[b, kv_len, kv_heads, head_dim]`) and return `[b, q_len, heads, head_dim]`. The logits,
softmax and accumulation are float32 inside the kernels.

Block sizes (`BLOCK_Q`, `BLOCK_KV`, `BLOCK_Q_BWD`, `BLOCK_KV_BWD`) are read when a function is
traced: each is the preferred size, and a length takes its largest divisor that is a multiple
of `MIN_BLOCK` (128) and at most the preferred size. Lengths must be multiples of `MIN_BLOCK`.

Under a multi-device mesh (a `cairn.partitioning` partitioner active while tracing) the
kernel runs under `jax.shard_map` over the mesh axes of the `batch` and `heads` logical axes
(heads only when the key/value heads split the same way), since a `pallas_call` is not
partitioned automatically; other dimensions are gathered.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from cairn.models.layers import ATTENTION_KERNEL
from cairn.partitioning import platform
from cairn.partitioning.partitioner import current_partitioner
from cairn.partitioning.rules import logical_to_mesh_spec

IMPLEMENTATIONS = (None, "xla", "pallas", "cudnn")
MIN_BLOCK = 128  # the kernels' lane width: lengths and blocks are multiples of it
BLOCK_Q = 512  # preferred query block (forward)
BLOCK_KV = 512  # preferred key/value block (forward; splash computes it in one step)
BLOCK_Q_BWD = 512  # preferred query block of the backward kernels
BLOCK_KV_BWD = 512  # preferred key/value block of the backward kernels
MAX_SMALL_HEAD_DIM = 128  # head_dim up to this, or any multiple of 128 above it
SPLASH_FUSED_BWD = True  # splash's fused dq/dkv backward kernel (the faster on a v5e chip)
# The automatic choice takes the flash kernel (an additive bias: the T5 families) only from this
# length up. On a TPU v5e chip, T5.1.1-large's shapes (16 heads x 64, 512 tokens, a float32
# bias [1, h, 512, 512]) ran forward + backward in 2.26 ms per layer through XLA and 2.75 ms
# through the kernel (best blocks, batch 8; 7.4 vs 10.8 ms at batch 32): reading the bias and
# writing its gradient cost more than the logits the kernel keeps out of memory.
FLASH_AUTO_MIN_LENGTH = 1024

__all__ = [
    "BLOCK_KV",
    "BLOCK_KV_BWD",
    "BLOCK_Q",
    "BLOCK_Q_BWD",
    "FLASH_AUTO_MIN_LENGTH",
    "IMPLEMENTATIONS",
    "MIN_BLOCK",
    "SPLASH_FUSED_BWD",
    "block_size",
    "block_sizes",
    "flash_attention",
    "on_tpu",
    "splash_attention",
    "unsupported_reason",
    "use_kernel",
    "validate_implementation",
]


def on_tpu() -> bool:
    """Whether programs are built for a TPU (where the kernels compile): `platform.backend()`."""
    return platform.backend() == "tpu"


def validate_implementation(value: str | None, what: str, extra: tuple[str, ...] = ()) -> None:
    """A `ValueError` naming `what` unless `value` is in `IMPLEMENTATIONS` (or `extra`)."""
    allowed = IMPLEMENTATIONS + tuple(extra)
    if value not in allowed:
        raise ValueError(f"{what} must be one of {allowed}, got {value!r}")


def block_size(length: int, preferred: int) -> int:
    """The largest multiple of `MIN_BLOCK` dividing `length` and at most `preferred`
    (`MIN_BLOCK` when `preferred` is smaller); `length` must be a multiple of `MIN_BLOCK`."""
    if length % MIN_BLOCK:
        raise ValueError(f"length {length} is not a multiple of {MIN_BLOCK}")
    best = MIN_BLOCK
    for size in range(MIN_BLOCK, min(length, preferred) + 1, MIN_BLOCK):
        if length % size == 0:
            best = size
    return best


def unsupported_reason(q_len: int, kv_len: int, head_dim: int) -> str | None:
    """Why the kernels cannot take these shapes, or None when they can."""
    if q_len % MIN_BLOCK or kv_len % MIN_BLOCK:
        return f"sequence lengths (query {q_len}, key {kv_len}) must be multiples of {MIN_BLOCK}"
    if head_dim > MAX_SMALL_HEAD_DIM and head_dim % MIN_BLOCK:
        return f"head_dim {head_dim} must be at most {MAX_SMALL_HEAD_DIM} or a multiple of {MIN_BLOCK}"
    return None


def use_kernel(
    implementation: str | None,
    q_len: int,
    kv_len: int,
    head_dim: int,
    unsupported: str | None = None,
    auto_min_length: int = 0,
) -> bool:
    """Whether an attention call takes the Pallas kernel: "pallas" always (a `ValueError` naming
    why when the shapes, or the caller's own `unsupported` reason, rule it out); None only on
    TPU, when supported and when the longer length is at least `auto_min_length` (where the
    kernel was measured to beat XLA); anything else ("xla", "cudnn") never."""
    if implementation not in (None, "pallas"):
        return False
    why = unsupported or unsupported_reason(q_len, kv_len, head_dim)
    if implementation == "pallas":
        if why is not None:
            raise ValueError(f"attention_implementation='pallas' cannot run this attention: {why}")
        return True
    return why is None and on_tpu() and max(q_len, kv_len) >= auto_min_length


# -- interpreter (CPU) -------------------------------------------------------------------


def _interpret_mode():
    """Every `pallas_call` traced inside runs in Pallas's (generic) interpreter."""
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.force_tpu_interpret_mode(True)


def _interpreted(fn: Callable) -> Callable:
    """`fn` (built on kernels whose own VJPs trace more `pallas_call`s) with its forward and
    backward both traced under `_interpret_mode`: a plain context around the call would be
    gone by the time the backward is traced."""

    @jax.custom_vjp
    def run(*args):
        with _interpret_mode():
            return fn(*args)

    def fwd(*args):
        with _interpret_mode():
            return jax.vjp(fn, *args)

    def bwd(pullback, g):
        with _interpret_mode():
            return pullback(g)

    run.defvjp(fwd, bwd)
    return run


# -- sharding ----------------------------------------------------------------------------


def _mesh_axes(q_shape, k_shape):
    """`(mesh, batch_axes, heads_axes)` for head-major `[b, h, l, d]` operands under the
    active `cairn.partitioning` partitioner, or None (no partitioner, one device, nothing
    sharded)."""
    partitioner = current_partitioner()
    if partitioner is None or partitioner.mesh.size == 1:
        return None
    names = ("batch", "heads", None, None)

    def spec(shape):
        s = logical_to_mesh_spec(names, partitioner.rules, partitioner.mesh.shape, shape, "<attention>", "quiet")
        return tuple(s) + (None,) * (4 - len(s))

    qs, ks = spec(q_shape), spec(k_shape)
    batch = qs[0] if qs[0] == ks[0] else None
    heads = qs[1] if qs[1] == ks[1] else None
    if batch is None and heads is None:
        return None
    return partitioner.mesh, batch, heads


def _sharded(local: Callable, args: list, specs: list, out_spec, axes) -> jax.Array:
    """`local(*args)` under `jax.shard_map` (when `axes` is not None)."""
    if axes is None:
        return local(*args)
    mesh = axes[0]
    return jax.shard_map(local, mesh=mesh, in_specs=tuple(specs), out_specs=out_spec, check_vma=False)(*args)


def _head_major(*xs):
    return [None if x is None else jnp.swapaxes(x, 1, 2) for x in xs]


def _scaled(q, scale: float):
    return q if scale == 1.0 else (q.astype(jnp.float32) * scale).astype(q.dtype)


# -- splash attention (Llama) ------------------------------------------------------------


def _splash_kernel(num_heads: int, q_len: int, kv_len: int, causal: bool, interpret: bool):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    one = sm.CausalMask((q_len, kv_len)) if causal else sm.FullMask((q_len, kv_len))
    bq, bkv = block_size(q_len, BLOCK_Q), block_size(kv_len, BLOCK_KV)
    bq_bwd, bkv_bwd = block_size(q_len, BLOCK_Q_BWD), block_size(kv_len, BLOCK_KV_BWD)
    fused = SPLASH_FUSED_BWD
    blocks = sk.BlockSizes(
        block_q=bq,
        block_kv=bkv,
        block_kv_compute=bkv,
        block_q_dkv=bq_bwd,
        block_kv_dkv=bkv_bwd,
        block_kv_dkv_compute=bkv_bwd,
        block_q_dq=None if fused else bq_bwd,
        block_kv_dq=None if fused else bkv_bwd,
        use_fused_bwd_kernel=fused,
    )
    return sk.make_splash_mha(
        sm.MultiHeadMask([one] * num_heads),
        block_sizes=blocks,
        head_shards=1,
        q_seq_shards=1,
        residual_checkpoint_name=ATTENTION_KERNEL,  # a remat policy may keep them (`layers.remat_policy`)
        interpret=interpret,
    )


def splash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array | None = None,
    *,
    causal: bool = True,
    scale: float = 1.0,
    interpret: bool | None = None,
) -> jax.Array:
    """`softmax(scale * q . k + mask) v` by JAX's splash attention kernel.

    `q` `[b, l, heads, d]`, `k`, `v` `[b, l, kv_heads, d]` (`heads` a multiple of `kv_heads`:
    grouped-query heads are not repeated); `segment_ids` `[b, l]`: queries attend only keys of
    the same id (a padding id 0 attends the padding: its rows are not used); `causal` or full.
    `interpret` (default: off the TPU) runs Pallas's interpreter. Returns `[b, l, heads, d]`.
    """
    if interpret is None:
        interpret = not on_tpu()
    qh, kh, vh = _head_major(_scaled(q, scale), k, v)
    axes = _mesh_axes(qh.shape, kh.shape)
    bx, hx = (None, None) if axes is None else axes[1:]
    head_spec = P(bx, hx, None, None)

    def local(qh, kh, vh, *seg):
        kernel = _splash_kernel(qh.shape[1], qh.shape[2], kh.shape[2], causal, interpret)
        if not seg:
            return jax.vmap(lambda a, b, c: kernel(a, b, c))(qh, kh, vh)
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

        return jax.vmap(lambda a, b, c, s: kernel(a, b, c, sk.SegmentIds(s, s)))(qh, kh, vh, seg[0])

    args, specs = [qh, kh, vh], [head_spec] * 3
    if segment_ids is not None:
        args.append(segment_ids.astype(jnp.int32))
        specs.append(P(bx, None))
    out = _sharded(local, args, specs, head_spec, axes)
    return jnp.swapaxes(out, 1, 2)


# -- flash attention (T5 families) -------------------------------------------------------


def _flash_blocks(q_len: int, kv_len: int):
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    bq, bkv = block_size(q_len, BLOCK_Q), block_size(kv_len, BLOCK_KV)
    bq_bwd, bkv_bwd = block_size(q_len, BLOCK_Q_BWD), block_size(kv_len, BLOCK_KV_BWD)
    return fa.BlockSizes(
        block_q=bq,
        block_k_major=bkv,
        block_k=bkv,
        block_b=1,
        block_q_major_dkv=bq_bwd,
        block_k_major_dkv=bkv_bwd,
        block_k_dkv=bkv_bwd,
        block_q_dkv=bq_bwd,
        block_k_major_dq=bkv_bwd,
        block_k_dq=bkv_bwd,
        block_q_dq=bq_bwd,
    )


def flash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    bias: jax.Array | None = None,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    *,
    causal: bool = False,
    scale: float = 1.0,
    interpret: bool | None = None,
) -> jax.Array:
    """`softmax(scale * q . k + bias + mask) v` by JAX's flash attention kernel.

    `q` `[b, q_len, heads, d]`, `k`, `v` `[b, kv_len, heads, d]`; `bias` `[b|1, heads, q_len,
    kv_len]` or None (differentiable; a batch of 1 is shared, never broadcast); segment ids
    `[b, q_len]` / `[b, kv_len]` (both or neither): a query attends keys of its own id;
    `causal`: key position <= query position. `interpret` (default: off the TPU) runs Pallas's
    interpreter. Returns `[b, q_len, heads, d]`.
    """
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    if interpret is None:
        interpret = not on_tpu()
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("flash_attention: give both q_segment_ids and kv_segment_ids, or neither")
    if k.shape[2] != q.shape[2]:
        raise ValueError(
            f"flash_attention: needs as many key/value heads as query heads, got {k.shape[2]} and {q.shape[2]}"
        )
    qh, kh, vh = _head_major(_scaled(q, scale), k, v)
    shared_bias = bias is not None and bias.shape[0] == 1
    axes = _mesh_axes(qh.shape, kh.shape)
    bx, hx = (None, None) if axes is None else axes[1:]
    head_spec = P(bx, hx, None, None)
    blocks = _flash_blocks(qh.shape[2], kh.shape[2])
    has_bias, has_segments = bias is not None, q_segment_ids is not None

    def local(qh, kh, vh, *rest):
        rest = list(rest)
        ab = rest.pop(0) if has_bias else None
        qs, ks = (rest[0], rest[1]) if has_segments else (None, None)

        def one(q1, k1, v1, ab1, qs1, ks1):
            seg = None if qs1 is None else fa.SegmentIds(qs1[None], ks1[None])
            ab1 = None if ab1 is None else ab1[None]
            out = fa.flash_attention(
                q1[None], k1[None], v1[None], ab1, seg, causal=causal, sm_scale=1.0, block_sizes=blocks
            )
            return out[0]

        if ab is not None and shared_bias:
            ab = ab[0]
        in_axes = (0, 0, 0, None if shared_bias else 0, 0, 0)
        fn = jax.vmap(one, in_axes=in_axes)
        if interpret:
            fn = _interpreted(fn)
        return fn(qh, kh, vh, ab, qs, ks)

    args, specs = [qh, kh, vh], [head_spec] * 3
    if has_bias:
        args.append(bias)
        specs.append(P(None if shared_bias else bx, hx, None, None))
    if q_segment_ids is not None and kv_segment_ids is not None:
        args += [q_segment_ids.astype(jnp.int32), kv_segment_ids.astype(jnp.int32)]
        specs += [P(bx, None), P(bx, None)]
    out = _sharded(local, args, specs, head_spec, axes)
    return jnp.swapaxes(out, 1, 2)


@contextlib.contextmanager
def block_sizes(**sizes: int):
    """Temporarily sets the module's block-size constants (`q`, `kv`, `q_bwd`, `kv_bwd`), for
    trying sizes on a chip: `with block_sizes(q=1024, kv=512): jax.jit(step).lower(...)`."""
    names = {"q": "BLOCK_Q", "kv": "BLOCK_KV", "q_bwd": "BLOCK_Q_BWD", "kv_bwd": "BLOCK_KV_BWD"}
    unknown = set(sizes) - set(names)
    if unknown:
        raise ValueError(f"block_sizes: unknown {sorted(unknown)}; known {sorted(names)}")
    for key, value in sizes.items():
        if not isinstance(value, int) or value < MIN_BLOCK or value % MIN_BLOCK:
            raise ValueError(f"block_sizes: {key} must be a positive multiple of {MIN_BLOCK}, got {value!r}")
    module = globals()
    saved = {names[k]: module[names[k]] for k in sizes}
    module.update({names[k]: v for k, v in sizes.items()})
    try:
        yield
    finally:
        module.update(saved)
