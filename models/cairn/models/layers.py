"""Building blocks shared by the networks: RMS norm, token embedding, MLP, dense kernels.

Every parameter carries logical axis names (`embed`, `vocab`, `heads`, `kv`, `mlp`) through
`flax.linen.with_logical_partitioning`; activations are constrained by logical names with the
rules of the `cairn.partitioning` partitioner whose function is being traced
(`current_partitioner`), else with `flax.linen.with_logical_constraint` (Flax's
`logical_axis_rules` context; a no-op outside one).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from cairn.models.fp8 import Fp8Kernel, fp8_dense, fp8_kernel
from cairn.partitioning.partitioner import current_partitioner
from cairn.partitioning.platform import platform_variant

ACTIVATION_FNS = {
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=True),  # transformers' gelu_new
    "silu": jax.nn.silu,
    "linear": lambda x: x,
}


def normal(stddev: float) -> nn.initializers.Initializer:
    """A zero-mean normal initializer (deterministic given the key)."""
    return nn.initializers.normal(stddev)


def constrain(x, axes: tuple[str | None, ...]):
    """Annotates an activation with logical axis names: the current `cairn.partitioning`
    partitioner's constraint (its rules, a dimension they do not divide unsharded), else
    Flax's (`nn.logical_axis_rules`), else nothing."""
    partitioner = current_partitioner()
    if partitioner is not None:
        return partitioner.constrain(x, axes)
    return nn.with_logical_constraint(x, axes)


class RMSNorm(nn.Module):
    """T5's layer norm: scale only, no mean subtraction, no bias; computed in float32
    (the `scale` parameter is stored as `param_dtype`)."""

    epsilon: float = 1e-6
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        scale = self.param(
            "scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)), (x.shape[-1],), self.param_dtype
        )
        x32 = x.astype(jnp.float32)
        var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
        y = x32 * jax.lax.rsqrt(var + self.epsilon)
        return (y * scale.astype(jnp.float32)).astype(self.dtype)


# A prompt-tuned embedding's prompt (`cairn.models.prompt_tuning`): a parameter `[n, embed]` of this
# name beside an `Embed`'s table makes the ids `num_embeddings + i` look up its row `i`.
PROMPT = "prompt"


class Embed(nn.Module):
    """A token embedding table `[vocab, embed]` (stored as `param_dtype`) that can also produce
    logits (`attend`). With a `PROMPT` parameter beside the table (a prompted params tree), ids
    past the table are the prompt's positions."""

    num_embeddings: int
    features: int
    dtype: jnp.dtype = jnp.float32
    embedding_init: nn.initializers.Initializer = normal(1.0)
    param_dtype: jnp.dtype = jnp.float32

    def setup(self):
        self.embedding = self.param(
            "embedding",
            nn.with_logical_partitioning(self.embedding_init, ("vocab", "embed")),
            (self.num_embeddings, self.features),
            self.param_dtype,
        )

    def __call__(self, ids):
        table = jnp.asarray(self.embedding, self.dtype)
        if not self.has_variable("params", PROMPT):
            return jnp.take(table, ids, axis=0)
        # A prompted params tree (`cairn.models.prompt_tuning`): ids from `num_embeddings` on are
        # the prompt's positions, looked up in the prompt.
        prompt = jnp.asarray(self.get_variable("params", PROMPT), self.dtype)
        virtual = ids >= self.num_embeddings
        x = jnp.take(table, jnp.where(virtual, 0, ids), axis=0)
        p = jnp.take(prompt, jnp.clip(ids - self.num_embeddings, 0, prompt.shape[0] - 1), axis=0)
        return jnp.where(virtual[..., None], p, x)

    def table(self):
        """The table `[vocab, embed]` cast to `dtype` (a tied output projection)."""
        return jnp.asarray(self.embedding, self.dtype)

    def attend(self, x, preferred_element_type=None):
        """`x @ embedding.T`: logits over the vocabulary (`attend_table`)."""
        return attend_table(x, jnp.asarray(self.embedding, self.dtype), preferred_element_type)


def attend_table(x, table, preferred_element_type=None):
    """`x @ table.T` (`[..., e]` against `[vocab, e]`: tied logits) as one 2-D matmul over the
    flattened tokens. Its table gradient then contracts one tokens axis, which XLA:CPU multiplies
    in place; with `[b, l]` kept apart it contracts two, and XLA first wrote the whole incoming
    logits gradient out transposed (~90 ms a llama_150m step, `[512, 49152]` float32)."""
    flat = x.reshape(-1, x.shape[-1])
    logits = jnp.einsum("te,ve->tv", flat, table, preferred_element_type=preferred_element_type)
    return logits.reshape(*x.shape[:-1], table.shape[0])


