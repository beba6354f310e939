"""`MoeMlp`: a routed mixture-of-experts MLP (Switch, ST-MoE, Mixtral, expert choice), and
`moe_losses` (defined in `cairn.models.moe_metrics`, re-exported here), which turns what its
layers report into the auxiliary losses and metrics.

Parameters (under the layer's `mlp`): `router/kernel [embed, experts]` (float32 whatever the
parameter dtype: the router runs in float32), `wi_0/kernel`, `wi_1/kernel` (a gated MLP; `wi`
for a plain one) `[experts, embed, mlp]` and `wo/kernel [experts, mlp, embed]`, their first
axis named `expert` (the mesh's `expert` axis shards it).

Dispatch is by einsum with one-hot dispatch and combine tensors `[group, tokens, experts,
capacity]` (GShard, t5x's `contrib/moe` default): a routing group is one batch row, every
expert takes at most `capacity` of its tokens (`MoeConfig.capacity`), and the expert inputs
`[experts, group, capacity, embed]` are constrained to logical axes `("expert", "batch", None,
"embed")`. Sharded over the mesh, XLA lowers the dispatch and combine einsums to the exchange
between the batch's and the experts' devices (an all-to-all where the batch is split over the
`expert` axis too). The einsums cost `2 * tokens * experts * capacity * embed` FLOPs each, small
beside the experts' matmuls for the expert counts used here (tens).

Each call sows, in the `moe` collection, the router's load-balancing loss (Switch: `num_experts
* sum_e f_e * p_e`, `f_e` the fraction of the group's tokens that chose expert `e` among their
top k, `p_e` its mean router probability; 1 at uniform top-1 routing, 0 for expert choice,
which balances by construction), the router z-loss (ST-MoE: the mean squared log-sum-exp of the
router logits) and the fraction of token assignments dropped for capacity (token choice: of the
`tokens * top_k` assignments; expert choice: of the tokens no expert took).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from cairn.models.layers import ACTIVATION_FNS, Kernel, constrain, expert_dense
from cairn.models.moe_config import MoeConfig
from cairn.models.moe_metrics import COLLECTION, METRICS, moe_losses

__all__ = [
    "COLLECTION",
    "METRICS",
    "MoeMlp",
    "expert_choice",
    "load_balance_loss",
    "moe_losses",
    "router_z_loss",
    "token_choice",
]

EXPERT_ACT = ("expert", "batch", None, "embed")
EXPERT_HIDDEN = ("expert", "batch", None, "mlp")


def token_choice(probs: jnp.ndarray, top_k: int, capacity: int, renormalize: bool):
    """Routes each token to its `top_k` most probable experts, first choices before second
    ones, in token order within each choice, until an expert's `capacity` is full.

    `probs` `[g, t, E]` float32. Returns `(dispatch, combine, expert_index, dropped_fraction)`:
    `dispatch` `[g, t, E, C]` (1 where token t fills slot c of expert e), `combine` the same with
    the token's routing weight, `expert_index` `[g, t, k]`.
    """
    g, t, e = probs.shape
    weights, index = jax.lax.top_k(probs, top_k)  # [g, t, k]
    if renormalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    choice = jax.nn.one_hot(index, e, dtype=jnp.int32)  # [g, t, k, E]
    by_rank = jnp.swapaxes(choice, 1, 2).reshape(g, top_k * t, e)  # every first choice, then every second
    slot = jnp.sum(jnp.cumsum(by_rank, axis=1) * by_rank, axis=-1) - 1  # [g, k * t]
    slot = jnp.swapaxes(slot.reshape(g, top_k, t), 1, 2)  # [g, t, k]
    kept = slot < capacity
    slot_hot = jax.nn.one_hot(jnp.where(kept, slot, capacity), capacity, dtype=jnp.float32)  # [g, t, k, C]
    choice_f = choice.astype(jnp.float32)
    dispatch = jnp.einsum("gtke,gtkc->gtec", choice_f, slot_hot)
    combine = jnp.einsum("gtke,gtkc,gtk->gtec", choice_f, slot_hot, weights)
    dropped = jnp.mean(jnp.logical_not(kept).astype(jnp.float32))  # exactly 0 when none drops
    return dispatch, combine, index, dropped


def expert_choice(probs: jnp.ndarray, capacity: int):
    """Each expert takes the `capacity` tokens of the group that give it the highest probability.

    Returns `(dispatch, combine, dropped_fraction)` shaped as `token_choice`'s; a token may go
    to several experts or none (dropped)."""
    t = probs.shape[1]
    weights, tokens = jax.lax.top_k(jnp.swapaxes(probs, 1, 2), capacity)  # [g, E, C]
    dispatch = jnp.transpose(jax.nn.one_hot(tokens, t, dtype=jnp.float32), (0, 3, 1, 2))  # [g, t, E, C]
    combine = dispatch * weights[:, None, :, :]
    dropped = jnp.mean((jnp.sum(dispatch, axis=(2, 3)) == 0).astype(jnp.float32))
    return dispatch, combine, dropped


def load_balance_loss(probs: jnp.ndarray, expert_index: jnp.ndarray) -> jnp.ndarray:
    """Switch's auxiliary loss, averaged over groups: `E * sum_e f_e * p_e`."""
    e = probs.shape[-1]
    chose = jnp.max(jax.nn.one_hot(expert_index, e, dtype=jnp.float32), axis=-2)  # [g, t, E]
    return jnp.mean(jnp.mean(chose, axis=1) * jnp.mean(probs, axis=1)) * e * e


