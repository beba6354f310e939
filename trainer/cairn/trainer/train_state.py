"""The train state: params, optimizer state, step, RNG seed key and the model's carried state."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax


class TrainState(flax.struct.PyTreeNode):
    """Everything a step reads and writes. `rng` is the run's raw uint32 seed key; the dropout
    key of step s is `fold_in(rng, s)`, so a resumed run draws the same keys. `frozen`: None, or
    parameters the step reads but never updates (a LoRA run's base weights, `model.frozen_model`'s
    params): not differentiated, no optimizer state, not written to checkpoints. `compute`: with
    parameters offloaded to host memory (`TrainerConfig.offload_params`), their copy on the
    device in the dtype the model computes in (None for the others); derived from `params`, so
    not checkpointed (`cairn.trainer.param_offload`). `model_state`: None, or variables the model
    reads beside its params (`{collection: tree}`, `model_protocol.init_model_state`: the fp8
    matmuls' amax histories of `cairn.models.fp8`) that each step replaces with their gradient
    (overwrite-with-gradient), never given to the optimizer; checkpointed and restored with the
    params."""

    params: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array
    frozen: Any = None
    compute: Any = None
    model_state: Any = None

    @classmethod
    def create(
        cls,
        params: Any,
        optimizer: optax.GradientTransformation,
        rng: jax.Array,
        frozen: Any = None,
        model_state: Any = None,
    ) -> TrainState:
        """Step 0 with the optimizer initialized on `params`."""
        return cls(
            params=params,
            opt_state=optimizer.init(params),
            step=jnp.zeros((), jnp.int32),
            rng=rng,
            frozen=frozen,
            model_state=model_state,
        )