# Which backward `dense` uses, read each time a function calling `dense` is traced (set it before
# tracing; a jitted function keeps the variant it was traced with): "auto" (the CPU layout below
# when `platform.backend()` is "cpu", autodiff's plain VJP on GPU and TPU), "cpu" or "standard"
# (either one on any platform: tests compare them).
DENSE_VJP = "auto"
DENSE_VJP_CHOICES = ("auto", "cpu", "standard")


def dense_vjp_variant(variant: str | None = None) -> str:
    """ "cpu" or "standard": `variant`, else the module's `DENSE_VJP`, with "auto" decided by
    `platform.backend()` (deterministic for a process: its default platform or compile target)."""
    return platform_variant(
        DENSE_VJP if variant is None else variant, DENSE_VJP_CHOICES, "dense VJP variant", "standard"
    )


# The variable collection of LoRA adapters (`cairn.models.lora`): beside a kernel parameter `name`
# of a module, a variable `name` in this collection holding `{"lora_a", "lora_b"}` (B already
# scaled by alpha / rank) makes `kernel` / `Kernel` return a `LoraKernel`.
LORA = "lora"


@flax.struct.dataclass
class LoraKernel:
    """A kernel `w` with a low-rank update `a @ b` that is never formed: `dense`, `project_heads` and
    `expert_dense` compute `x w + (x a) b`, so the backward of a LoRA step needs no `[in, out]`
    weight gradient. `a`: the kernel's leading (`layers`/`expert`) and input axes then the rank;
    `b`: the leading axes, the rank, then the output axes. Anything else that reads it as an
    array gets the folded kernel `w + a @ b` (`__jax_array__`)."""

    w: jnp.ndarray
    a: jnp.ndarray
    b: jnp.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.w.shape)

    @property
    def dtype(self):
        return self.w.dtype

    def folded(self) -> jnp.ndarray:
        nb = self.a.ndim + self.b.ndim - 2 - self.w.ndim
        batch, rank = self.w.shape[:nb], self.a.shape[-1]
        a2, b2 = self.a.reshape(*batch, -1, rank), self.b.reshape(*batch, rank, -1)
        return self.w + jnp.matmul(a2, b2).reshape(self.w.shape).astype(self.w.dtype)

    def __jax_array__(self) -> jnp.ndarray:
        return self.folded()


def _with_adapter(module: nn.Module, name: str, w: jnp.ndarray, dtype) -> jnp.ndarray | LoraKernel:
    """`w`, or a `LoraKernel` when the module has a `LORA` variable `name` (cast to `dtype`)."""
    if not module.has_variable(LORA, name):
        return w
    adapter: Any = module.get_variable(LORA, name)
    return LoraKernel(w, jnp.asarray(adapter["lora_a"], dtype), jnp.asarray(adapter["lora_b"], dtype))


def dense(x, w, n: int = 1, *, vjp: str | None = None):
    """`tensordot(x, w, n)`: the last `n` axes of `x` against the first `n` of `w`.

    The forward is the plain contraction either way. The backward (`vjp`, default `DENSE_VJP`)
    is autodiff's on GPU and TPU ("standard"); on CPU ("cpu") the same two products (equal up
    to float32 rounding) in the layout XLA:CPU multiplies fastest. A `LoraKernel` adds its
    low-rank product through the rank: `x w + (x a) b`. An `Fp8Kernel` multiplies in fp8
    (`cairn.models.fp8.fp8_dense`, its own backward on every platform).
    """
    if isinstance(w, Fp8Kernel):
        return fp8_dense(x, w, n)
    if isinstance(w, LoraKernel):
        return dense(x, w.w, n, vjp=vjp) + dense(dense(x, w.a, n, vjp=vjp), w.b, 1, vjp=vjp)
    if dense_vjp_variant(vjp) == "cpu":
        return _dense_cpu(x, w, n)
    return jnp.tensordot(x, w, axes=n)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _dense_cpu(x, w, n: int):
    return _dense_2d(x, w, n)


