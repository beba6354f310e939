"""Import and export transformers `LlamaForCausalLM` and `MixtralForCausalLM` checkpoints (see
`hf_config` for config.json).

A directory holds `config.json` and either `model.safetensors` or shards
`model-0000i-of-0000n.safetensors` listed by `model.safetensors.index.json` (its
`weight_map`). Tensors are torch-layout (`Linear.weight` is `[out, in]`); float32, float16
and bfloat16 files are read (into float32) by Cairn's own safetensors reader, so neither torch
nor the safetensors package is needed. transformers applies RoPE in the rotate-half layout,
as `llama.rope` does, so the q/k projections map by reshape alone, with no permutation.
A tied checkpoint (`tie_word_embeddings`) has no `lm_head.weight`.

Mixtral's experts are stored per expert, as transformers writes them:
`model.layers.{i}.block_sparse_moe.gate.weight` `[experts, hidden]` (the router),
`block_sparse_moe.experts.{e}.w1.weight` (gate) and `w3` (up) `[intermediate, hidden]`, `w2`
(down) `[hidden, intermediate]`. The fused layout transformers 5 holds in memory
(`mlp.gate.weight`, `mlp.experts.gate_up_proj` `[experts, 2 * intermediate, hidden]`, gate rows
first, `mlp.experts.down_proj` `[experts, hidden, intermediate]`) is read too; export writes the
per-expert one.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from cairn import storage
from cairn.models.hf_files import CONFIG_FILE, WEIGHTS_FILE, HFInterchangeError
from cairn.models.llama.config import LlamaConfig
from cairn.models.llama.hf_config import config_from_hf, hf_config
from cairn.models.moe_config import MoeConfig
from cairn.models.stacking import stack_layers, unstack_layers

INDEX_FILE = "model.safetensors.index.json"
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": jnp.bfloat16, "F64": np.float64}
_IGNORED_SUFFIX = "rotary_emb.inv_freq"  # written by some transformers 4 versions; recomputed here


def _parse_safetensors(data: bytes, name: str) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file's bytes, as float32 numpy arrays."""
    if len(data) < 8:
        raise HFInterchangeError(f"{name} is not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8 : 8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HFInterchangeError(f"{name} is not a safetensors file (header: {e})") from None
    header.pop("__metadata__", None)
    out = {}
    for key, entry in header.items():
        if entry["dtype"] not in _DTYPES:
            raise HFInterchangeError(
                f"{name}: tensor {key!r} has dtype {entry['dtype']} (supported: {sorted(_DTYPES)})"
            )
        begin, end = entry["data_offsets"]
        dtype = np.dtype(_DTYPES[entry["dtype"]])
        raw = np.frombuffer(data, dtype, (end - begin) // dtype.itemsize, 8 + n + begin)
        out[key] = raw.reshape(entry["shape"]).astype(np.float32)
    return out


def _shard_files(directory: str, caller: str) -> list[str]:
    """The weight files of `directory`: `model.safetensors`, or the shards its index names."""
    present = storage.sizes(directory)
    if CONFIG_FILE not in present:
        raise FileNotFoundError(f"{caller}: {storage.join(directory, CONFIG_FILE)} does not exist")
    if WEIGHTS_FILE in present:
        return [WEIGHTS_FILE]
    if INDEX_FILE in present:
        weight_map = storage.read_json(storage.join(directory, INDEX_FILE)).get("weight_map") or {}
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if f not in present]
        if not files or missing:
            raise HFInterchangeError(f"{caller}: {INDEX_FILE} of {directory} names missing shards {missing or files}")
        return files
    raise FileNotFoundError(f"{caller}: {directory} has neither {WEIGHTS_FILE} nor {INDEX_FILE}")


def config_from_hf_dir(directory: str, **overrides: Any) -> LlamaConfig:
    """The `LlamaConfig` of a transformers Llama or Mixtral directory, from its `config.json` (the weights
    are not read; `import_hf` checks their shapes)."""
    _shard_files(directory, "config_from_hf_dir")
    return config_from_hf(storage.read_json(storage.join(directory, CONFIG_FILE)), **overrides)


def _layer_shapes(c: LlamaConfig) -> dict[str, tuple[int, ...]]:
    e, h, kv, d, m = c.emb_dim, c.num_heads, c.num_kv_heads, c.head_dim, c.mlp_dim
    return {
        "input_layernorm": (e,),
        "post_attention_layernorm": (e,),
        "self_attn.q_proj": (h * d, e),
        "self_attn.k_proj": (kv * d, e),
        "self_attn.v_proj": (kv * d, e),
        "self_attn.o_proj": (e, h * d),
        "mlp.gate_proj": (m, e),
        "mlp.up_proj": (m, e),
        "mlp.down_proj": (e, m),
    }


class _Reader:
    """Pops tensors, naming a missing one or one whose shape disagrees with config.json."""

    def __init__(self, tensors: dict[str, np.ndarray]):
        self.tensors = {k: v for k, v in tensors.items() if not k.endswith(_IGNORED_SUFFIX)}

    def take(self, key: str, shape: tuple[int, ...]) -> np.ndarray:
        if key not in self.tensors:
            raise HFInterchangeError(f"checkpoint has no tensor {key!r}")
        w = np.asarray(self.tensors.pop(key), np.float32)
        if w.shape != shape:
            raise HFInterchangeError(f"tensor {key!r} has shape {list(w.shape)}, config.json implies {list(shape)}")
        return w


def _dense_mlp(w: Any) -> dict[str, Any]:
    return {
        "wi_0": {"kernel": w("mlp.gate_proj").T},
        "wi_1": {"kernel": w("mlp.up_proj").T},
        "wo": {"kernel": w("mlp.down_proj").T},
    }


def _experts(r: _Reader, i: int, c: LlamaConfig, moe: MoeConfig) -> dict[str, Any]:
    """Layer `i`'s Mixtral MLP (per-expert or fused layout) as `MoeMlp` params."""
    n, e, m = moe.num_experts, c.emb_dim, moe.mlp_dim(c.mlp_dim)
    b = f"model.layers.{i}"
    if f"{b}.mlp.gate.weight" in r.tensors and f"{b}.block_sparse_moe.gate.weight" not in r.tensors:
        router = r.take(f"{b}.mlp.gate.weight", (n, e))
        gate_up = r.take(f"{b}.mlp.experts.gate_up_proj", (n, 2 * m, e)).transpose(0, 2, 1)
        gate, up = gate_up[..., :m], gate_up[..., m:]
        down = r.take(f"{b}.mlp.experts.down_proj", (n, e, m)).transpose(0, 2, 1)
    else:
        router = r.take(f"{b}.block_sparse_moe.gate.weight", (n, e))

        def stacked(name: str, shape: tuple[int, int]) -> np.ndarray:
            return np.stack([r.take(f"{b}.block_sparse_moe.experts.{x}.{name}.weight", shape).T for x in range(n)])

        gate, up, down = stacked("w1", (m, e)), stacked("w3", (m, e)), stacked("w2", (e, m))
    return {
        "router": {"kernel": router.T},
        "wi_0": {"kernel": gate},
        "wi_1": {"kernel": up},
        "wo": {"kernel": down},
    }


def from_hf_state_dict(tensors: dict[str, np.ndarray], config: LlamaConfig) -> dict[str, Any]:
    """A transformers Llama or Mixtral (`config.moe` set) state dict as the (unboxed) params
    tree of `Llama`."""
    c, r = config, _Reader(tensors)
    e, h, kv, d, v = c.emb_dim, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size
    shapes = _layer_shapes(c)
    embedding = r.take("model.embed_tokens.weight", (v, e))
    params: dict[str, Any] = {"token_embedder": {"embedding": embedding}}
    for i in range(c.num_layers):

        def w(name: str, i: int = i) -> np.ndarray:
            return r.take(f"model.layers.{i}.{name}.weight", shapes[name])

        params[f"layers_{i}"] = {
            "pre_attention_norm": {"scale": w("input_layernorm")},
            "attention": {
                "query": {"kernel": w("self_attn.q_proj").T.reshape(e, h, d)},
                "key": {"kernel": w("self_attn.k_proj").T.reshape(e, kv, d)},
                "value": {"kernel": w("self_attn.v_proj").T.reshape(e, kv, d)},
                "out": {"kernel": w("self_attn.o_proj").T.reshape(h, d, e)},
            },
            "pre_mlp_norm": {"scale": w("post_attention_layernorm")},
            "mlp": _experts(r, i, c, c.moe) if c.moe and c.moe.is_sparse(i) else _dense_mlp(w),
        }
    params["decoder_norm"] = {"scale": r.take("model.norm.weight", (e,))}
    if c.tie_word_embeddings:
        if "lm_head.weight" in r.tensors and not np.array_equal(r.take("lm_head.weight", (v, e)), embedding):
            raise HFInterchangeError(
                "config.json ties the embeddings (tie_word_embeddings) but lm_head.weight differs from "
                "model.embed_tokens.weight"
            )
    else:
        params["logits"] = {"kernel": r.take("lm_head.weight", (v, e)).T}
    if r.tensors:
        raise HFInterchangeError(f"checkpoint has tensors with no place in the model: {sorted(r.tensors)[:10]}")
    if c.scan_layers:
        params = stack_layers(params, c.num_layers)
    return jax.tree_util.tree_map(np.ascontiguousarray, params)


def to_hf_state_dict(params: Any, config: LlamaConfig) -> dict[str, np.ndarray]:
    """Our params (boxed or not, scanned or not) as a transformers Llama state dict, or with
    `config.moe` a Mixtral one in the per-expert layout (float32)."""
    p = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), nn.meta.unbox(params))
    p = unstack_layers(p.get("params", p), config.num_layers)
    e, h, kv, d = config.emb_dim, config.num_heads, config.num_kv_heads, config.head_dim
    out = {"model.embed_tokens.weight": p["token_embedder"]["embedding"]}
    for i in range(config.num_layers):
        lp, b = p[f"layers_{i}"], f"model.layers.{i}"
        att, mlp = lp["attention"], lp["mlp"]
        out[f"{b}.input_layernorm.weight"] = lp["pre_attention_norm"]["scale"]
        out[f"{b}.self_attn.q_proj.weight"] = att["query"]["kernel"].reshape(e, h * d).T
        out[f"{b}.self_attn.k_proj.weight"] = att["key"]["kernel"].reshape(e, kv * d).T
        out[f"{b}.self_attn.v_proj.weight"] = att["value"]["kernel"].reshape(e, kv * d).T
        out[f"{b}.self_attn.o_proj.weight"] = att["out"]["kernel"].reshape(h * d, e).T
        out[f"{b}.post_attention_layernorm.weight"] = lp["pre_mlp_norm"]["scale"]
        if config.moe is None or not config.moe.is_sparse(i):
            out[f"{b}.mlp.gate_proj.weight"] = mlp["wi_0"]["kernel"].T
            out[f"{b}.mlp.up_proj.weight"] = mlp["wi_1"]["kernel"].T
            out[f"{b}.mlp.down_proj.weight"] = mlp["wo"]["kernel"].T
            continue
        out[f"{b}.block_sparse_moe.gate.weight"] = mlp["router"]["kernel"].T
        for x in range(config.moe.num_experts):
            out[f"{b}.block_sparse_moe.experts.{x}.w1.weight"] = mlp["wi_0"]["kernel"][x].T
            out[f"{b}.block_sparse_moe.experts.{x}.w2.weight"] = mlp["wo"]["kernel"][x].T
            out[f"{b}.block_sparse_moe.experts.{x}.w3.weight"] = mlp["wi_1"]["kernel"][x].T
    out["model.norm.weight"] = p["decoder_norm"]["scale"]
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = p["logits"]["kernel"].T
    return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}


