"""What routed MLPs report, without the MLPs: the `moe` collection's name and `moe_losses`.

Dense models import this module, not `cairn.models.moe`: a model's loss adds the router losses
when its layers sowed any, and a dense model never loads (or, under Bazel, depends on) the
routed MLP itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from cairn.models.moe_config import MoeConfig

COLLECTION = "moe"
METRICS = ("load_balance_loss", "router_z_loss", "dropped_fraction")


def moe_losses(collection: Mapping[str, Any] | None, config: MoeConfig | None) -> dict[str, jnp.ndarray]:
    """The mean over routed layers of each sown value (`moe/<name>` metrics) and the weighted
    auxiliary loss `moe/aux_loss` to add to the training loss; {} for a dense model."""
    if config is None or not collection:
        return {}
    values: dict[str, list[jnp.ndarray]] = {name: [] for name in METRICS}

    def visit(tree: Any) -> None:
        for key, value in tree.items():
            if key in values:
                values[key].extend(jnp.ravel(jnp.asarray(v, jnp.float32)) for v in value)
            elif isinstance(value, Mapping):
                visit(value)

    visit(collection)
    if not values["router_z_loss"]:
        return {}
    out = {f"moe/{name}": jnp.mean(jnp.concatenate(v)) for name, v in values.items()}
    out["moe/aux_loss"] = (
        config.load_balance_loss_weight * out["moe/load_balance_loss"]
        + config.router_z_loss_weight * out["moe/router_z_loss"]
    )
    return out
