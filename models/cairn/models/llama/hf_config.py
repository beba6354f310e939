"""`config.json` of transformers' `LlamaForCausalLM` to and from `LlamaConfig`.

Both layouts are read: transformers 5 writes `rope_parameters` (`rope_type`, `rope_theta`
and, for "llama3", `factor`, `low_freq_factor`, `high_freq_factor`,
`original_max_position_embeddings`) and no top-level `rope_theta`; transformers 4 wrote
`rope_theta` and `rope_scaling` (None, or a dict whose type is `rope_type` or `type`). A
llama3 scaling without `original_max_position_embeddings` uses `max_position_embeddings`, as
transformers does. Anything the `Llama` network cannot compute (another rope type, biases, an
activation other than SiLU) is refused with an `HFInterchangeError` naming the field.
"""

from __future__ import annotations

from typing import Any

from cairn.models.hf_interchange import HFInterchangeError
from cairn.models.llama.config import ROPE_SCALING_KEYS, LlamaConfig

ARCHITECTURE = "LlamaForCausalLM"
DEFAULT_MAX_POSITIONS = 2048  # transformers' LlamaConfig default


def _field(hf: dict[str, Any], key: str, default: Any = None) -> Any:
    if key in hf and hf[key] is not None:
        return hf[key]
    if default is None:
        raise HFInterchangeError(f"config.json has no {key!r}")
    return default


def _rope(hf: dict[str, Any]) -> tuple[float, dict[str, float] | None]:
    """`(rope_theta, rope_scaling or None)` from either config layout."""
    if isinstance(hf.get("rope_parameters"), dict):
        field, rope = "rope_parameters", dict(hf["rope_parameters"])
        theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    else:
        field, rope = "rope_scaling", dict(hf.get("rope_scaling") or {})
        theta = hf.get("rope_theta", 10000.0)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type != "llama3":
        raise HFInterchangeError(f"{field}.rope_type={rope_type!r} is not supported (supported: 'default', 'llama3')")
    if "original_max_position_embeddings" not in rope:
        rope["original_max_position_embeddings"] = _field(hf, "max_position_embeddings", DEFAULT_MAX_POSITIONS)
    missing = [k for k in ROPE_SCALING_KEYS if k not in rope]
    if missing:
        raise HFInterchangeError(f"{field} (rope_type 'llama3') has no {missing}")
    return float(theta), {k: float(rope[k]) for k in ROPE_SCALING_KEYS}


def config_from_hf(hf: dict[str, Any], **overrides: Any) -> LlamaConfig:
    """A `LlamaConfig` from a transformers Llama `config.json` dict (either layout);
    `overrides` (e.g. `scan_layers=True`) adjust it. `HFInterchangeError` names an
    unsupported or inconsistent field."""
    model_type = hf.get("model_type", "llama")
    architectures = hf.get("architectures") or [ARCHITECTURE]
    if model_type != "llama" or ARCHITECTURE not in architectures:
        raise HFInterchangeError(
            f"model_type={model_type!r}, architectures={architectures!r}: not a {ARCHITECTURE} checkpoint"
        )
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
    theta, scaling = _rope(hf)
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
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),  # transformers' default
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )
    fields.update(overrides)
    try:
        return LlamaConfig(**fields)
    except (TypeError, ValueError) as e:
        raise HFInterchangeError(f"config.json does not make a LlamaConfig: {e}") from None


def hf_config(config: LlamaConfig, max_position_embeddings: int | None = None) -> dict[str, Any]:
    """The `config.json` dict (transformers 5 layout) of `config`. `max_position_embeddings`
    (Cairn does not store it): default the llama3 `original_max_position_embeddings * factor`,
    else 2048."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_scaling:
        scaling = config.rope_scaling_dict or {}
        rope = {**scaling, "rope_theta": config.rope_theta}
        if max_position_embeddings is None:
            max_position_embeddings = int(scaling["original_max_position_embeddings"] * scaling["factor"])
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.emb_dim,
        "intermediate_size": config.mlp_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings or DEFAULT_MAX_POSITIONS,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": rope,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": config.tie_word_embeddings,
        "initializer_range": config.init_std,
        "use_cache": True,
        "dtype": "float32",
    }
