"""cuDNN's fused (flash) attention on NVIDIA GPUs, for every model family.

`jax.nn.dot_product_attention(..., implementation="cudnn")` runs cuDNN's fused attention: no
`[q, k]` logits or probabilities in memory, the output and a float32 log-sum-exp `[b, heads,
q]` kept for the backward pass. A config's `attention_implementation` chooses
(`fused_implementation`, asked by each family's attention when the Pallas TPU kernel does not
run):

* None (automatic): cuDNN when programs are built for a GPU (`cairn.partitioning.platform.
  backend() == "gpu"`) and `unsupported_reason` is None; otherwise the family's XLA attention.
  A refusal on a GPU is logged once per distinct reason;
* "cudnn": cuDNN always; a call it cannot take (or any call off a GPU) is a `ValueError`
  naming why;
* "xla", "pallas": never cuDNN.

The choice is made at trace time from shapes and dtypes alone, so it needs no GPU: the
restrictions of the installed JAX's `jax._src.cudnn.fused_attention_stablehlo` (`check_layout`,
`check_is_flash_attention`, the custom partitioning's spec checks) are encoded in
`unsupported_reason`. Decode-mode (cached) steps keep XLA's path, as on TPU: a step's queries
are a few tokens against the whole cache, nothing a flash kernel saves, and their per-step
mask would be one more bias read.

`attention` makes the call: the mask (packed segments, padding, a prefix LM's block) becomes
an additive bias of cuDNN's large negative as `jax.nn` would make it, added to a position bias
(T5's, `[1|b, heads, q, k]`); causal masking is cuDNN's own (`is_causal`, nothing
materialised); grouped-query keys and values `[b, kv_len, kv_heads, d]` go in as they are
(cuDNN groups the heads itself). Its `implementation` argument is passed through to
`jax.nn.dot_product_attention`: with "xla" the same call runs anywhere with the same
semantics (the tests compare it with each family's own attention on CPU).

Remat: the kernel's residuals that are not its inputs (its output and log-sum-exp) are named
`layers.ATTENTION_KERNEL`, as the splash kernel names its own, so the "attention_kernel",
"minimal" and "dots" policies keep them and the backward pass does not run the forward kernel
again; the inputs (queries, keys, values, bias) are recomputed from the projections.

Sharding: no `jax.shard_map` is needed. The cuDNN call is a `custom_partitioning` primitive
(`_dot_product_attention_fwd_partition` / `_bwd_partition`, with Shardy rules) that partitions
itself over the batch and head dimensions: it requires queries, keys and values sharded alike,
no sharding of the sequence or `head_dim` dimensions, and a bias sharded like the query on
batch and heads (or not at all) and unsharded on its sequence dimensions; otherwise it raises
when compiled. `attention` constrains its operands so (`batch`, `heads` logical axes), and
`unsupported_reason` refuses, under an active `cairn.partitioning` partitioner, a call whose
keys and values would shard unlike its queries (grouped-query heads that do not divide the
`model` axis) or whose sequence or `head_dim` would be sharded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from cairn.models.layers import ATTENTION_KERNEL, constrain
from cairn.partitioning import platform
from cairn.partitioning.partitioner import current_partitioner
from cairn.partitioning.rules import logical_to_mesh_spec

KERNEL = "cudnn"  # what `fused_implementation` answers when cuDNN runs (jax's implementation)
DTYPES = ("bfloat16", "float16")  # cuDNN's flash attention (fp8 aside): Q, K and V alike
HEAD_DIM_MULTIPLE = 8
MAX_HEAD_DIM = 128  # before Hopper (compute capability 9.0); 256 from Hopper on
MAX_HEAD_DIM_HOPPER = 256
MIN_COMPUTE_CAPABILITY = (8, 0)  # cuDNN's fused attention needs an Ampere or newer GPU
# The logical axes of queries, keys, values `[b, l, heads, head_dim]` and of the bias.
HEAD_AXES = ("batch", "length", "heads", "kv")
BIAS_AXES = ("batch", "heads", None, None)

__all__ = [
    "BIAS_AXES",
    "DTYPES",
    "HEAD_AXES",
    "HEAD_DIM_MULTIPLE",
    "KERNEL",
    "MAX_HEAD_DIM",
    "MAX_HEAD_DIM_HOPPER",
    "MIN_COMPUTE_CAPABILITY",
    "attention",
    "fused_implementation",
    "mask_value",
    "max_head_dim",
    "unsupported_reason",
]

logger = logging.getLogger(__name__)
_logged: set[str] = set()
_logged_lock = threading.Lock()


def _local_gpu():
    """This process's first GPU device when its default backend is a GPU, else None (a
    `compile_target("gpu")` on a host without one: nothing to ask)."""
    if jax.default_backend() != "gpu":
        return None
    return jax.local_devices(backend="gpu")[0]


def _compute_capability(device) -> tuple[int, ...] | None:
    value = getattr(device, "compute_capability", None)
    return None if value is None else tuple(int(x) for x in str(value).split("."))


def max_head_dim() -> int:
    """The largest `head_dim` cuDNN takes here: 256 on a Hopper (or newer) GPU of this process,
    else 128 (also when compiling for a GPU this host does not have)."""
    cc = _compute_capability(_local_gpu())
    return MAX_HEAD_DIM_HOPPER if cc is not None and cc >= (9, 0) else MAX_HEAD_DIM


def _device_reason() -> str | None:
    """Why this process's GPU cannot run cuDNN's attention, or None (also when there is none)."""
    device = _local_gpu()
    if device is None:
        return None
    if "cuda" not in getattr(getattr(device, "client", None), "platform_version", "cuda"):
        return "the GPU is not an NVIDIA (CUDA) GPU: cuDNN runs on NVIDIA GPUs only"
    cc = _compute_capability(device)
    if cc is not None and cc < MIN_COMPUTE_CAPABILITY:
        need = ".".join(map(str, MIN_COMPUTE_CAPABILITY))
        return f"the GPU's compute capability {'.'.join(map(str, cc))} is below {need} (Ampere)"
    return None


def _mesh_reason(q_shape: Sequence[int], kv_shape: Sequence[int]) -> str | None:
    """Why cuDNN's own partitioning cannot take these operands under the active partitioner."""
    partitioner = current_partitioner()
    if partitioner is None or partitioner.mesh.size == 1:
        return None

    def spec(shape):
        s = logical_to_mesh_spec(HEAD_AXES, partitioner.rules, partitioner.mesh.shape, shape, "<attention>", "quiet")
        return tuple(s) + (None,) * (4 - len(s))

    qs, ks = spec(q_shape), spec(kv_shape)
    if any(s[1] is not None or s[3] is not None for s in (qs, ks)):
        return "the mesh shards the sequence or head_dim (cuDNN partitions over batch and heads only)"
    if qs != ks:
        return (
            f"queries {qs} and keys/values {ks} shard differently under the mesh "
            "(cuDNN's partitioning needs them alike: key/value heads that do not divide the heads' mesh axes)"
        )
    return None


