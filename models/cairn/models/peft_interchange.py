"""Hugging Face PEFT LoRA adapters to and from Cairn's (`cairn.models.lora`), for the models
whose base weights `llama.hf` (Llama, Mixtral) and `t5.hf` (T5) exchange.

A PEFT adapter directory holds `adapter_config.json` (PEFT's `LoraConfig`: `r`, `lora_alpha`,
`target_modules`, ...) and `adapter_model.safetensors`, whose tensors are named
`base_model.model.<module>.lora_A.weight` `[r, in]` and `...lora_B.weight` `[out, r]` (torch
`Linear` layout, `<module>` a transformers module name); the update of the module's weight is
`(lora_alpha / r) * lora_B @ lora_A`. A Cairn adapter of a kernel `[in..., out...]` is
`lora_a` `[in..., r]` and `lora_b` `[r, out...]` with the update `(alpha / rank) * A @ B`, so
`lora_A = A.reshape(in, r).T` and `lora_B = B.reshape(r, out).T` (the transposes of
`llama.hf`'s kernels), one per layer of a scanned stack and per expert of a routed MLP.

Which module each Cairn kernel is (`_slots`): Llama's `attention/{query,key,value,out}` are
`self_attn.{q,k,v,o}_proj`, its MLP `wi_0`, `wi_1`, `wo` are `mlp.{gate,up,down}_proj`;
Mixtral's experts are written per expert, `block_sparse_moe.experts.{x}.{w1,w3,w2}`, the layout
`export_hf` writes (peft 0.21 converts it onto transformers 5's fused experts, as it does for
the base weights: `gate_up_proj` at rank `2 r` with `alpha` doubled); T5's attention is
`SelfAttention` / `EncDecAttention` `{q,k,v,o}` and its MLP `DenseReluDense.{wi,wi_0,wi_1,wo}`.
A Cairn target with no module (Mixtral's router, the embedding, the logits) is refused.

Import reads both Mixtral layouts: the per-expert one and transformers 5's fused one that peft
saves for `target_parameters` (`mlp.experts.gate_up_proj` / `down_proj`: `lora_A`
`[experts * r, in]` expert-major, `lora_B` `[out, r * experts]` expert-minor; the gate rows of
`gate_up_proj` are `wi_0`'s). `rank_pattern` and `alpha_pattern` are read: Cairn has one rank
and one scale, so every adapter is zero-padded to the largest rank and its own scale folded
into `lora_b` (the update is unchanged). A kernel kind adapted in some layers only gets zero
adapters in the others (a scanned stack needs them all). What Cairn does not compute is refused
with a `PeftInterchangeError` naming the field: `use_dora`, `use_rslora`, `bias`, `lora_bias`,
`modules_to_save`, `fan_in_fan_out`, `layers_to_transform` (the weights say which layers),
initialisations that change the base weights (`init_lora_weights` "pissa", "olora", "corda",
"loftq", ...), other PEFT methods (`peft_type`), and tensors of modules it cannot map.

`lora_dropout` becomes Cairn's `dropout` both ways (training only; Cairn drops rows of `A`, PEFT
drops input features per token). peft refuses dropout on Mixtral's fused experts, so an export
with expert adapters writes `lora_dropout` 0.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util

from cairn import storage
from cairn.models.hf_files import HFInterchangeError
from cairn.models.llama.config import LlamaConfig
from cairn.models.lora import A, B, LoraConfig
from cairn.models.stacking import stack_layers, unstack_layers
from cairn.models.t5.config import T5Config

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
# Fields whose PEFT value changes what the adapter computes and that Cairn does not implement:
# field -> the values Cairn can take (absent fields are PEFT's defaults, all of which it can).
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "use_dora": (False, None),
    "use_rslora": (False, None),
    "bias": ("none", None),
    "lora_bias": (False, None),
    "modules_to_save": (None, ()),
    "fan_in_fan_out": (False, None),
    "layers_to_transform": (None, ()),
    "layer_replication": (None, ()),
    "trainable_token_indices": (None,),
    "megatron_config": (None,),
    "use_qalora": (False, None),
    "alora_invocation_tokens": (None,),
    "arrow_config": (None,),
}
# init_lora_weights values that leave the base weights as they are (others rewrite them).
_PLAIN_INITS = (True, False, None, "gaussian", "eva", "orthogonal")


class PeftInterchangeError(HFInterchangeError):
    """A PEFT adapter (or a Cairn LoRA) that cannot be mapped; the message names the field."""


@dataclasses.dataclass(frozen=True)
class _Slot:
    """A kernel Cairn may adapt: its path in unscanned params, the transformers module (with
    `{x}` for the expert of a routed MLP), the kernel's input and output axes, and its experts."""

    path: tuple[str, ...]
    module: str
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    experts: int = 0

    def modules(self) -> list[str]:
        return [self.module.format(x=x) for x in range(self.experts)] if self.experts else [self.module]