def router_z_loss(logits: jnp.ndarray) -> jnp.ndarray:
    """ST-MoE's router z-loss: the mean of `logsumexp(logits) ** 2` over tokens."""
    return jnp.mean(jnp.square(jax.nn.logsumexp(logits, axis=-1)))


class MoeMlp(nn.Module):
    """A routed MLP on `x` `[b, l, embed]`: every row is a routing group; each expert is an MLP
    `act0(x Wi0) * act1(x Wi1) Wo` (one activation: `act(x Wi) Wo`) of `mlp_dim` hidden units.

    `wi_stddev` / `wo_stddev` / `router_stddev`: the normal initializers; `dtype` the compute
    dtype, `param_dtype` the experts' storage dtype.
    """

    config: MoeConfig
    mlp_dim: int
    activations: tuple[str, ...] = ("silu", "linear")
    wi_stddev: float = 0.02
    wo_stddev: float = 0.02
    router_stddev: float = 0.02
    dropout_rate: float = 0.0
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    deterministic: bool = True

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        cfg = self.config
        emb, num = x.shape[-1], cfg.num_experts
        dt, pdt = jnp.dtype(self.dtype), jnp.dtype(self.param_dtype)
        router = Kernel((emb, num), ("embed", None), self.router_stddev, jnp.float32, jnp.float32, name="router")()
        x_router = x.astype(jnp.float32)
        if cfg.jitter_noise > 0 and not self.deterministic:
            noise = jax.random.uniform(
                self.make_rng("dropout"), x_router.shape, jnp.float32, 1.0 - cfg.jitter_noise, 1.0 + cfg.jitter_noise
            )
            x_router = x_router * noise
        logits = jnp.einsum("gtd,de->gte", x_router, router)
        probs = jax.nn.softmax(logits, axis=-1)
        capacity = cfg.capacity(x.shape[1])
        if cfg.routing == "token_choice":
            dispatch, combine, index, dropped = token_choice(probs, cfg.top_k, capacity, cfg.renormalize)
            balance = load_balance_loss(probs, index)
        else:
            dispatch, combine, dropped = expert_choice(probs, capacity)
            balance = jnp.zeros((), jnp.float32)
        self.sow(COLLECTION, "load_balance_loss", balance)
        self.sow(COLLECTION, "router_z_loss", router_z_loss(logits))
        self.sow(COLLECTION, "dropped_fraction", dropped)

        expert_in = constrain(jnp.einsum("gtd,gtec->egcd", x.astype(dt), dispatch.astype(dt)), EXPERT_ACT)
        names = ["wi"] if len(self.activations) == 1 else [f"wi_{i}" for i in range(len(self.activations))]
        h = None
        for name, act in zip(names, self.activations):
            w = Kernel((num, emb, self.mlp_dim), ("expert", "embed", "mlp"), self.wi_stddev, dt, pdt, name=name)()
            y = ACTIVATION_FNS[act](expert_dense(expert_in, w))
            h = y if h is None else h * y
        h = constrain(h, EXPERT_HIDDEN)
        h = nn.Dropout(self.dropout_rate, broadcast_dims=(-2,))(h, deterministic=self.deterministic)
        wo = Kernel((num, self.mlp_dim, emb), ("expert", "mlp", "embed"), self.wo_stddev, dt, pdt, name="wo")()
        expert_out = constrain(expert_dense(h, wo), EXPERT_ACT)
        out = jnp.einsum("egcd,gtec->gtd", expert_out, combine.astype(dt))
        return constrain(out.astype(x.dtype), ("batch", "length", "embed"))