def _dense_2d(x, w, n: int):
    """`tensordot(x, w, n)` as one `[tokens, in] @ [in, out]` matmul (every axis pair flattened)."""
    k = int(np.prod(w.shape[:n]))
    y = jnp.dot(x.reshape(-1, k), w.reshape(k, -1))
    return y.reshape(*x.shape[: x.ndim - n], *w.shape[n:])


def _dense_cpu_fwd(x, w, n):
    return _dense_2d(x, w, n), (x, w)


def _dense_cpu_bwd(n, res, g):
    x, w = res
    k = int(np.prod(w.shape[:n]))
    w2, g2 = w.reshape(k, -1), g.reshape(-1, int(np.prod(w.shape[n:])))
    # Both products on 2-D operands, each contracting one axis: XLA:CPU multiplies `g @ w.T`
    # as it stands, whereas with the weight's axes kept apart (a query kernel [emb, heads,
    # head_dim], an output kernel [heads, head_dim, emb]) it first copied every such kernel out
    # transposed, each step (~2-3 ms per llama_150m kernel at ~1 GB/s).
    dx = jnp.einsum("to,io->ti", g2, w2).reshape(x.shape)
    # The weight gradient as one plain [in, tokens] @ [tokens, out] matmul, with the small
    # transposed activations materialised behind a barrier: otherwise XLA:CPU transposes the
    # (larger) incoming gradient instead, inside the fused elementwise backward of the
    # activation, which reads its inputs with a stride of one row per element (~3x slower
    # than the matmul it feeds, for the T5 MLP on 1024 tokens).
    xt = jax.lax.optimization_barrier(x.reshape(-1, k).T)
    dw = jnp.dot(xt, g2).reshape(w.shape)
    return dx.astype(x.dtype), dw.astype(w.dtype)


_dense_cpu.defvjp(_dense_cpu_fwd, _dense_cpu_bwd)


def expert_dense(x, w, *, vjp: str | None = None):
    """Each expert's matmul: `x` `[experts, ..., in]` against `w` `[experts, in, out]` gives
    `[experts, ..., out]`. The backward is autodiff's on GPU and TPU; on CPU (`vjp` as `dense`'s)
    the weight gradient is one batched `[in, tokens] @ [tokens, out]` per expert with the small
    transposed activations materialised, as `dense` does (~13 % faster for the MoE bench's experts).
    A `LoraKernel` adds each expert's low-rank product through the rank."""
    if isinstance(w, LoraKernel):
        return expert_dense(x, w.w, vjp=vjp) + expert_dense(expert_dense(x, w.a, vjp=vjp), w.b, vjp=vjp)
    if dense_vjp_variant(vjp) == "cpu":
        return _expert_dense_cpu(x, w)
    return jnp.einsum("e...d,edm->e...m", x, w)


@jax.custom_vjp
def _expert_dense_cpu(x, w):
    return jnp.einsum("e...d,edm->e...m", x, w)


def _expert_dense_cpu_fwd(x, w):
    return _expert_dense_cpu(x, w), (x, w)


def _expert_dense_cpu_bwd(res, g):
    x, w = res
    e, d = w.shape[0], w.shape[1]
    dx = jnp.einsum("e...m,edm->e...d", g, w)
    xt = jax.lax.optimization_barrier(jnp.swapaxes(x.reshape(e, -1, d), 1, 2))  # [e, in, tokens]
    dw = jnp.matmul(xt, g.reshape(e, -1, g.shape[-1]))
    return dx.astype(x.dtype), dw.astype(w.dtype)


_expert_dense_cpu.defvjp(_expert_dense_cpu_fwd, _expert_dense_cpu_bwd)


def _enclosing_config_field(module: nn.Module, field: str) -> str | None:
    """The string `field` of the `config` of the nearest module, `module` itself or one it is
    nested in, that has one (a family config: T5Config, DecoderOnlyConfig, LlamaConfig); None
    when none has."""
    m: object = module
    while isinstance(m, nn.Module):
        value = getattr(getattr(m, "config", None), field, None)
        if isinstance(value, str):
            return value
        m = m.parent
    return None


def enclosing_param_dtype(module: nn.Module) -> jnp.dtype:
    """The enclosing config's `param_dtype` (`_enclosing_config_field`); float32 when none has
    one. What `kernel` stores a parameter in when not told."""
    return jnp.dtype(_enclosing_config_field(module, "param_dtype") or jnp.float32)


