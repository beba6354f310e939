"""The train step (with gradient accumulation) and its partitioning."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from cairn.partitioning import Partitioner, opt_state_logical_specs
from cairn.trainer.offload_update import grouped_update
from cairn.trainer.param_offload import HOST_MEMORY_KIND, ParamOffload, memory_shardings, upcast_like
from cairn.trainer.train_state import TrainState

Batch = Mapping[str, Any]
LossFn = Callable[[Any, Batch, jax.Array], tuple[jax.Array, Mapping[str, jax.Array]]]


def dropout_key(rng: jax.Array, step: jax.Array) -> jax.Array:
    """The dropout key of a step: `fold_in(seed key, step)`."""
    return jax.random.fold_in(rng, step)


def _split_microbatches(batch: Batch, num_microbatches: int) -> Batch:
    """`[B, ...]` -> `[num_microbatches, B / num_microbatches, ...]`; microbatch i holds rows
    i, i + n, i + 2n, ..., so every data shard contributes to every microbatch."""

    def one(x):
        b = x.shape[0]
        if b % num_microbatches:
            raise ValueError(f"batch size {b} is not divisible by num_microbatches={num_microbatches}")
        x = x.reshape((b // num_microbatches, num_microbatches) + x.shape[1:])
        return jnp.swapaxes(x, 0, 1)

    return jax.tree.map(one, batch)


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    learning_rate_fn: Callable,
    num_microbatches: int = 1,
    reduction: str = "mean",
    offload_shardings: tuple[Any, Any] | None = None,
    offload_group_bytes: int | None = None,
    param_offload: ParamOffload | None = None,
) -> Callable:
    """`step(state, batch) -> (state, metrics)`, unjitted.

    With `num_microbatches > 1` gradients are accumulated in float32 with a scan and combined
    by `reduction`: 'mean' (a loss that is a mean over its microbatch) or 'sum' (a loss that is
    a sum, or divided by a constant); either equals one full-batch step up to float32 rounding.
    The loss follows the same reduction; other metrics are averaged. Microbatch i draws dropout
    from `fold_in(fold_in(seed, step), i)`. Metrics: the model's, plus `loss`, `grad_norm`
    (before clipping) and `learning_rate` (the rate this update used). A state with a `frozen` tree
    calls `loss_fn(params, batch, key, frozen)` (gradients of `params` only) and passes it on.
    A state with a `model_state` calls `loss_fn(..., collections=model_state)` and replaces it with
    its gradient (its next value: overwrite-with-gradient, e.g. fp8 amax histories), past the
    optimizer and the gradient norm; microbatch i reads the state microbatch i - 1 left.

    `offload_shardings`: `(device, host)` shardings of the optimizer state (see
    `offload_opt_state_shardings`) when it lives in host memory: it is moved to the device just
    before the update (`jax.device_put` inside the step) and back to host memory after it; with
    `offload_group_bytes` a group of parameters of about that many bytes at a time
    (`offload_update.grouped_update`: for optimizers from `make_optimizer`).

    `param_offload`: the parameters the model only casts live in host memory too
    (`param_offload.ParamOffload`). The forward and backward passes run on their device copy
    (`state.compute`), whose gradients are cast back to the parameters' dtypes (bit-identical to
    gradients of the stored parameters); the update brings each group's parameters in with its
    state and makes their next copy.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        key = dropout_key(state.rng, state.step)
        frozen = state.frozen

        def grad_fn(params, model_state, batch, key):
            """`((loss, aux), grads of params, next model state)`. A frozen tree is the loss's fourth
            argument, never differentiated; the model state's gradient is its next value."""
            args = (params, batch, key) if frozen is None else (params, batch, key, frozen)
            if model_state is None:
                return (*jax.value_and_grad(loss_fn, has_aux=True)(*args), None)

            def loss(p, s):
                return loss_fn(p, *args[1:], collections=s)

            value, (grads, next_state) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(params, model_state)
            return value, grads, next_state

        work = state.params
        if param_offload is not None:
            work = param_offload.working(state.params, state.compute)
        if num_microbatches == 1:
            (loss, aux), grads, model_state = grad_fn(work, state.model_state, batch, key)
            grads = upcast_like(grads, state.params)
        else:
            micro = _split_microbatches(batch, num_microbatches)

            def body(carry, xs):
                i, mb = xs
                acc, ms = carry
                (l, a), g, ms = grad_fn(work, ms, mb, jax.random.fold_in(key, i))
                acc = jax.tree.map(lambda c, v: c + v.astype(jnp.float32), acc, (l, dict(a), g))
                return (acc, ms), None

            first = jax.tree.map(lambda x: x[0], micro)
            zeros_aux = jax.eval_shape(lambda: grad_fn(work, state.model_state, first, key)[0][1])
            init = (
                jnp.zeros((), jnp.float32),
                jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), dict(zeros_aux)),
                jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params),
            )
            carry = (init, state.model_state)
            ((loss, aux, grads), model_state), _ = jax.lax.scan(body, carry, (jnp.arange(num_microbatches), micro))
            scale = 1.0 / num_microbatches if reduction == "mean" else 1.0
            loss, aux = loss * scale, jax.tree.map(lambda v: v / num_microbatches, aux)
            grads = jax.tree.map(lambda g, p: (g * scale).astype(p.dtype), grads, state.params)
        grad_norm = optax.tree.norm(grads)
        opt_state = state.opt_state
        compute = state.compute
        if offload_shardings is not None and offload_group_bytes:
            params, opt_state, compute = grouped_update(
                optimizer, grads, opt_state, state.params, offload_shardings, offload_group_bytes, param_offload
            )
        else:
            params = state.params
            if param_offload is not None:
                params = jax.device_put(params, param_offload.device)
            if offload_shardings is not None:
                opt_state = jax.device_put(opt_state, offload_shardings[0])
            updates, opt_state = optimizer.update(grads, opt_state, params)
            if offload_shardings is not None:
                opt_state = jax.device_put(opt_state, offload_shardings[1])
            params = optax.apply_updates(params, updates)
            if param_offload is not None:
                compute = param_offload.copy_of(params)
                params = jax.device_put(params, param_offload.param_shardings())
        metrics = {k: jnp.asarray(v, jnp.float32) for k, v in dict(aux).items()}
        metrics.update(
            loss=jnp.asarray(loss, jnp.float32),
            grad_norm=grad_norm,
            learning_rate=jnp.asarray(learning_rate_fn(state.step), jnp.float32),
        )
        new_state = state.replace(
            params=params, opt_state=opt_state, step=state.step + 1, compute=compute, model_state=model_state
        )
        return new_state, metrics

    return step


