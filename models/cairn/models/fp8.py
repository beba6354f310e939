"""FP8 matmuls with delayed per-tensor scaling (`ModelConfig.matmul_precision="fp8"`).

A quantized projection multiplies its input and kernel as float8_e4m3fn and, in the backward
pass, the output gradient as float8_e5m2 (the wider range gradients need), each tensor divided by
one float32 scale of its own; the products accumulate in float32 and are multiplied back by the
two scales, then cast to the compute dtype. On Hopper GPUs XLA lowers these fp8 `dot_general`s to
fp8 GEMMs (cuBLASLt); elsewhere (CPU, TPU v5e) they are emulated (same numerics, no speed-up).

Delayed scaling (Transformer Engine's recipe, as Flax's `fp8_ops` and MaxText's
`quantization=fp8`): a tensor's scale is `amax / fp8_max`, `amax` the largest absolute value
it had over the last `AMAX_HISTORY_LENGTH` steps (its history, not this step's value: the scale
is known before the tensor is), then this step's amax enters the history. A history with
nothing in it yet (the first step) scales by the tensor's own amax (current scaling), and so does
a matmul called without its state (decoding, evaluation from params alone).

The state: one variable per quantized kernel in the `FP8_STATE` collection, beside the kernel
parameter of the same name: `amax_history` `[3, AMAX_HISTORY_LENGTH]` float32, rows input,
kernel, output gradient, newest first (the scale is derived from it, not stored). Its gradient,
through `fp8_dense`'s custom VJP, is its next value (Flax's "overwrite with gradient"): a train
step differentiates the loss with respect to it and replaces it with that gradient, never giving
it to the optimizer (`cairn.trainer`'s `TrainState.model_state`).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

FP8_STATE = "fp8_state"
AMAX_HISTORY_LENGTH = 1024  # Flax's and MaxText's default
E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2
INPUT, KERNEL, OUTPUT_GRAD = 0, 1, 2  # the rows of an amax history


@flax.struct.dataclass
class Fp8Kernel:
    """A kernel `w` (in the compute dtype) that `dense` multiplies in fp8 (`fp8_dense`), with its
    `amax_history` `[3, AMAX_HISTORY_LENGTH]` (None: current scaling, no state). Anything that
    reads it as an array gets `w`."""

    w: jnp.ndarray
    amax_history: jnp.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.w.shape)

    @property
    def dtype(self):
        return self.w.dtype

    def reshape(self, *shape: int) -> Fp8Kernel:
        """The kernel reshaped (a per-tensor scale does not depend on the shape)."""
        return Fp8Kernel(self.w.reshape(*shape), self.amax_history)

    def __jax_array__(self) -> jnp.ndarray:
        return self.w


def initial_amax_history() -> jnp.ndarray:
    """A state before any step: an empty history (zeros; the first step scales currently)."""
    return jnp.zeros((3, AMAX_HISTORY_LENGTH), jnp.float32)


def fp8_kernel(module: nn.Module, name: str, w: jnp.ndarray) -> Fp8Kernel:
    """`w` as an `Fp8Kernel` with the module's `FP8_STATE` variable `name`: declared (an empty
    history) when the module is initialized, read when the collection is given, else None."""
    if module.is_initializing():
        return Fp8Kernel(w, module.variable(FP8_STATE, name, initial_amax_history).value)
    if module.has_variable(FP8_STATE, name):
        return Fp8Kernel(w, module.get_variable(FP8_STATE, name))
    return Fp8Kernel(w, None)


def _scale(x: jnp.ndarray, history: jnp.ndarray | None, dtype) -> tuple[jnp.ndarray, jnp.ndarray]:
    """`(scale, amax of x)`: the scale from the history's largest amax (from x's own amax when the
    history is empty or absent), 1 where that is 0 or not finite."""
    amax = jnp.max(jnp.abs(x)).astype(jnp.float32)
    known = amax if history is None else jnp.max(history)
    known = jnp.where(known > 0, known, amax)
    ok = (known > 0) & jnp.isfinite(known)
    return jnp.where(ok, known / float(jnp.finfo(dtype).max), 1.0), amax


def _quantize(x: jnp.ndarray, scale: jnp.ndarray, dtype) -> jnp.ndarray:
    """`x / scale` clipped to the fp8 range and cast to `dtype` (float32 arithmetic)."""
    top = float(jnp.finfo(dtype).max)
    return jnp.clip(x.astype(jnp.float32) / scale, -top, top).astype(dtype)


def _pushed(history: jnp.ndarray, amax: jnp.ndarray) -> jnp.ndarray:
    """The history with `amax` (0 when not finite) in front and its oldest entry dropped."""
    amax = jnp.where(jnp.isfinite(amax), amax, 0.0)
    return jnp.concatenate([amax[None], history[:-1]])


def _dot(a, b, a_axes, b_axes):
    """`a` and `b` contracted over the given axes, accumulated in float32."""
    return jax.lax.dot_general(a, b, ((tuple(a_axes), tuple(b_axes)), ((), ())), preferred_element_type=jnp.float32)


def fp8_dense(x: jnp.ndarray, k: Fp8Kernel, n: int = 1) -> jnp.ndarray:
    """`tensordot(x, k.w, n)` in fp8: `x` and the kernel as float8_e4m3fn, the output gradient as
    float8_e5m2 (module docstring). The result has the dtype `tensordot` gives; differentiating
    with respect to `k.amax_history` gives its next value."""
    delayed = k.amax_history is not None  # else current scaling: no state to update
    return _fp8_dense(x, k.w, k.amax_history if delayed else initial_amax_history(), n, delayed)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _fp8_dense(x, w, history, n: int, delayed: bool):
    return _fp8_dense_fwd(x, w, history, n, delayed)[0]


def _fp8_dense_fwd(x, w, history, n: int, delayed: bool):
    hx, hw = (history[INPUT], history[KERNEL]) if delayed else (None, None)
    sx, ax = _scale(x, hx, E4M3)
    sw, aw = _scale(w, hw, E4M3)
    qx, qw = _quantize(x, sx, E4M3), _quantize(w, sw, E4M3)
    y = _dot(qx, qw, range(x.ndim - n, x.ndim), range(n)) * (sx * sw)
    out = y.astype(jnp.result_type(x.dtype, w.dtype))
    pushed = jnp.stack([_pushed(history[INPUT], ax), _pushed(history[KERNEL], aw), history[OUTPUT_GRAD]])
    # Zeros of x's and w's dtypes stand for them in the backward (which must return those dtypes).
    return out, (qx, qw, sx, sw, pushed, jnp.zeros((), x.dtype), jnp.zeros((), w.dtype))


def _fp8_dense_bwd(n: int, delayed: bool, res, g):
    qx, qw, sx, sw, pushed, x_like, w_like = res
    sg, ag = _scale(g, pushed[OUTPUT_GRAD] if delayed else None, E5M2)
    qg = _quantize(g, sg, E5M2)
    lead, out_axes = qx.ndim - n, qw.ndim - n  # x's uncontracted axes; w's output axes
    dx = _dot(qg, qw, range(lead, lead + out_axes), range(n, qw.ndim)) * (sg * sw)
    dw = _dot(qx, qg, range(lead), range(lead)) * (sx * sg)
    new_history = pushed.at[OUTPUT_GRAD].set(_pushed(pushed[OUTPUT_GRAD], ag))
    return dx.astype(x_like.dtype), dw.astype(w_like.dtype), new_history


_fp8_dense.defvjp(_fp8_dense_fwd, _fp8_dense_bwd)
