"""The optimizer update of an offloaded state, a group of parameters at a time.

With `offload_optimizer_state` the optimizer state lives in host memory. Moving all of it to
the device for the update would need the device memory it was offloaded to free (float32 AdamW
moments are twice the float32 params): llama_1b with float32 params could not compile on a
16 GiB chip for that reason. `grouped_update` instead splits the parameters into groups of
about `group_bytes` and updates one group after another: the group's part of the state goes to
the device, the optimizer updates the group and its parameters, and its new state goes back to host memory before
the next group's state is moved in (an `optimization_barrier` orders the moves), so the device
holds one group's state at a time.

Each group runs the whole optimizer on trees where the other parameters are zero-size arrays,
so the state and the parameter tree keep their structure (and checkpoints their layout). This is
exact for optimizers that treat parameters independently given the step count (AdamW,
Adafactor, SGD with momentum, masks and per-group learning rates) and for the one global
transform `make_optimizer` adds, global-norm clipping, which takes the whole gradient tree as
the extra argument `offload_full_updates` (`optimizers.clip_by_global_norm`). A state leaf
belongs to a group when the group's `init` gives it the shape it has in the whole state; the
others (counts and other scalars) are shared, and every group computes the same new value.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

#: Parameter bytes updated at once (one leaf larger than this is a group of its own).
DEFAULT_GROUP_BYTES = 256 * 2**20


def _nbytes(x: Any) -> int:
    return int(np.prod(np.shape(x))) * np.dtype(x.dtype).itemsize


def parameter_groups(sizes: list[int], group_bytes: int = DEFAULT_GROUP_BYTES) -> list[list[int]]:
    """Consecutive leaf indices in groups of at most `group_bytes` (a larger leaf alone)."""
    if group_bytes < 1:
        raise ValueError(f"group_bytes must be >= 1, got {group_bytes}")
    groups: list[list[int]] = []
    total = 0
    for i, size in enumerate(sizes):
        if not groups or total + size > group_bytes:
            groups.append([])
            total = 0
        groups[-1].append(i)
        total += size
    return groups


def _empty_like(x: Any) -> jax.Array:
    return jnp.zeros((0,), x.dtype)


def grouped_update(
    optimizer: optax.GradientTransformation,
    grads: Any,
    opt_state: Any,
    params: Any,
    shardings: tuple[Any, Any],
    group_bytes: int = DEFAULT_GROUP_BYTES,
    param_offload: Any = None,
) -> tuple[Any, Any, Any]:
    """`optimizer.update(grads, opt_state, params)` with `opt_state` in host memory, a group of
    parameters at a time (module docstring), and the updates applied group by group. `shardings`:
    the state's `(device, host)` shardings. Returns the new parameters (on the device) and the
    new state (in host memory).

    Applying each group's updates at once (rather than returning a whole tree of updates) keeps
    the device from holding a second parameter-sized tree: a group's gradients and updates are
    dead once its parameters are new (float32 llama_1b: 4.9 GB that otherwise sat beside the
    gradients until the end of the step).

    `param_offload` (`param_offload.ParamOffload`): some params live in host memory too
    (`TrainerConfig.offload_params`): a group's offloaded params move in with its state, their
    new values are cast into the next `TrainState.compute` while on the device, and go back to
    host memory with the new state. Returns `(params, state, compute)` (compute None without
    `param_offload`)."""
    treedef: Any
    s_def: Any
    g_leaves, treedef = jax.tree.flatten(grads)
    p_leaves = treedef.flatten_up_to(params)
    s_leaves, s_def = jax.tree.flatten(opt_state)
    to_device, to_host = (s_def.flatten_up_to(s) for s in shardings)
    p_device: list[Any] = [None] * len(p_leaves)
    p_host: list[Any] = [None] * len(p_leaves)
    casts: list[Any] = [None] * len(p_leaves)
    if param_offload is not None:
        casts = treedef.flatten_up_to(param_offload.dtypes)
        p_device = treedef.flatten_up_to(param_offload.device)
        p_host = treedef.flatten_up_to(param_offload.host)
    new_compute: list[Any] = [None] * len(p_leaves)
    new_state: list[Any] = [None] * len(s_leaves)
    new_params: list[Any] = [None] * len(p_leaves)
    previous: list[Any] = []
    for group in parameter_groups([_nbytes(p) for p in p_leaves], group_bytes):
        members = set(group)
        group_p = [p_leaves[i] for i in group]
        part_g = treedef.unflatten([g if i in members else _empty_like(g) for i, g in enumerate(g_leaves)])
        shapes = treedef.unflatten([p if i in members else _empty_like(p) for i, p in enumerate(p_leaves)])
        template = jax.tree.leaves(jax.eval_shape(optimizer.init, shapes))
        if len(template) != len(s_leaves):
            raise ValueError("the optimizer's state for a group of parameters has another structure than its state")
        mine = [j for j, (t, s) in enumerate(zip(template, s_leaves)) if tuple(t.shape) == tuple(np.shape(s))]
        moving = [s_leaves[j] for j in mine]
        if previous:  # this group's state moves in only after the previous group is done
            (moving, group_p), _ = jax.lax.optimization_barrier(((moving, group_p), previous))
        group_p = [p if casts[i] is None else jax.device_put(p, p_device[i]) for i, p in zip(group, group_p)]
        here = dict(zip(group, group_p))
        part_p = treedef.unflatten([here[i] if i in members else _empty_like(p) for i, p in enumerate(p_leaves)])
        part_s = [jnp.zeros(t.shape, t.dtype) for t in template]
        for j, x in zip(mine, moving):
            part_s[j] = jax.device_put(x, to_device[j])
        out_u, out_s = optimizer.update(part_g, s_def.unflatten(part_s), part_p, offload_full_updates=grads)
        out_u_leaves, out_s_leaves = treedef.flatten_up_to(out_u), jax.tree.leaves(out_s)
        for j in mine:  # shared leaves (counts): every group computes the same value
            new_state[j] = jax.device_put(out_s_leaves[j], to_host[j])
        for i in group:
            new_params[i] = optax.apply_updates(here[i], out_u_leaves[i])
            if casts[i] is not None:  # offloaded: the next copy, then back to host memory
                new_compute[i] = new_params[i].astype(casts[i])
                new_params[i] = jax.device_put(new_params[i], p_host[i])
        # the next group's state moves in after this group's new parameters exist and its new
        # state is in host memory (else XLA may keep every group's new state on the device
        # until the end of the step: the whole state again)
        previous = [new_params[i] for i in group] + [new_state[j] for j in mine]
        previous += [new_compute[i] for i in group if new_compute[i] is not None]
    missing = [j for j, x in enumerate(new_state) if x is None]
    if missing:
        raise ValueError(f"no parameter group owns optimizer state leaves {missing[:5]}")
    compute = None if param_offload is None else treedef.unflatten(new_compute)
    return treedef.unflatten(new_params), s_def.unflatten(new_state), compute
