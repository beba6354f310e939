"""A tiny Flax model and a deterministic data iterator for the trainer tests (and workers)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

VOCAB, EMBED, MLP, LENGTH = 32, 128, 256, 8


class _Net(nn.Module):
    dropout: float = 0.1
    dtype: Any = None  # mixed precision: the MLP's kernels cast to this dtype before use

    @nn.compact
    def __call__(self, tokens, deterministic: bool):
        init = nn.initializers.normal(0.02)
        emb = self.param("embedding", nn.with_logical_partitioning(init, ("vocab", "embed")), (VOCAB, EMBED))
        wi = self.param("wi", nn.with_logical_partitioning(init, ("embed", "mlp")), (EMBED, MLP))
        wo = self.param("wo", nn.with_logical_partitioning(init, ("mlp", "embed")), (MLP, EMBED))
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)), (EMBED,))
        if self.dtype is not None:
            wi, wo = wi.astype(self.dtype), wo.astype(self.dtype)
        x = emb[tokens]
        h = nn.Dropout(self.dropout)(jax.nn.relu(x.astype(wi.dtype) @ wi), deterministic=deterministic)
        x = (x + (h @ wo).astype(x.dtype)) * scale
        return x @ emb.T


class TinyModel:
    """The trainer's model protocol: init(rng, batch) -> boxed params; loss_fn(params, batch, rng)."""

    def __init__(
        self, dropout: float = 0.1, nan_at_step: int | None = None, reduction: str = "mean", dtype: Any = None
    ):
        self.net = _Net(dropout, dtype)
        self.reduction = reduction
        self.nan_at_step = nan_at_step
        self.flops_per_token = 6 * (VOCAB * EMBED + 2 * EMBED * MLP + EMBED)

    def init(self, rng, batch):
        return self.net.init(rng, jnp.asarray(batch["inputs"]), True)["params"]

    def loss_fn(self, params, batch, dropout_rng):
        logits = self.net.apply(
            {"params": params},
            batch["inputs"],
            dropout_rng is None,
            rngs={"dropout": dropout_rng} if dropout_rng is not None else None,
        )
        targets = batch["targets"]
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
        z = 1e-4 * jnp.square(jax.nn.logsumexp(logits, -1))
        loss = jnp.mean(ce + z) if self.reduction == "mean" else jnp.sum(ce + z) / 100.0
        if self.nan_at_step is not None:  # a poisoned batch marker makes the loss NaN
            loss = jnp.where(jnp.any(batch["inputs"] < 0), jnp.nan, loss)
        acc = jnp.mean((jnp.argmax(logits, -1) == targets).astype(jnp.float32))
        return loss, {"accuracy": acc, "z_loss": jnp.mean(z)}


def make_batch(seed: int, position: int, batch_size: int = 16) -> dict:
    rng = np.random.default_rng([seed, position])
    inputs = rng.integers(0, VOCAB, size=(batch_size, LENGTH), dtype=np.int32)
    return {"inputs": inputs, "targets": (inputs * 7 + 3) % VOCAB}


class CountingIterator:
    """Deterministic batches; the state is the position (a JSON-able dict)."""

    def __init__(self, seed: int = 0, batch_size: int = 16, poison_at: int | None = None):
        self.seed, self.batch_size, self.position, self.poison_at = seed, batch_size, 0, poison_at

    def __iter__(self):
        return self

    def __next__(self):
        batch = make_batch(self.seed, self.position, self.batch_size)
        if self.poison_at is not None and self.position == self.poison_at:
            batch["inputs"] = batch["inputs"].copy()
            batch["inputs"][0, 0] = -1
        self.position += 1
        return batch

    def get_state(self) -> dict:
        return {"position": self.position}

    def set_state(self, state: dict) -> None:
        self.position = int(state["position"])
