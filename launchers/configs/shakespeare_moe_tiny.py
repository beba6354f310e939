"""A tiny mixture-of-experts Llama on the decoder-only Shakespeare task of
`shakespeare_llama_tiny`: the same width and attention, each layer's SwiGLU MLP replaced by 4
experts of half its hidden size with top-2 routing (the active MLP compute of the dense
model), Switch's load-balancing loss and ST-MoE's router z-loss; ends by continuing prompts:

    ./bazelw run //launchers:train -- --config=launchers/configs/shakespeare_moe_tiny.py

The routing metrics (`moe/load_balance_loss`, `moe/router_z_loss`, `moe/dropped_fraction`,
`moe/aux_loss`) are in metrics.jsonl and TensorBoard, balance and drops on the progress line.
On 8 devices `--config.partitioning.mesh.expert=4` puts one expert per device pair (expert
parallelism; the batch is split over data x expert).
"""

from cairn.launchers import config_base


def get_config():
    config = config_base.base_config()
    config.experiment = "shakespeare_moe_tiny"
    config_base.shakespeare(config, __file__, "shakespeare_lm")
    config.model.kind = "llama"
    config.model.preset = "llama_tiny"
    # shakespeare_llama_tiny's width (128, 4 heads of 32, 2 key/value heads, 2 layers).
    config.model.overrides = {"emb_dim": 128, "head_dim": 32, "mlp_dim": 256, "num_kv_heads": 2}
    config.model.moe.num_experts = 4
    config.model.moe.top_k = 2
    config.model.moe.expert_mlp_dim = 128
    config.model.moe.capacity_factor = 1.25
    config.model.moe.jitter_noise = 0.01
    config.data.sequence_length = {"targets": 64}
    config.data.batch_size = 32
    config_base.tiny_run(config, steps=600, learning_rate=3e-3)
    config.eval.num_examples = 32
    config.post_training.prompts = ("ROMEO. O, she doth teach", "To be, or not to be")
    config.post_training.max_decode_length = 24
    config.post_training.decode_method = "sample"
    config.post_training.temperature = 0.8
    config.post_training.top_k = 40
    return config