def _quantizable(module: nn.Module, name: str, w: jnp.ndarray, dtype, fp8: bool) -> Any:
    """A kernel's value for `dense`: a `LoraKernel` when it has an adapter (never quantized), else
    with `fp8` and the enclosing config's `matmul_precision` "fp8" an `Fp8Kernel` (its scaling
    state the module's `cairn.models.fp8.FP8_STATE` variable `name`), else `w`."""
    if fp8 and not module.has_variable(LORA, name) and _enclosing_config_field(module, "matmul_precision") == "fp8":
        return fp8_kernel(module, name, w)
    return _with_adapter(module, name, w, dtype)


def kernel(
    module: nn.Module,
    name: str,
    shape: Sequence[int],
    axes: tuple[str, ...],
    stddev: float,
    dtype,
    param_dtype=None,
    fp8: bool = False,
) -> Any:
    """Declares a bias-free kernel with logical axes, stored as `param_dtype` (default: the
    enclosing config's, `enclosing_param_dtype`), and returns it cast to `dtype` (a `LoraKernel`
    when a LoRA adapter of it is given: `LORA`). `fp8`: a projection that the config's
    `matmul_precision="fp8"` multiplies in fp8 (an `Fp8Kernel`: `_quantizable`)."""
    pdt = enclosing_param_dtype(module) if param_dtype is None else jnp.dtype(param_dtype)
    value = module.param(name, nn.with_logical_partitioning(normal(stddev), axes), tuple(shape), pdt)
    return _quantizable(module, name, jnp.asarray(value, dtype), dtype, fp8)


class Kernel(nn.Module):
    """A bias-free kernel as its own submodule (parameter `<name>/kernel`), stored as
    `param_dtype` with logical axis names; `__call__` returns it cast to `dtype`. `fp8`: as
    `kernel`'s (its scaling state the variable `<name>/kernel` of `FP8_STATE`)."""

    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    stddev: float
    dtype: jnp.dtype
    param_dtype: jnp.dtype
    fp8: bool = False

    @nn.compact
    def __call__(self) -> Any:  # an array, a LoraKernel or an Fp8Kernel (`_quantizable`)
        init = nn.with_logical_partitioning(nn.initializers.normal(self.stddev), self.axes)
        w = jnp.asarray(self.param("kernel", init, self.shape, self.param_dtype), self.dtype)
        return _quantizable(self, "kernel", w, self.dtype, self.fp8)


class MlpBlock(nn.Module):
    """The position-wise MLP: `act(x Wi) Wo`, or gated `act0(x Wi0) * act1(x Wi1) Wo` (kernels
    stored as `param_dtype`, computed in `dtype`, or in fp8 under a config's
    `matmul_precision="fp8"`)."""

    mlp_dim: int
    activations: tuple[str, ...] = ("relu",)
    dropout_rate: float = 0.0
    dtype: jnp.dtype = jnp.float32
    deterministic: bool = True
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        emb = x.shape[-1]
        if len(self.activations) == 1:
            names = ["wi"]
        else:
            names = [f"wi_{i}" for i in range(len(self.activations))]
        h, dt, pdt = None, self.dtype, self.param_dtype
        for name, act in zip(names, self.activations):
            w = kernel(self, name, (emb, self.mlp_dim), ("embed", "mlp"), emb**-0.5, dt, pdt, fp8=True)
            y = ACTIVATION_FNS[act](named(dense(x, w), MLP_WI))
            h = y if h is None else h * y
        h = constrain(h, ("batch", "length", "mlp"))
        h = nn.Dropout(self.dropout_rate, broadcast_dims=(-2,))(h, deterministic=self.deterministic)
        wo = kernel(self, "wo", (self.mlp_dim, emb), ("mlp", "embed"), self.mlp_dim**-0.5, dt, pdt, fp8=True)
        return named(dense(h, wo), MLP_WO)


# Names (`jax.ad_checkpoint.checkpoint_name`) of the activations a remat policy may save: the
# attention's four projections, the Pallas or cuDNN attention kernel's residuals (its output
# and log-sum-exp), and the MLP's input kernels' and output kernel's products.
ATTENTION_PROJECTIONS = ("query_proj", "key_proj", "value_proj", "out_proj")
ATTENTION_KERNEL = "attention_kernel"
MLP_WI, MLP_WO = "mlp_wi", "mlp_wo"


def named(x, name: str):
    """`x`, named for the remat policies (`remat_policy`): a no-op outside `jax.checkpoint`."""
    return checkpoint_name(x, name)


