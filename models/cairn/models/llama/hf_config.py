"""`config.json` of transformers' `LlamaForCausalLM` and `MixtralForCausalLM` to and from `LlamaConfig`.

Both layouts are read: transformers 5 writes `rope_parameters` (`rope_type`, `rope_theta`
and, for "llama3", `factor`, `low_freq_factor`, `high_freq_factor`,
`original_max_position_embeddings`) and no top-level `rope_theta`; transformers 4 wrote
`rope_theta` and `rope_scaling` (None, or a dict whose type is `rope_type` or `type`). A
llama3 scaling without `original_max_position_embeddings` uses `max_position_embeddings`, as
transformers does. Anything the `Llama` network cannot compute (another rope type, biases, an
activation other than SiLU) is refused with an `HFInterchangeError` naming the field.

Mixtral (`model_type` "mixtral") is a Llama with every MLP a routed mixture of experts: it
reads as a `LlamaConfig` whose `moe` is `MoeConfig(num_experts=num_local_experts,
top_k=num_experts_per_tok, dropless=True, renormalize=True, every=1)` (transformers routes every
token: softmax over all experts in float32, top k, the k weights rescaled to sum to 1), with
`router_aux_loss_coef` as `load_balance_loss_weight`, `router_jitter_noise` as `jitter_noise`
and no z-loss. Its defaults differ from Llama's (rope_theta 1e6, rms_norm_eps 1e-5); a
non-null `sliding_window` is refused (Cairn attends to the whole context).

`bos_token_id` becomes `prompt_start_id` (what `predict_batch` puts in front of a prompt; absent
or null: None, nothing) and is written back on export (when the config has one).
"""

from __future__ import annotations

from typing import Any

from cairn.models.hf_files import HFInterchangeError
from cairn.models.llama.config import ROPE_SCALING_KEYS, LlamaConfig
from cairn.models.moe_config import MoeConfig

ARCHITECTURE = "LlamaForCausalLM"
MIXTRAL_ARCHITECTURE = "MixtralForCausalLM"
ARCHITECTURES = {"llama": ARCHITECTURE, "mixtral": MIXTRAL_ARCHITECTURE}  # model_type -> architecture
DEFAULT_MAX_POSITIONS = 2048  # transformers' LlamaConfig default
# transformers' defaults per model_type: rope_theta, rms_norm_eps, max_position_embeddings
_DEFAULTS = {"llama": (10000.0, 1e-6, DEFAULT_MAX_POSITIONS), "mixtral": (1e6, 1e-5, 4096 * 32)}


def _field(hf: dict[str, Any], key: str, default: Any = None) -> Any:
    if key in hf and hf[key] is not None:
        return hf[key]
    if default is None:
        raise HFInterchangeError(f"config.json has no {key!r}")
    return default


def _rope(hf: dict[str, Any], model_type: str) -> tuple[float, dict[str, float] | None]:
    """`(rope_theta, rope_scaling or None)` from either config layout."""
    default_theta, _, default_positions = _DEFAULTS[model_type]
    if isinstance(hf.get("rope_parameters"), dict):
        field, rope = "rope_parameters", dict(hf["rope_parameters"])
        theta = rope.get("rope_theta", hf.get("rope_theta", default_theta))
    else:
        field, rope = "rope_scaling", dict(hf.get("rope_scaling") or {})
        theta = hf.get("rope_theta", default_theta)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type != "llama3":
        raise HFInterchangeError(f"{field}.rope_type={rope_type!r} is not supported (supported: 'default', 'llama3')")
    if "original_max_position_embeddings" not in rope:
        rope["original_max_position_embeddings"] = _field(hf, "max_position_embeddings", default_positions)
    missing = [k for k in ROPE_SCALING_KEYS if k not in rope]
    if missing:
        raise HFInterchangeError(f"{field} (rope_type 'llama3') has no {missing}")
    return float(theta), {k: float(rope[k]) for k in ROPE_SCALING_KEYS}


def _model_type(hf: dict[str, Any]) -> str:
    """The model type, "llama" or "mixtral", checked against `architectures` (either may be absent)."""
    architectures = hf.get("architectures") or []
    model_type = hf.get("model_type") or ("mixtral" if MIXTRAL_ARCHITECTURE in architectures else "llama")
    architecture = ARCHITECTURES.get(model_type)
    if architecture is None or (architectures and architecture not in architectures):
        raise HFInterchangeError(
            f"model_type={model_type!r}, architectures={architectures or None!r}: "
            f"not a {ARCHITECTURE} or {MIXTRAL_ARCHITECTURE} checkpoint"
        )
    return model_type