def unsupported_reason(
    q_shape: Sequence[int],
    kv_shape: Sequence[int],
    dtype,
    bias_shape: Sequence[int] | None = None,
) -> str | None:
    """Why cuDNN's fused attention cannot take this call, or None when it can.

    `q_shape` `[b, q_len, heads, head_dim]`, `kv_shape` `[b, kv_len, kv_heads, head_dim]`,
    `dtype` the queries', keys' and values' dtype, `bias_shape` the additive bias's (a mask
    counts as one: cuDNN takes it as a bias), or None. Checked: programs built for a GPU
    (an NVIDIA one, Ampere or newer, when this process has it), bfloat16/float16, `head_dim`
    a multiple of 8 and at most `max_head_dim()`, `heads` a multiple of `kv_heads`, a bias
    `[1|b, 1|heads, q_len, kv_len]` and then even lengths (cuDNN's backward with a bias; taken
    for every call, since whether it will be differentiated is not known here), and the
    active mesh's shardings (`_mesh_reason`).
    """
    backend = platform.backend()
    if backend != "gpu":
        return f"programs are built for {backend}, not a GPU (cuDNN runs on NVIDIA GPUs only)"
    why = _device_reason()
    if why is not None:
        return why
    name = jnp.dtype(dtype).name
    if name not in DTYPES:
        return f"dtype {name} is not bfloat16 or float16"
    b, q_len, heads, head_dim = q_shape
    kv_len, kv_heads = kv_shape[1], kv_shape[2]
    limit = max_head_dim()
    if head_dim % HEAD_DIM_MULTIPLE or head_dim > limit:
        return f"head_dim {head_dim} must be a multiple of {HEAD_DIM_MULTIPLE} and at most {limit}"
    if heads % kv_heads:
        return f"query heads {heads} are not a multiple of key/value heads {kv_heads}"
    if bias_shape is not None:
        bb, bh, bq, bk = bias_shape
        if bb not in (1, b) or bh not in (1, heads) or (bq, bk) != (q_len, kv_len):
            return f"bias shape {tuple(bias_shape)} is not [1|{b}, 1|{heads}, {q_len}, {kv_len}]"
        if q_len % 2 or kv_len % 2:
            return f"with a bias or mask, sequence lengths (query {q_len}, key {kv_len}) must be even"
    return _mesh_reason(q_shape, kv_shape)