def project_heads(x, w, name: str):
    """`named(dense(x, w), name)` for a kernel `[embed, heads, head_dim]`, named while the product is
    still `[..., heads * head_dim]`, then split into `[..., heads, head_dim]`.

    What a remat policy saves is the named array: flat, its minor dimension fills a TPU's
    128 lanes; `[..., heads, 64]` would be padded to twice its bytes (T5.1.1-large at batch 32:
    the `minimal` policy's projections took 19.8 GiB this way)."""
    e, h, d = w.shape
    if isinstance(w, LoraKernel):  # b [rank, heads, head_dim] flattened with the kernel
        w = LoraKernel(w.w.reshape(e, h * d), w.a, w.b.reshape(w.b.shape[0], h * d))
    else:  # an array, or an Fp8Kernel (its per-tensor scale does not depend on the shape)
        w = w.reshape(e, h * d)
    y = named(dense(x, w), name)
    return y.reshape(*y.shape[:-1], h, d)


OFFLOADED = "_offloaded"
# The named activations each policy saves (the offloaded policies move the same names to the
# host; "dots" saves every unbatched matmul product, which here are the named ones).
_SAVED_NAMES = {
    "dots": (*ATTENTION_PROJECTIONS, ATTENTION_KERNEL, MLP_WI, MLP_WO),
    "dots_except_mlp_wi": (*ATTENTION_PROJECTIONS, ATTENTION_KERNEL, MLP_WO),
    "minimal": (*ATTENTION_PROJECTIONS, ATTENTION_KERNEL),
    "kv_projections": ATTENTION_PROJECTIONS[1:3],
    "attention_kernel": (ATTENTION_KERNEL,),
    "mlp_wi": (MLP_WI, ATTENTION_KERNEL),
}


def remat_policy(name: str):
    """The `jax.checkpoint` policy for a config's `remat_policy`: what the backward pass reads
    from the forward instead of recomputing it.

    * "full": nothing (each layer's forward runs again in the backward);
    * "dots": every matmul product without batch dimensions (the projections and MLP kernels,
      not attention's batched einsums) and the attention kernel's residuals;
    * "dots_except_mlp_wi": the same but the MLP's input products (`[tokens, mlp_dim]`, the
      largest: recomputed, one extra matmul per MLP input kernel);
    * "minimal": the attention projections and kernel residuals only (the whole MLP recomputed);
    * "kv_projections": only the key and value projections (`full` otherwise: under grouped-query
      attention they are the smallest products, a fraction of a layer's input each, and spare
      their matmuls' recompute where `full` leaves a little memory free);
    * "attention_kernel": only the Pallas or cuDNN attention kernel's residuals (its output and
      log-sum-exp; `full` otherwise): the backward recomputes the layer's matmuls but not the
      kernel's forward. Under XLA's attention nothing is named so, and it is `full`;
    * "mlp_wi": the MLP's input products and the attention kernel's residuals (`full`
      otherwise): the backward recomputes the attention's projections and the MLP's activation
      but not its input matmuls (in a T5.1.1 layer about 60 % of `full`'s recomputed FLOPs),
      for two `[tokens, mlp_dim]` products kept a layer. T5.1.1-large on a v5e, bf16 params,
      batch 32: 12.4 GiB and 48.2 % MFU against `full`'s 43.5 %;
    * "<policy>_offloaded" ("dots", "dots_except_mlp_wi", "minimal"): the same activations, but
      moved to the host's memory (`pinned_host`) after the forward and back for the backward,
      so that they take no device memory between the two (the transfers overlap the compute).
    """
    policies = jax.checkpoint_policies
    if name == "full":
        return None
    if name.endswith(OFFLOADED):
        names = _SAVED_NAMES.get(name[: -len(OFFLOADED)])
        if names is not None:
            return policies.save_and_offload_only_these_names(
                names_which_can_be_saved=(),
                names_which_can_be_offloaded=names,
                offload_src="device",
                offload_dst="pinned_host",
            )
    if name == "dots":
        return policies.save_from_both_policies(
            policies.dots_with_no_batch_dims_saveable, policies.save_only_these_names(ATTENTION_KERNEL)
        )
    if name in ("dots_except_mlp_wi", "minimal", "kv_projections", "attention_kernel", "mlp_wi"):
        return policies.save_only_these_names(*_SAVED_NAMES[name])
    raise ValueError(f"no checkpoint policy for remat_policy={name!r}")
