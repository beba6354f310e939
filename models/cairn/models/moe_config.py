"""`MoeConfig`: the hyperparameters of a routed (mixture-of-experts) MLP, set as a model config's
`moe` field (`None`: every MLP dense)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

ROUTINGS = ("token_choice", "expert_choice")


@dataclasses.dataclass(frozen=True)
class MoeConfig:
    """A routed MLP in place of the dense one in every `every`-th layer (layers `every - 1`,
    `2 * every - 1`, ...; `every=1`: all of them, as Mixtral; ST-MoE uses 4).

    * `num_experts` experts, each an MLP like the dense one with `expert_mlp_dim` hidden units
      (None: the model's `mlp_dim`);
    * `routing`: "token_choice" (each token picks its `top_k` experts: 1 as Switch, 2 as
      Mixtral; `renormalize` rescales the k weights to sum to 1, as Mixtral) or "expert_choice"
      (each expert picks its `capacity` best tokens, Zhou et al. 2022; `top_k` unused);
    * `capacity_factor`: each expert takes at most `ceil(capacity_factor * tokens * top_k /
      num_experts)` tokens of a routing group (one row); later assignments are dropped (the
      token skips the layer's MLP through the residual) and counted. `dropless` sizes every
      buffer for all of the group's tokens instead, so nothing is dropped (as Mixtral in
      transformers);
    * `jitter_noise`: the router's input is multiplied by uniform noise in `[1 - j, 1 + j]`
      while training (Switch); the router runs in float32;
    * `load_balance_loss_weight` (Switch's auxiliary loss) and `router_z_loss_weight` (ST-MoE):
      added to the training loss.
    """

    num_experts: int = 8
    top_k: int = 2
    routing: str = "token_choice"
    capacity_factor: float = 1.25
    dropless: bool = False
    every: int = 1
    expert_mlp_dim: int | None = None
    renormalize: bool = True
    jitter_noise: float = 0.0
    load_balance_loss_weight: float = 0.01
    router_z_loss_weight: float = 0.001

    def __post_init__(self) -> None:
        for field in ("num_experts", "top_k", "every"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"moe.{field} must be a positive int, got {value!r}")
        if self.expert_mlp_dim is not None and (
            isinstance(self.expert_mlp_dim, bool) or not isinstance(self.expert_mlp_dim, int) or self.expert_mlp_dim < 1
        ):
            raise ValueError(f"moe.expert_mlp_dim must be None or a positive int, got {self.expert_mlp_dim!r}")
        if self.routing not in ROUTINGS:
            raise ValueError(f"moe.routing must be one of {ROUTINGS}, got {self.routing!r}")
        if self.routing == "token_choice" and self.top_k > self.num_experts:
            raise ValueError(f"moe.top_k ({self.top_k}) must be <= moe.num_experts ({self.num_experts})")
        cf = self.capacity_factor
        if isinstance(cf, bool) or not isinstance(cf, (int, float)) or not math.isfinite(cf) or cf <= 0:
            raise ValueError(f"moe.capacity_factor must be a positive number, got {cf!r}")
        j = self.jitter_noise
        if isinstance(j, bool) or not isinstance(j, (int, float)) or not 0 <= j < 1:
            raise ValueError(f"moe.jitter_noise must be in [0, 1), got {j!r}")
        for field in ("load_balance_loss_weight", "router_z_loss_weight"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"moe.{field} must be a number >= 0, got {value!r}")

    def is_sparse(self, layer: int) -> bool:
        """Whether layer `layer` (0-based) has the routed MLP."""
        return (layer + 1) % self.every == 0

    def mlp_dim(self, dense_mlp_dim: int) -> int:
        """Each expert's hidden size."""
        return self.expert_mlp_dim or dense_mlp_dim

    def active_experts(self) -> float:
        """The experts that process a token, on average: token choice `top_k` (at most: a token
        whose assignment is dropped for capacity uses fewer); expert choice `capacity_factor`
        (the experts take `capacity_factor * tokens` tokens in all, before `capacity` rounds up
        to whole tokens) capped at `num_experts`, and with `dropless` every expert (each takes
        the whole group). What active parameter counts and FLOPs use."""
        if self.routing == "token_choice":
            return float(self.top_k)
        if self.dropless:
            return float(self.num_experts)
        return float(min(self.capacity_factor, self.num_experts))

    def capacity(self, group_size: int) -> int:
        """Tokens each expert takes from a routing group of `group_size` tokens (at least 1)."""
        if self.dropless:
            return group_size
        k = self.top_k if self.routing == "token_choice" else 1
        return max(1, min(group_size, math.ceil(self.capacity_factor * group_size * k / self.num_experts)))

    def replace(self, **changes: Any) -> MoeConfig:
        """A copy with `changes` applied (validated again)."""
        return dataclasses.replace(self, **changes)


def as_moe_config(value: Any) -> MoeConfig | None:
    """None, a `MoeConfig`, or a mapping of its fields (as a config file writes it)."""
    if value is None or isinstance(value, MoeConfig):
        return value
    if isinstance(value, Mapping):
        known = {f.name for f in dataclasses.fields(MoeConfig)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"moe: unknown keys {unknown} (known: {sorted(known)})")
        return MoeConfig(**dict(value))
    raise ValueError(f"moe must be None, a MoeConfig or a mapping, got {type(value).__name__}")