def _log_refusal(why: str) -> None:
    """Logs (once per distinct reason) that an automatic choice fell back to XLA."""
    with _logged_lock:
        if why in _logged:
            return
        _logged.add(why)
    logger.warning("cuDNN attention not used (XLA's instead): %s", why)


def fused_implementation(
    implementation: str | None,
    q_shape: Sequence[int],
    kv_shape: Sequence[int],
    dtype,
    bias_shape: Sequence[int] | None = None,
    unsupported: str | None = None,
) -> str | None:
    """What `attention` is called with for this call, `KERNEL` ("cudnn"), or None when the
    family's XLA attention runs. `implementation` is the config's: "cudnn" always (a
    `ValueError` naming why when `unsupported_reason`, or the caller's own `unsupported`
    reason, rules it out); None on a GPU when supported (a refusal logged once per reason);
    "xla", "pallas" never."""
    if implementation not in (None, KERNEL):
        return None
    if implementation is None and platform.backend() != "gpu":
        return None
    why = unsupported or unsupported_reason(q_shape, kv_shape, dtype, bias_shape)
    if why is None:
        return KERNEL
    if implementation == KERNEL:
        raise ValueError(f"attention_implementation='cudnn' cannot run this attention: {why}")
    _log_refusal(why)
    return None


def mask_value(dtype) -> float:
    """The additive bias of a masked position, as `jax.nn`'s cuDNN path makes it from a boolean
    mask: not the dtype's lowest (cuDNN misbehaves subtracting two such), -2**41 in bfloat16,
    -2**15 in float16; -1e10 (T5's `NEG_INF`) otherwise."""
    name = jnp.dtype(dtype).name
    return {"bfloat16": -(2.0**41), "float16": -(2.0**15)}.get(name, -1e10)


def _named_residuals(fn):
    """`fn(*args)`, with the residuals its backward pass reads named `ATTENTION_KERNEL` unless
    they are its arguments (those are recomputed by a remat policy that does not save them)."""

    @jax.custom_vjp
    def run(*args):
        return fn(*args)

    def fwd(*args):
        out, pullback = jax.vjp(fn, *args)

        def name(r):
            return r if any(r is a for a in args) else checkpoint_name(r, ATTENTION_KERNEL)

        return out, jax.tree.map(name, pullback)

    def bwd(pullback, g):
        return pullback(g)

    run.defvjp(fwd, bwd)
    return run


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    bias: jax.Array | None = None,
    mask: jax.Array | None = None,
    *,
    is_causal: bool = False,
    scale: float = 1.0,
    implementation: str = KERNEL,
) -> jax.Array:
    """`softmax(scale * q . k + bias + mask) v` by `jax.nn.dot_product_attention(implementation)`.

    `q` `[b, q_len, heads, d]`, `k`, `v` `[b, kv_len, kv_heads, d]` (`heads` a multiple of
    `kv_heads`); `bias` `[1|b, 1|heads, q_len, kv_len]` or None (differentiable); `mask`
    `[1|b, 1, q_len, kv_len]` bool (True = attend) or None, added to the bias as `mask_value`;
    `is_causal`: key position <= query position (cuDNN's own mask). The bias is cast to `q`'s
    dtype. Returns `[b, q_len, heads, d]`.
    """
    if mask is not None:
        masked = jnp.where(mask, 0.0, mask_value(q.dtype)).astype(q.dtype)
        bias = masked if bias is None else bias.astype(q.dtype) + masked
    q, k, v = (constrain(x, HEAD_AXES) for x in (q, k, v))
    args = [q, k, v]
    if bias is not None:
        args.append(constrain(bias.astype(q.dtype), BIAS_AXES))

    def call(q, k, v, *bias):
        return jax.nn.dot_product_attention(
            q, k, v, *bias, scale=scale, is_causal=is_causal, implementation=implementation
        )

    out = _named_residuals(call)(*args)
    return constrain(out, HEAD_AXES)