_Kernels = list[tuple[str, str, tuple[int, ...], tuple[int, ...]]]  # (ours, theirs, in axes, out axes)


def _llama_slots(c: LlamaConfig) -> list[_Slot]:
    e, h, kv, d, m = c.emb_dim, c.num_heads, c.num_kv_heads, c.head_dim, c.mlp_dim
    attention: _Kernels = [("query", "q", (e,), (h, d)), ("key", "k", (e,), (kv, d)), ("value", "v", (e,), (kv, d))]
    attention.append(("out", "o", (h, d), (e,)))
    dense: _Kernels = [("wi_0", "gate", (e,), (m,)), ("wi_1", "up", (e,), (m,)), ("wo", "down", (m,), (e,))]
    slots = []
    for i in range(c.num_layers):
        layer, b = f"layers_{i}", f"model.layers.{i}"
        for ours, theirs, ins, outs in attention:
            slots.append(_Slot((layer, "attention", ours, "kernel"), f"{b}.self_attn.{theirs}_proj", ins, outs))
        if c.moe is not None and c.moe.is_sparse(i):
            em = c.moe.mlp_dim(m)
            experts: _Kernels = [("wi_0", "w1", (e,), (em,)), ("wi_1", "w3", (e,), (em,)), ("wo", "w2", (em,), (e,))]
            for ours, theirs, ins, outs in experts:
                module = f"{b}.block_sparse_moe.experts.{{x}}.{theirs}"
                slots.append(_Slot((layer, "mlp", ours, "kernel"), module, ins, outs, c.moe.num_experts))
        else:
            for ours, theirs, ins, outs in dense:
                slots.append(_Slot((layer, "mlp", ours, "kernel"), f"{b}.mlp.{theirs}_proj", ins, outs))
    return slots


def _t5_slots(c: T5Config) -> list[_Slot]:
    e, h, d, m = c.emb_dim, c.num_heads, c.head_dim, c.mlp_dim
    qkvo: _Kernels = [("query", "q", (e,), (h, d)), ("key", "k", (e,), (h, d)), ("value", "v", (e,), (h, d))]
    qkvo.append(("out", "o", (h, d), (e,)))
    gated = len(c.mlp_activations) > 1
    mlp: _Kernels = [(n, n, (e,), (m,)) for n in (("wi_0", "wi_1") if gated else ("wi",))]
    mlp.append(("wo", "wo", (m,), (e,)))
    decoder_attention = (("self_attention", "0.SelfAttention"), ("encoder_decoder_attention", "1.EncDecAttention"))
    stacks = (
        ("encoder", c.num_encoder_layers, (("attention", "0.SelfAttention"),), "1"),
        ("decoder", c.num_decoder_layers, decoder_attention, "2"),
    )
    slots = []
    for stack, n, attentions, mlp_layer in stacks:
        for i in range(n):
            path, b = (stack, f"layers_{i}"), f"{stack}.block.{i}.layer"
            for ours, theirs in attentions:
                for name, short, ins, outs in qkvo:
                    slots.append(_Slot(path + (ours, name), f"{b}.{theirs}.{short}", ins, outs))
            for name, _, ins, outs in mlp:
                slots.append(_Slot(path + ("mlp", name), f"{b}.{mlp_layer}.DenseReluDense.{name}", ins, outs))
    return slots