def _shards(tensors: dict[str, np.ndarray], max_shard_bytes: int | None) -> list[dict[str, np.ndarray]]:
    """Tensors in order, packed into shards of at most `max_shard_bytes` (a larger tensor alone)."""
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for key, w in tensors.items():
        if max_shard_bytes is not None and shards[-1] and size + w.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = w
        size += w.nbytes
    return shards


def export_hf(
    params: Any,
    config: LlamaConfig,
    directory: str,
    *,
    max_shard_bytes: int | None = None,
    max_position_embeddings: int | None = None,
) -> str:
    """Writes `config.json` (transformers 5 layout; Mixtral when `config.moe` is set, see
    `hf_config.hf_config` for what is refused) and the weights (float32) into `directory`
    (local or a URL): `model.safetensors`, or, when they exceed `max_shard_bytes`, shards
    `model-0000i-of-0000n.safetensors` with `model.safetensors.index.json`."""
    from safetensors.numpy import save  # lazy: optional dependency

    if max_shard_bytes is not None and max_shard_bytes < 1:
        raise ValueError(f"export_hf: max_shard_bytes must be >= 1, got {max_shard_bytes}")
    text = json.dumps(hf_config(config, max_position_embeddings), indent=2, sort_keys=True)  # refuses first
    tensors = to_hf_state_dict(params, config)
    shards = _shards(tensors, max_shard_bytes)
    if len(shards) == 1:
        storage.write_bytes(storage.join(directory, WEIGHTS_FILE), save(tensors, metadata={"format": "pt"}))
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            storage.write_bytes(storage.join(directory, name), save(shard, metadata={"format": "pt"}))
            weight_map.update({k: name for k in shard})
        index = {"metadata": {"total_size": sum(w.nbytes for w in tensors.values())}, "weight_map": weight_map}
        storage.write_text(storage.join(directory, INDEX_FILE), json.dumps(index, indent=2, sort_keys=True))
    storage.write_text(storage.join(directory, CONFIG_FILE), text)
    return directory


def import_hf(directory: str, **config_overrides: Any) -> tuple[LlamaConfig, dict[str, Any]]:
    """Reads a transformers Llama or Mixtral directory (local or a URL); returns `(config, params)`.
    `config_overrides` (e.g. `scan_layers=True`, `dtype='bfloat16'`) adjust the config."""
    files = _shard_files(directory, "import_hf")
    config = config_from_hf(storage.read_json(storage.join(directory, CONFIG_FILE)), **config_overrides)
    tensors: dict[str, np.ndarray] = {}
    for name in files:
        tensors.update(_parse_safetensors(storage.read_bytes(storage.join(directory, name)), name))
    return config, from_hf_state_dict(tensors, config)
