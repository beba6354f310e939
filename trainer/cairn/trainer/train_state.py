"""The train state: params, optimizer state, step and RNG seed key."""

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
    params): not differentiated, no optimizer state, not written to checkpoints."""

    params: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array
    frozen: Any = None

    @classmethod
    def create(
        cls, params: Any, optimizer: optax.GradientTransformation, rng: jax.Array, frozen: Any = None
    ) -> TrainState:
        """Step 0 with the optimizer initialized on `params`."""
        return cls(
            params=params, opt_state=optimizer.init(params), step=jnp.zeros((), jnp.int32), rng=rng, frozen=frozen
        )