def _slots(config: Any) -> list[_Slot]:
    if isinstance(config, LlamaConfig):
        return _llama_slots(config)
    if isinstance(config, T5Config):
        return _t5_slots(config)
    raise PeftInterchangeError(
        f"PEFT interchange covers Llama, Mixtral and T5 (the families with a Hugging Face export), "
        f"not {type(config).__name__}"
    )


def _stacks(config: Any) -> dict[tuple[str, ...], int]:
    """The layer stacks of a params tree: their path (`()` the root) and number of layers."""
    if isinstance(config, T5Config):
        return {("encoder",): config.num_encoder_layers, ("decoder",): config.num_decoder_layers}
    return {(): config.num_layers}


def _plain(tree: Any) -> Any:
    if isinstance(tree, Mapping):
        return {k: _plain(v) for k, v in tree.items()}
    return np.asarray(tree, np.float32)


def _unscanned(adapters: Any, config: Any) -> dict[tuple[str, ...], np.ndarray]:
    """The flat adapters (float32 numpy) with every scanned stack unstacked into `layers_i`."""
    tree = _plain(nn.meta.unbox(adapters))
    for path, n in _stacks(config).items():
        if path == ():
            tree = unstack_layers(tree, n)
        elif path[0] in tree:
            tree[path[0]] = unstack_layers(tree[path[0]], n)
    return traverse_util.flatten_dict(tree)


def _key(module: str, factor: str) -> str:
    return f"{PREFIX}{module}.lora_{factor}.weight"


def to_peft_state_dict(adapters: Any, config: Any) -> dict[str, np.ndarray]:
    """Cairn adapters (boxed or not, scanned or not) of a model of `config` as PEFT's tensors
    (float32, the module docstring's names and layouts). `PeftInterchangeError` names an
    adapted kernel with no transformers module."""
    flat = _unscanned(adapters, config)
    slots = {s.path: s for s in _slots(config)}
    out: dict[str, np.ndarray] = {}
    for kernel in sorted({k[:-1] for k in flat}):
        slot = slots.get(kernel)
        if slot is None:
            raise PeftInterchangeError(
                f"the LoRA target {'/'.join(kernel)!r} has no PEFT module (PEFT adapts the attention "
                "and MLP projections; leave it out of model.lora.targets)"
            )
        a, b = flat[kernel + (A,)], flat[kernel + (B,)]
        rank = a.shape[-1]
        per_module = [(a[x], b[x]) for x in range(slot.experts)] if slot.experts else [(a, b)]
        for module, (ax, bx) in zip(slot.modules(), per_module):
            out[_key(module, "A")] = np.ascontiguousarray(ax.reshape(-1, rank).T)
            out[_key(module, "B")] = np.ascontiguousarray(bx.reshape(rank, -1).T)
    return out


def _target_modules(adapted: list[str], config: Any) -> list[str]:
    """PEFT's `target_modules` for these adapted modules: their last names when those select
    exactly them among the model's mappable modules, else the full names."""
    every = [m for s in _slots(config) for m in s.modules()]
    names = {m.rsplit(".", 1)[-1] for m in adapted}
    if {m for m in every if m.rsplit(".", 1)[-1] in names} == set(adapted):
        return sorted(names)
    return sorted(adapted)


def peft_config(
    lora: LoraConfig, config: Any, adapted: list[str], base_model_name_or_path: str | None = None
) -> dict[str, Any]:
    """The `adapter_config.json` dict of a Cairn LoRA whose adapted modules are `adapted`."""
    experts = any(".experts." in m for m in adapted)
    return {
        "peft_type": "LORA",
        "task_type": None if isinstance(config, T5Config) else "CAUSAL_LM",  # module docstring
        "base_model_name_or_path": base_model_name_or_path,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": 0.0 if experts else lora.dropout,
        "target_modules": _target_modules(adapted, config),
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }


