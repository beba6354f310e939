"""Export to and import from the Hugging Face `transformers` T5 layout.

A checkpoint directory holds `config.json` (a `T5Config` of transformers) and
`model.safetensors` (float32, torch layout: `Linear.weight` is `[out, in]`). Only numpy and
safetensors' numpy API are used: no torch at run time. Covers T5.1.0 (ReLU, tied logits
rescaled by `d_model ** -0.5`), T5.1.1 and mT5 (gated GELU, separate `lm_head`), and the tied,
unscaled head transformers 5 writes for mT5 and T5.1.1-shaped models.

How transformers 5 reads a checkpoint, and so how we do: the logits are tied to
`shared.weight` unless the file holds an `lm_head.weight` that differs from it (its configs
always say `tie_word_embeddings: true`); the decoder output is rescaled by `d_model ** -0.5`
never for mT5, and for T5 when `scale_decoder_outputs` says so (absent, as transformers 4
wrote them: unless `tie_word_embeddings` is false).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from cairn import storage
from cairn.models.hf_files import CONFIG_FILE, WEIGHTS_FILE, HFInterchangeError, read_header
from cairn.models.stacking import stack_layers, unstack_layers
from cairn.models.t5.config import T5Config


def _feed_forward_proj(config: T5Config) -> str:
    acts = config.mlp_activations
    if len(acts) == 1:
        return {"relu": "relu", "gelu": "gelu_new", "silu": "silu"}.get(acts[0]) or _bad_acts(acts)
    if acts[1] != "linear" or acts[0] == "linear":
        _bad_acts(acts)
    return "gated-" + acts[0]


def _bad_acts(acts):
    raise HFInterchangeError(
        f"mlp_activations={acts!r} has no transformers T5 equivalent "
        "(supported: ('relu',), ('gelu',), ('silu',), (act, 'linear'))"
    )


def _activations(proj: str) -> tuple[str, ...]:
    parts = proj.split("-")
    act = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu", "silu": "silu"}.get(parts[-1])
    # transformers maps "gated-gelu" to gelu_new (tanh); a plain "gelu" is the exact erf GELU.
    if act is None or (len(parts) == 1 and parts[0] == "gelu"):
        raise HFInterchangeError(
            f"feed_forward_proj={proj!r} is not supported "
            "(supported: relu, gelu_new, silu, gated-gelu, gated-silu, gated-relu)"
        )
    return (act, "linear") if parts[0] == "gated" else (act,)


def hf_config(config: T5Config) -> dict[str, Any]:
    """The transformers `config.json` dict for `config`."""
    return {
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "vocab_size": config.vocab_size,
        "d_model": config.emb_dim,
        "d_kv": config.head_dim,
        "d_ff": config.mlp_dim,
        "num_layers": config.num_encoder_layers,
        "num_decoder_layers": config.num_decoder_layers,
        "num_heads": config.num_heads,
        "relative_attention_num_buckets": config.relative_attention_num_buckets,
        "relative_attention_max_distance": config.relative_attention_max_distance,
        "dropout_rate": config.dropout_rate,
        "layer_norm_epsilon": config.layer_norm_epsilon,
        "initializer_factor": 1.0,
        "feed_forward_proj": _feed_forward_proj(config),
        "tie_word_embeddings": config.logits_via_embedding,
        "scale_decoder_outputs": config.logits_via_embedding and config.scale_tied_logits,
        "is_encoder_decoder": True,
        "use_cache": True,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
    }


def scales_decoder_output(hf: dict[str, Any]) -> bool:
    """Whether transformers 5 rescales the decoder output of this `config.json` dict by
    `d_model ** -0.5` before `lm_head`: never for mT5; for T5 as `scale_decoder_outputs` says,
    or, where that is absent, unless `tie_word_embeddings` is false."""
    if hf.get("model_type", "t5") == "mt5":
        return False
    if "scale_decoder_outputs" in hf:
        return bool(hf["scale_decoder_outputs"])
    return hf.get("tie_word_embeddings") is not False


def lm_head_tied(names: Collection[str], equal: Callable[[], bool]) -> bool:
    """Whether a checkpoint with tensors `names` ties `lm_head` to `shared` as transformers 5
    does: no `lm_head.weight`, or one that `equal()` finds equal to `shared.weight`."""
    if "lm_head.weight" not in names:
        return True
    return "shared.weight" in names and equal()


def config_from_hf(hf: dict[str, Any], *, tied: bool | None = None, **overrides) -> T5Config:
    """A `T5Config` from a transformers T5/mT5 `config.json` dict.

    `tied`: whether the checkpoint ties `lm_head` to `shared` (`lm_head_tied`); None decides
    from `tie_word_embeddings` alone, which only configs written by transformers 4 set to
    false (`config_from_hf_dir` looks at the weights). An untied head that transformers
    rescales cannot be expressed: `import_hf` folds the scale into the `logits` kernel.
    """
    if hf.get("model_type", "t5") not in ("t5", "mt5"):
        raise HFInterchangeError(f"model_type={hf.get('model_type')!r} is not a T5 model")
    if tied is None:
        tied = hf.get("tie_word_embeddings") is not False
    fields = dict(
        vocab_size=hf["vocab_size"],
        emb_dim=hf["d_model"],
        num_heads=hf["num_heads"],
        head_dim=hf["d_kv"],
        mlp_dim=hf["d_ff"],
        num_encoder_layers=hf["num_layers"],
        num_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"],
        mlp_activations=_activations(hf.get("feed_forward_proj", "relu")),
        logits_via_embedding=tied,
        scale_tied_logits=scales_decoder_output(hf) if tied else True,
        dropout_rate=float(hf.get("dropout_rate", 0.1)),  # transformers' default
        relative_attention_num_buckets=hf.get("relative_attention_num_buckets", 32),
        relative_attention_max_distance=hf.get("relative_attention_max_distance", 128),
        layer_norm_epsilon=hf.get("layer_norm_epsilon", 1e-6),
    )
    fields.update(overrides)
    return T5Config(**fields)


def _linear(w: np.ndarray) -> np.ndarray:
    """Our `[in..., out...]` kernel as a torch `[out, in]` weight."""
    return np.ascontiguousarray(w.T)


def _attention_to_hf(p, prefix: str, out: dict[str, np.ndarray]):
    e, h, d = p["query"].shape
    for ours, theirs in (("query", "q"), ("key", "k"), ("value", "v")):
        out[f"{prefix}.{theirs}.weight"] = _linear(p[ours].reshape(e, h * d))
    out[f"{prefix}.o.weight"] = _linear(p["out"].reshape(h * d, e))


def _mlp_to_hf(p, prefix: str, out: dict[str, np.ndarray]):
    for name, w in p.items():
        out[f"{prefix}.{name}.weight"] = _linear(w)


def to_hf_state_dict(params: Any, config: T5Config) -> dict[str, np.ndarray]:
    """Our params (boxed or not, scanned or not) as a transformers T5 state dict of numpy arrays."""
    p = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), nn.meta.unbox(params))
    p = p.get("params", p)
    enc = unstack_layers(p["encoder"], config.num_encoder_layers)
    dec = unstack_layers(p["decoder"], config.num_decoder_layers)
    out: dict[str, np.ndarray] = {"shared.weight": p["token_embedder"]["embedding"]}
    for stack, tree in (("encoder", enc), ("decoder", dec)):
        out[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = _linear(
            tree["relpos_bias"]["rel_embedding"]
        )
    for i in range(config.num_encoder_layers):
        lp, b = enc[f"layers_{i}"], f"encoder.block.{i}.layer"
        out[f"{b}.0.layer_norm.weight"] = lp["pre_attention_layer_norm"]["scale"]
        _attention_to_hf(lp["attention"], f"{b}.0.SelfAttention", out)
        out[f"{b}.1.layer_norm.weight"] = lp["pre_mlp_layer_norm"]["scale"]
        _mlp_to_hf(lp["mlp"], f"{b}.1.DenseReluDense", out)
    for i in range(config.num_decoder_layers):
        lp, b = dec[f"layers_{i}"], f"decoder.block.{i}.layer"
        out[f"{b}.0.layer_norm.weight"] = lp["pre_self_attention_layer_norm"]["scale"]
        _attention_to_hf(lp["self_attention"], f"{b}.0.SelfAttention", out)
        out[f"{b}.1.layer_norm.weight"] = lp["pre_cross_attention_layer_norm"]["scale"]
        _attention_to_hf(lp["encoder_decoder_attention"], f"{b}.1.EncDecAttention", out)
        out[f"{b}.2.layer_norm.weight"] = lp["pre_mlp_layer_norm"]["scale"]
        _mlp_to_hf(lp["mlp"], f"{b}.2.DenseReluDense", out)
    out["encoder.final_layer_norm.weight"] = enc["encoder_norm"]["scale"]
    out["decoder.final_layer_norm.weight"] = dec["decoder_norm"]["scale"]
    if not config.logits_via_embedding:
        out["lm_head.weight"] = _linear(dec["logits"])
    return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}


class _Reader:
    """Pops tensors from a state dict, naming the missing key when one is absent."""

    def __init__(self, tensors: dict[str, np.ndarray]):
        self.tensors = dict(tensors)

    def take(self, key: str) -> np.ndarray:
        if key not in self.tensors:
            raise HFInterchangeError(f"checkpoint has no tensor {key!r}")
        return np.asarray(self.tensors.pop(key), np.float32)

    def attention(self, prefix: str, config: T5Config) -> dict[str, np.ndarray]:
        e, h, d = config.emb_dim, config.num_heads, config.head_dim
        p = {
            ours: self.take(f"{prefix}.{theirs}.weight").T.reshape(e, h, d)
            for ours, theirs in (("query", "q"), ("key", "k"), ("value", "v"))
        }
        p["out"] = self.take(f"{prefix}.o.weight").T.reshape(h, d, e)
        return p

    def mlp(self, prefix: str, config: T5Config) -> dict[str, np.ndarray]:
        names = ["wi"] if len(config.mlp_activations) == 1 else ["wi_0", "wi_1"]
        return {n: self.take(f"{prefix}.{n}.weight").T for n in names + ["wo"]}


_IGNORED = (
    "encoder.embed_tokens.weight",
    "decoder.embed_tokens.weight",
    "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",
)


def from_hf_state_dict(tensors: dict[str, np.ndarray], config: T5Config, lm_head_scale: float = 1.0) -> dict[str, Any]:
    """A transformers T5 state dict as our (unboxed) params tree; an untied `lm_head` is
    multiplied by `lm_head_scale` (the rescale of the decoder output, folded in)."""
    r = _Reader(tensors)
    for k in _IGNORED:
        r.tensors.pop(k, None)
    shared = r.take("shared.weight")
    enc: dict[str, Any] = {
        "relpos_bias": {
            "rel_embedding": r.take("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight").T
        }
    }
    dec: dict[str, Any] = {
        "relpos_bias": {
            "rel_embedding": r.take("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight").T
        }
    }
    for i in range(config.num_encoder_layers):
        b = f"encoder.block.{i}.layer"
        enc[f"layers_{i}"] = {
            "pre_attention_layer_norm": {"scale": r.take(f"{b}.0.layer_norm.weight")},
            "attention": r.attention(f"{b}.0.SelfAttention", config),
            "pre_mlp_layer_norm": {"scale": r.take(f"{b}.1.layer_norm.weight")},
            "mlp": r.mlp(f"{b}.1.DenseReluDense", config),
        }
    for i in range(config.num_decoder_layers):
        b = f"decoder.block.{i}.layer"
        dec[f"layers_{i}"] = {
            "pre_self_attention_layer_norm": {"scale": r.take(f"{b}.0.layer_norm.weight")},
            "self_attention": r.attention(f"{b}.0.SelfAttention", config),
            "pre_cross_attention_layer_norm": {"scale": r.take(f"{b}.1.layer_norm.weight")},
            "encoder_decoder_attention": r.attention(f"{b}.1.EncDecAttention", config),
            "pre_mlp_layer_norm": {"scale": r.take(f"{b}.2.layer_norm.weight")},
            "mlp": r.mlp(f"{b}.2.DenseReluDense", config),
        }
    enc["encoder_norm"] = {"scale": r.take("encoder.final_layer_norm.weight")}
    dec["decoder_norm"] = {"scale": r.take("decoder.final_layer_norm.weight")}
    lm_head = r.tensors.pop("lm_head.weight", None)
    if config.logits_via_embedding:
        if lm_head is not None and not np.array_equal(lm_head, shared):
            raise HFInterchangeError(
                "config ties the logits to the embedding (logits_via_embedding) "
                "but the checkpoint's lm_head.weight differs from shared.weight"
            )
    else:
        if lm_head is None:
            raise HFInterchangeError(
                "config has untied logits (logits_via_embedding false) but the checkpoint "
                "has no lm_head.weight (its logits are tied to shared.weight)"
            )
        dec["logits"] = np.asarray(lm_head, np.float32).T * np.float32(lm_head_scale)
    if r.tensors:
        raise HFInterchangeError(f"checkpoint has tensors with no place in the model: {sorted(r.tensors)[:10]}")
    if config.scan_layers:
        enc = stack_layers(enc, config.num_encoder_layers)
        dec = stack_layers(dec, config.num_decoder_layers)
    params = {"token_embedder": {"embedding": shared}, "encoder": enc, "decoder": dec}
    return jax.tree_util.tree_map(np.ascontiguousarray, params)


def export_hf(params: Any, config: T5Config, directory: str) -> str:
    """Writes `config.json` and `model.safetensors` for transformers into `directory` (local or
    a URL such as `gs://bucket/export`; each file written whole, atomically)."""
    from safetensors.numpy import save  # lazy: optional dependency

    tensors = to_hf_state_dict(params, config)
    storage.write_bytes(storage.join(directory, WEIGHTS_FILE), save(tensors, metadata={"format": "pt"}))
    storage.write_text(storage.join(directory, CONFIG_FILE), json.dumps(hf_config(config), indent=2, sort_keys=True))
    return directory


def _files(directory: str, caller: str) -> tuple[str, str]:
    """The config and weights paths of `directory` (FileNotFoundError naming a missing one)."""
    config_path = storage.join(directory, CONFIG_FILE)
    weights_path = storage.join(directory, WEIGHTS_FILE)
    present = storage.sizes(directory)
    for path, name in ((config_path, CONFIG_FILE), (weights_path, WEIGHTS_FILE)):
        if name not in present:
            raise FileNotFoundError(f"{caller}: {path} does not exist (sharded checkpoints are not supported)")
    return config_path, weights_path


def config_from_hf_dir(directory: str, **overrides) -> T5Config:
    """The `T5Config` of a transformers T5/mT5 directory without loading its weights: its
    `config.json` and, for the tying, the safetensors header (and, when the file has an
    `lm_head.weight`, the bytes of it and of `shared.weight`)."""
    config_path, weights_path = _files(directory, "config_from_hf_dir")
    header = read_header(weights_path)
    tied = lm_head_tied(header.entries, lambda: header.same_tensor("lm_head.weight", "shared.weight"))
    return config_from_hf(storage.read_json(config_path), tied=tied, **overrides)


def import_hf(directory: str, **config_overrides) -> tuple[T5Config, dict[str, Any]]:
    """Reads a transformers T5/mT5 directory (local or a URL); returns `(config, params)`.

    `config_overrides` (e.g. `scan_layers=True`, `dtype='bfloat16'`) adjust the config.
    """
    from safetensors.numpy import load  # lazy: optional dependency

    config_path, weights_path = _files(directory, "import_hf")
    hf = storage.read_json(config_path)
    tensors = load(storage.read_bytes(weights_path))
    tied = lm_head_tied(tensors, lambda: np.array_equal(tensors["lm_head.weight"], tensors["shared.weight"]))
    config = config_from_hf(hf, tied=tied, **config_overrides)
    scale = hf["d_model"] ** -0.5 if not tied and scales_decoder_output(hf) else 1.0
    return config, from_hf_state_dict(tensors, config, lm_head_scale=scale)