# -- partitioning -----------------------------------------------------------------------------
def opt_state_specs(optimizer: optax.GradientTransformation, opt_state: Any, params: Any, param_specs: Any) -> Any:
    """Logical specs of the optimizer state: `cairn.partitioning.opt_state_logical_specs`, the
    rule `state_shardings` uses (a leaf shaped like its param gets the param's spec, Adafactor's
    factored `v_row`/`v_col` keep the names of the dimensions they keep, counts are replicated).
    `optimizer` is not needed (the state's structure says it all); kept for callers."""
    del optimizer
    return opt_state_logical_specs(params, param_specs, opt_state)


def state_shardings(
    partitioner: Partitioner,
    state_shapes: TrainState,
    param_specs: Any,
    optimizer: optax.GradientTransformation,
    frozen_specs: Any = None,
) -> TrainState:
    """`NamedSharding`s for every leaf of the train state (shapes from `jax.eval_shape`): params
    by their logical specs, the optimizer state by `Partitioner.opt_state_shardings` (factored
    statistics sharded along the dimensions they keep where divisible, else replicated). The
    trainer restores checkpoints onto these shardings too. The `frozen` tree (if any) by
    `frozen_specs`, its own logical specs; the `model_state` (if any) replicated."""
    del optimizer  # the state's structure is enough
    param_shardings = partitioner.shardings_for(param_specs, state_shapes.params)
    opt_shardings = partitioner.opt_state_shardings(state_shapes.params, param_specs, state_shapes.opt_state)
    replicated = NamedSharding(partitioner.mesh, PartitionSpec())
    frozen = None if state_shapes.frozen is None else partitioner.shardings_for(frozen_specs, state_shapes.frozen)
    model_state = jax.tree.map(lambda _: replicated, state_shapes.model_state)  # small: amax histories
    # A TrainState whose leaves are shardings, not arrays.
    shardings: Any = dict(params=param_shardings, opt_state=opt_shardings, step=replicated, rng=replicated)
    return TrainState(**shardings, frozen=frozen, model_state=model_state)


def offload_opt_state_shardings(state_sh: TrainState) -> tuple[TrainState, tuple[Any, Any]]:
    """The state's shardings with the optimizer state in host memory (`memory_kind=
    "pinned_host"`), and the `(device, host)` shardings of the optimizer state that
    `make_train_step(offload_shardings=...)` moves it between."""
    device, host = memory_shardings(state_sh.opt_state)
    return state_sh.replace(opt_state=host), (device, host)


def check_host_memory(partitioner: Partitioner, option: str = "offload_optimizer_state") -> None:
    """A `ValueError` unless every device of `partitioner`'s mesh has a pinned host memory (the
    home of what `option` offloads)."""
    for device in partitioner.mesh.local_devices:
        kinds = [m.kind for m in device.addressable_memories()]
        if HOST_MEMORY_KIND not in kinds:
            raise ValueError(f"{option} needs {HOST_MEMORY_KIND!r} memory, but device {device} has only {kinds}")


def batch_shardings(partitioner: Partitioner, batch: Batch) -> Any:
    """`NamedSharding`s for a global batch: rows over the batch axes, the rest replicated."""

    def one(x):
        ndim = np.ndim(x)
        names = tuple(partitioner.batch_spec[:ndim]) + (None,) * max(0, ndim - len(partitioner.batch_spec))
        return partitioner.sharding(names, np.shape(x), "batch")

    return jax.tree.map(one, batch)


def partitioned_train_step(
    step_fn: Callable,
    partitioner: Partitioner,
    state_sh: TrainState,
    batch_sh: Any,
    donate: bool = False,
    compiler_options: Mapping[str, Any] | None = None,
) -> Callable:
    """The step jitted with the state's and batch's shardings (metrics replicated), compiled
    with `compiler_options` (XLA flags for this program)."""
    replicated = NamedSharding(partitioner.mesh, PartitionSpec())
    return partitioner.partition(
        step_fn,
        in_shardings=(state_sh, batch_sh),
        out_shardings=(state_sh, replicated),
        donate_argnums=(0,) if donate else (),
        compiler_options=compiler_options,
    )