def _mixtral_moe(hf: dict[str, Any]) -> MoeConfig:
    """The `MoeConfig` of a Mixtral config.json (see the module docstring)."""
    window = hf.get("sliding_window")
    if window is not None:
        raise HFInterchangeError(
            f"sliding_window={window!r} is not supported (Cairn has no sliding-window attention; "
            "null attends to the whole context)"
        )
    experts, top_k = _field(hf, "num_local_experts", 8), _field(hf, "num_experts_per_tok", 2)
    if isinstance(experts, int) and isinstance(top_k, int) and top_k > experts:
        raise HFInterchangeError(f"num_experts_per_tok ({top_k}) must be <= num_local_experts ({experts})")
    try:
        return MoeConfig(
            num_experts=experts,
            top_k=top_k,
            dropless=True,  # transformers' Mixtral never drops a token
            renormalize=True,
            every=1,
            jitter_noise=float(hf.get("router_jitter_noise") or 0.0),
            load_balance_loss_weight=float(_field(hf, "router_aux_loss_coef", 0.001)),
            router_z_loss_weight=0.0,
        )
    except (TypeError, ValueError) as e:
        raise HFInterchangeError(f"config.json does not make a MoeConfig: {e}") from None


def config_from_hf(hf: dict[str, Any], **overrides: Any) -> LlamaConfig:
    """A `LlamaConfig` from a transformers Llama or Mixtral `config.json` dict (either layout);
    `overrides` (e.g. `scan_layers=True`) adjust it. `HFInterchangeError` names an
    unsupported or inconsistent field."""
    model_type = _model_type(hf)
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise HFInterchangeError(f"hidden_act={act!r} is not supported (Llama's MLP is SwiGLU: 'silu')")
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            raise HFInterchangeError(f"{key}={hf[key]!r} is not supported (the Llama network has no biases)")
    heads = _field(hf, "num_attention_heads")
    kv_heads = hf.get("num_key_value_heads") or heads
    if not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads:
        raise HFInterchangeError(
            f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
        )
    hidden = _field(hf, "hidden_size")
    theta, scaling = _rope(hf, model_type)
    fields: dict[str, Any] = dict(
        vocab_size=_field(hf, "vocab_size"),
        emb_dim=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=hf.get("head_dim") or hidden // heads,
        mlp_dim=_field(hf, "intermediate_size"),
        num_layers=_field(hf, "num_hidden_layers"),
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=float(_field(hf, "rms_norm_eps", _DEFAULTS[model_type][1])),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        moe=_mixtral_moe(hf) if model_type == "mixtral" else None,
        prompt_start_id=hf.get("bos_token_id"),
    )
    fields.update(overrides)
    try:
        return LlamaConfig(**fields)
    except (TypeError, ValueError) as e:
        raise HFInterchangeError(f"config.json does not make a LlamaConfig: {e}") from None


def _mixtral_fields(config: LlamaConfig, moe: MoeConfig) -> dict[str, Any]:
    """The Mixtral-only config.json fields of `config` (`moe` is its `moe`), refusing what
    transformers' `MixtralForCausalLM` does not compute."""
    required = {"routing": "token_choice", "every": 1, "renormalize": True, "dropless": True}
    for field, want in required.items():
        value = getattr(moe, field)
        if value != want:
            hint = "; transformers routes every token: export with moe.dropless=True" if field == "dropless" else ""
            raise HFInterchangeError(
                f"moe.{field}={value!r} has no {MIXTRAL_ARCHITECTURE} equivalent (needs {want!r}{hint})"
            )
    return {
        "intermediate_size": moe.mlp_dim(config.mlp_dim),
        "num_local_experts": moe.num_experts,
        "num_experts_per_tok": moe.top_k,
        "router_aux_loss_coef": moe.load_balance_loss_weight,
        "router_jitter_noise": moe.jitter_noise,
        "output_router_logits": False,
        "sliding_window": None,
    }


def hf_config(config: LlamaConfig, max_position_embeddings: int | None = None) -> dict[str, Any]:
    """The `config.json` dict (transformers 5 layout) of `config`: `LlamaForCausalLM`, or
    `MixtralForCausalLM` when `config.moe` is set (`HFInterchangeError` for a `moe` Mixtral
    cannot compute). `max_position_embeddings` (Cairn does not store it): default the llama3
    `original_max_position_embeddings * factor`, else transformers' default (Llama 2048,
    Mixtral 131072)."""
    model_type = "llama" if config.moe is None else "mixtral"
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_scaling:
        scaling = config.rope_scaling_dict or {}
        rope = {**scaling, "rope_theta": config.rope_theta}
        if max_position_embeddings is None:
            max_position_embeddings = int(scaling["original_max_position_embeddings"] * scaling["factor"])
    out: dict[str, Any] = {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.emb_dim,
        "intermediate_size": config.mlp_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings or _DEFAULTS[model_type][2],
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": rope,
        "attention_dropout": 0.0,
        "tie_word_embeddings": config.tie_word_embeddings,
        "initializer_range": config.init_std,
        "use_cache": True,
        "dtype": "float32",
    }
    if config.prompt_start_id is not None:
        out["bos_token_id"] = config.prompt_start_id
    if config.moe is None:
        out.update(attention_bias=False, mlp_bias=False)
    else:
        out.update(_mixtral_fields(config, config.moe))
    return out
