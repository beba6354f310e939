"""The MoE rows of models_bench.py: a float32 training step (AdamW) of a small Mixtral-shaped
model beside the dense Llama with the same active parameters, in the same run.

The MoE: `MOE` below (8 layers, emb 512, 8 experts of 1024 hidden units, top-2 token choice,
capacity factor 1.25, every layer routed). The dense peer: the same model with one SwiGLU MLP
of `top_k * 1024 = 2048` hidden units per layer, so a token meets as many MLP weights in both
(the router's `emb * experts` aside). MFU counts active FLOPs (`cairn.models.flops`: the router
and `top_k` experts per token; the capacity's slack and the dispatch/combine einsums are not
model FLOPs, so they show as lost MFU). The dropped share is `moe/dropped_fraction` of the
measured steps' batch (random tokens, so routing is near-uniform from the start). Target
(issue 23): the MoE step at most 1.5x the dense-active step.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from _llama_bench import cairn_train
from _timing import target_line

from cairn.models import DecoderOnlyModel, LlamaConfig, training_flops_per_step
from cairn.models.moe_config import MoeConfig

BATCH, LENGTH = 4, 256
EXPERT_MLP, EXPERTS, TOP_K, CAPACITY = 1024, 8, 2, 1.25
DENSE = LlamaConfig(
    vocab_size=8192, emb_dim=512, num_heads=8, num_kv_heads=4, head_dim=64, mlp_dim=TOP_K * EXPERT_MLP, num_layers=8
)
MOE = DENSE.replace(
    mlp_dim=EXPERT_MLP, moe=MoeConfig(num_experts=EXPERTS, top_k=TOP_K, capacity_factor=CAPACITY, every=1)
)
TARGET = 1.5  # MoE step / dense-active step, at most


def make_batch(vocab: int) -> dict[str, np.ndarray]:
    rows = np.random.default_rng(0).integers(2, vocab, (BATCH, LENGTH + 1)).astype(np.int32)
    return {
        "decoder_input_tokens": rows[:, :-1],
        "decoder_target_tokens": rows[:, 1:],
        "decoder_loss_weights": np.ones((BATCH, LENGTH), np.float32),
    }


def train(config: LlamaConfig, batch, steps: int) -> tuple[float, float, dict[str, float]]:
    """(median step s, compile s, last step's metrics): `_llama_bench.cairn_train`'s AdamW step."""
    model = DecoderOnlyModel(config, z_loss=0.0, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    s, compile_s, history = cairn_train(model, model.init(jax.random.PRNGKey(0)), batch, steps)
    return s, compile_s, history[-1]


def run(peak: float, steps: int) -> None:
    """Measures and prints the MoE-against-dense table (target and verdict included)."""
    batch = make_batch(DENSE.vocab_size)
    lengths = {"targets": LENGTH}
    rows = []
    for name, config in (("dense (active-equal)", DENSE), (f"moe {EXPERTS}x top-{TOP_K}, cf {CAPACITY}", MOE)):
        s, compile_s, metrics = train(config, batch, steps)
        rows.append((name, s, compile_s, training_flops_per_step(config, BATCH, lengths), metrics))
    print(
        f"MoE vs dense-active Llama: {DENSE.num_layers} layers, emb {DENSE.emb_dim}, "
        f"{EXPERTS} experts x {EXPERT_MLP} (top-{TOP_K}, capacity factor {CAPACITY}) vs one MLP of "
        f"{DENSE.mlp_dim}; batch {BATCH} x {LENGTH}, AdamW, float32; {os.cpu_count()} cores; "
        f"matmul peak {peak / 1e9:.1f} GFLOP/s"
    )
    print(f"{'':34}{'step s':>8}{'tokens/s':>10}{'GFLOP':>8}{'MFU':>7}{'dropped':>9}{'compile s':>11}")
    tokens = BATCH * LENGTH
    for name, s, compile_s, flops, metrics in rows:
        dropped = metrics.get("moe/dropped_fraction")
        drop = "-" if dropped is None else f"{dropped:.1%}"
        print(f"{name:34}{s:8.2f}{tokens / s:10.0f}{flops / 1e9:8.1f}{flops / s / peak:7.1%}{drop:>9}{compile_s:11.1f}")
    ratio = rows[1][1] / rows[0][1]
    print(f"{'moe / dense step':34}{ratio:7.2f}x")
    # A ratio where lower is better: the verdict holds when dense/moe >= 1/TARGET.
    print(target_line("dense-active step / moe step", 1 / ratio, 1 / TARGET))
