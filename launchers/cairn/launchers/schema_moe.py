"""The config schema's `model.moe` section: `MoeConfig`'s fields as launcher keys (see `schema`)."""

from __future__ import annotations

import dataclasses

from cairn.launchers.schema_fields import knob, library

_MOE = "cairn.models.moe_config:MoeConfig."


@dataclasses.dataclass
class Moe:
    num_experts: int = knob(
        0, "routed experts per MoE MLP (0: the preset's MLPs, dense in every preset); a multiple of mesh.expert", min=0
    )
    top_k: int = knob(2, "token_choice: experts each token is sent to", min=1, owner=_MOE + "top_k")
    routing: str = knob(
        "token_choice",
        "token_choice (tokens pick experts) or expert_choice (experts pick tokens)",
        choices=library("cairn.models.moe_config", "ROUTINGS"),
        owner=_MOE + "routing",
    )
    capacity_factor: float = knob(
        1.25, "each expert takes ceil(factor * tokens * top_k / experts) of a row's tokens (> 0)",
        owner=_MOE + "capacity_factor",
    )  # fmt: skip
    dropless: bool = knob(False, "buffers for every token: nothing dropped", owner=_MOE + "dropless")
    every: int = knob(1, "every n-th layer's MLP is routed (n > 1 needs scan_layers off)", min=1, owner=_MOE + "every")
    expert_mlp_dim: int | None = knob(None, "each expert's hidden size (None: the model's mlp_dim)",
                                      owner=_MOE + "expert_mlp_dim")  # fmt: skip
    renormalize: bool = knob(True, "token_choice: the top_k weights rescaled to sum to 1", owner=_MOE + "renormalize")
    jitter_noise: float = knob(
        0.0, "training: router input times uniform noise in [1 - j, 1 + j]", min=0, owner=_MOE + "jitter_noise"
    )
    load_balance_loss_weight: float = knob(
        0.01, "Switch's load-balancing loss in the training loss", min=0, owner=_MOE + "load_balance_loss_weight"
    )
    router_z_loss_weight: float = knob(
        0.001, "ST-MoE's router z-loss in the training loss", min=0, owner=_MOE + "router_z_loss_weight"
    )