def export_peft(
    adapters: Any, lora: LoraConfig, config: Any, directory: str, *, base_model_name_or_path: str | None = None
) -> str:
    """Writes Cairn adapters (of a model of `config`, trained with `lora`) into `directory` (local
    or a URL) as a PEFT adapter: `adapter_config.json` and `adapter_model.safetensors`, which peft
    loads onto the transformers model `export_hf` writes from the same base params
    (`PeftModel.from_pretrained(model, directory)`). `base_model_name_or_path` is recorded for
    PEFT (e.g. the base's export directory)."""
    from safetensors.numpy import save  # lazy: optional dependency

    tensors = to_peft_state_dict(adapters, config)
    adapted = sorted({k[len(PREFIX) : -len(".lora_A.weight")] for k in tensors if k.endswith(".lora_A.weight")})
    text = json.dumps(peft_config(lora, config, adapted, base_model_name_or_path), indent=2, sort_keys=True)
    storage.write_bytes(storage.join(directory, ADAPTER_WEIGHTS_FILE), save(tensors, metadata={"format": "pt"}))
    storage.write_text(storage.join(directory, ADAPTER_CONFIG_FILE), text)
    return directory


def check_peft_config(peft: Mapping[str, Any]) -> None:
    """Refuses (`PeftInterchangeError`, naming the field) an `adapter_config.json` Cairn cannot
    compute: another method than LoRA, DoRA, rsLoRA, trained biases, extra trained modules, and
    the other fields of `_NEUTRAL`, or an initialisation that rewrites the base weights."""
    if peft.get("peft_type", "LORA") != "LORA":
        raise PeftInterchangeError(f"peft_type={peft.get('peft_type')!r} is not supported (Cairn has LoRA: 'LORA')")
    for field, neutral in _NEUTRAL.items():
        value = peft.get(field)
        value = tuple(value) if isinstance(value, list) else value
        if value not in neutral:
            raise PeftInterchangeError(
                f"{field}={peft.get(field)!r} is not supported by Cairn's LoRA (supported: {neutral[0]!r})"
            )
    init = peft.get("init_lora_weights", True)
    if init not in _PLAIN_INITS:
        raise PeftInterchangeError(
            f"init_lora_weights={init!r} is not supported (it rewrites the base weights, which Cairn's LoRA "
            "keeps as they are)"
        )
    for field in ("r", "lora_alpha"):
        value = peft.get(field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise PeftInterchangeError(f"{field}={value!r} must be a number > 0")
    dropout = peft.get("lora_dropout") or 0.0
    if not 0.0 <= dropout < 1.0:
        raise PeftInterchangeError(f"lora_dropout={dropout!r} must be in [0, 1)")


def _pattern_value(patterns: Mapping[str, Any] | None, names: list[str], default: float) -> float:
    """PEFT's `rank_pattern` / `alpha_pattern` lookup: the first key matching the end of a name."""
    for key, value in (patterns or {}).items():
        if any(re.match(rf"(.*\.)?({key})$", name) for name in names):
            return float(value)
    return float(default)


@dataclasses.dataclass
class _Factor:
    """One imported adapter before padding: `a` `[..., in, r]`, `b` `[..., r, out]`, its scale."""

    a: np.ndarray
    b: np.ndarray
    scale: float


def _modules(tensors: Mapping[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """`{module: {"A": lora_A, "B": lora_B}}` of PEFT tensors (the adapter name, if any, dropped);
    a tensor that is not a LoRA factor of a module is refused, naming it."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for key, w in tensors.items():
        match = re.fullmatch(r"(?:base_model\.model\.)?(.+)\.lora_([AB])(?:\.[^.]+)?\.weight", key)
        if match is None:
            raise PeftInterchangeError(f"adapter tensor {key!r} is not a LoRA factor Cairn can map (lora_A / lora_B)")
        out.setdefault(match.group(1), {})[match.group(2)] = np.asarray(w, np.float32)
    for module, pair in out.items():
        if set(pair) != {"A", "B"}:
            raise PeftInterchangeError(f"adapter module {module!r} has lora_{''.join(pair)} without its other factor")
    return out


def _fused_experts(
    module: str, pair: dict[str, np.ndarray], slots: dict[str, _Slot], scale_of: Any
) -> dict[tuple[str, ...], _Factor]:
    """A transformers 5 fused-experts adapter (`<layer>.mlp.experts[.base_layer]`) as Cairn's
    `wi_0` and `wi_1` (from `gate_up_proj`) or `wo` (from `down_proj`), told apart by shape."""
    match = re.fullmatch(r"(model\.layers\.\d+)\.mlp\.experts(?:\.base_layer)*", module)
    layer = match.group(1) if match else ""
    gate = slots.get(f"{layer}.block_sparse_moe.experts.{{x}}.w1")
    if gate is None:
        raise PeftInterchangeError(f"adapter module {module!r} has no kernel in the model (is it an expert layer?)")
    down, up = slots[f"{layer}.block_sparse_moe.experts.{{x}}.w2"], slots[f"{layer}.block_sparse_moe.experts.{{x}}.w3"]
    n, (e,), (m,) = gate.experts, gate.ins, gate.outs
    a, b = pair["A"], pair["B"]
    rank = a.shape[0] // n
    fits = a.ndim == b.ndim == 2 and a.shape[0] == n * rank == b.shape[1] and rank > 0
    if fits:
        a_x = a.reshape(n, rank, a.shape[-1]).transpose(0, 2, 1)  # [experts, in, r]
        b_x = b.reshape(b.shape[0], rank, n).transpose(2, 1, 0)  # [experts, r, out]
    if fits and a.shape[-1] == e and b.shape[0] == 2 * m:
        scale = scale_of([f"{layer}.mlp.experts.gate_up_proj", module], rank)
        return {gate.path: _Factor(a_x, b_x[..., :m], scale), up.path: _Factor(a_x, b_x[..., m:], scale)}
    if fits and a.shape[-1] == m and b.shape[0] == e:
        return {down.path: _Factor(a_x, b_x, scale_of([f"{layer}.mlp.experts.down_proj", module], rank))}
    raise PeftInterchangeError(
        f"adapter module {module!r} has lora_A {list(a.shape)} and lora_B {list(b.shape)}, which fit neither "
        f"gate_up_proj ({n} experts of [{2 * m}, {e}]) nor down_proj ([{e}, {m}])"
    )


def _target_pattern(path: tuple[str, ...]) -> str:
    """A `LoraConfig.targets` regex for a kernel kind, in every layer, scanned or not."""
    parts = [r"layers(_\d+)?" if re.fullmatch(r"layers_\d+", p) else re.escape(p) for p in path]
    return "(^|/)" + "/".join(parts) + "$"


def from_peft_state_dict(
    tensors: Mapping[str, np.ndarray], peft: Mapping[str, Any], config: Any
) -> tuple[LoraConfig, dict[str, Any]]:
    """PEFT tensors and their `adapter_config.json` dict as `(lora, adapters)` for a model of
    `config` (scanned or not, as it says): `lora.merge`, `LoraModel` and `export_peft` take them.
    Mismatched shapes, unmappable modules and unsupported fields are refused, named."""
    check_peft_config(peft)
    r0, alpha0 = float(peft["r"]), float(peft["lora_alpha"])
    slots = {s.module: s for s in _slots(config)}
    by_module = {m: s for s in slots.values() for m in s.modules()}

    def scale_of(names: list[str], rank: int) -> float:
        if _pattern_value(peft.get("rank_pattern"), names, r0) != rank:
            raise PeftInterchangeError(
                f"adapter module {names[-1]!r} has rank {rank}, but r / rank_pattern say "
                f"{_pattern_value(peft.get('rank_pattern'), names, r0):g}"
            )
        return _pattern_value(peft.get("alpha_pattern"), names, alpha0) / rank

    factors: dict[tuple[str, ...], _Factor] = {}
    experts: dict[tuple[str, ...], dict[int, _Factor]] = {}
    for module, pair in sorted(_modules(tensors).items()):
        if ".mlp.experts" in module and module not in by_module:
            factors.update(_fused_experts(module, pair, slots, scale_of))
            continue
        slot = by_module.get(module)
        if slot is None:
            raise PeftInterchangeError(
                f"adapter module {module!r} has no kernel Cairn adapts (it maps attention and MLP projections)"
            )
        a, b = pair["A"], pair["B"]
        n_in, n_out, rank = int(np.prod(slot.ins)), int(np.prod(slot.outs)), a.shape[0]
        if a.shape != (rank, n_in) or b.shape != (n_out, rank):
            raise PeftInterchangeError(
                f"adapter module {module!r} has lora_A {list(a.shape)} and lora_B {list(b.shape)}; "
                f"the model's {module} is [{n_out}, {n_in}]"
            )
        factor = _Factor(a.T.reshape(*slot.ins, rank), b.T.reshape(rank, *slot.outs), scale_of([module], rank))
        if slot.experts:
            experts.setdefault(slot.path, {})[int(module.split(".experts.")[1].split(".")[0])] = factor
        else:
            factors[slot.path] = factor
    for path, per_expert in experts.items():
        factors[path] = _stacked_experts(per_expert, next(s for s in slots.values() if s.path == path))
    if not factors:
        raise PeftInterchangeError("the adapter has no LoRA tensors")
    return _to_cairn(factors, peft, config, list(slots.values()))


def _stacked_experts(per_expert: dict[int, _Factor], slot: _Slot) -> _Factor:
    """Per-expert factors as one with a leading expert axis (a missing expert: zeros; scales
    that differ folded into each expert's B, the result's scale then 1)."""
    rank = max(f.a.shape[-1] for f in per_expert.values())
    scales = {f.scale for f in per_expert.values()}
    scale = scales.pop() if len(scales) == 1 else 1.0
    a = np.zeros((slot.experts, *slot.ins, rank), np.float32)
    b = np.zeros((slot.experts, rank, *slot.outs), np.float32)
    for x, f in per_expert.items():
        r = f.a.shape[-1]
        a[x, ..., :r] = f.a
        b[x, :r] = f.b * (f.scale / scale)
    return _Factor(a, b, scale)


def _to_cairn(
    factors: dict[tuple[str, ...], _Factor], peft: Mapping[str, Any], config: Any, slots: list[_Slot]
) -> tuple[LoraConfig, dict[str, Any]]:
    """One rank (the largest), one scale (the adapter's `lora_alpha / r` when every module has
    it, else 1 with each folded into B), zero adapters where a kind misses a layer; scanned
    stacks stacked."""
    rank = max(f.a.shape[-1] for f in factors.values())
    scales = {f.scale for f in factors.values()}
    scale = scales.pop() if len(scales) == 1 else 1.0
    kinds = {_target_pattern(p) for p in factors}
    flat: dict[tuple[str, ...], np.ndarray] = {}
    for slot in slots:
        if _target_pattern(slot.path) not in kinds:
            continue
        batch = (slot.experts,) if slot.experts else ()
        a = np.zeros((*batch, *slot.ins, rank), np.float32)
        b = np.zeros((*batch, rank, *slot.outs), np.float32)
        f = factors.get(slot.path)
        if f is not None:
            r = f.a.shape[-1]
            a[..., :r] = f.a
            b[(slice(None),) * len(batch) + (slice(0, r),)] = f.b * (f.scale / scale)
        flat[slot.path + (A,)], flat[slot.path + (B,)] = a, b
    tree = traverse_util.unflatten_dict(flat)
    if config.scan_layers:
        for path, n in _stacks(config).items():
            if path == ():
                tree = stack_layers(tree, n)
            elif path[0] in tree:
                tree[path[0]] = stack_layers(tree[path[0]], n)
    tree = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), tree)
    lora = LoraConfig(
        rank=rank, alpha=scale * rank, dropout=float(peft.get("lora_dropout") or 0.0), targets=tuple(sorted(kinds))
    )
    return lora, tree


def import_peft(directory: str, config: Any) -> tuple[LoraConfig, dict[str, Any]]:
    """Reads a PEFT LoRA adapter directory (local or a URL; saved by `peft`'s `save_pretrained`)
    for a model of `config` (`import_hf`'s of the base); returns `(lora, adapters)`: fold them
    into the base params with `cairn.models.lora.merge(params, adapters, lora)`, or train them on
    with `LoraModel(model, lora)`."""
    from safetensors.numpy import load  # lazy: optional dependency

    present = storage.sizes(directory)
    for name in (ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE):
        if name not in present:
            raise FileNotFoundError(f"import_peft: {storage.join(directory, name)} does not exist")
    peft = storage.read_json(storage.join(directory, ADAPTER_CONFIG_FILE))
    check_peft_config(peft)
    tensors = load(storage.read_bytes(storage.join(directory, ADAPTER_WEIGHTS_FILE)))
    return from_peft_state_dict(tensors, peft, config)
