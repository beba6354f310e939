"""A mixture-of-experts Llama with about 1B active parameters, pretrained on a pod:
`--config=launchers/configs/moe_1b_pretrain.py`.

The `llama_1b` preset's attention, embeddings and depth (16 layers, 2048 wide, 32 heads over 8
key/value heads, tied embeddings, vocab 128256) with every MLP routed: 8 experts of 4096 hidden
units (SwiGLU), top-2 token choice (Mixtral's routing), capacity factor 1.25, Switch's
load-balancing loss (0.01) and ST-MoE's router z-loss (0.001). Two experts of 4096 do the work
of llama_1b's dense 8192-unit MLP, so a token meets ~1.24B parameters (as llama_1b) of ~3.65B
in all (8 x 25.2M expert parameters per layer).

bfloat16 compute (float32 parameters), scanned layers and full rematerialization; 2048-token
packed rows, 1024 rows a step (2M tokens); AdamW with a cosine schedule. The mesh is data x
fsdp 4 x expert 8: every expert's kernels live on one eighth of the expert axis (sharded over
fsdp within it, `partitioning.fsdp_rules`), the batch is split over data x fsdp x expert, and
the dispatch einsum moves each token to its experts' devices (an all-to-all over `expert`).
Routing groups are rows: the dispatch and combine tensors are `[rows, 2048, 8, 640]` per
device-local batch (~170 MB each in float32 at 4 rows a device, i.e. 256 chips), the reason
for 2048-token rows rather than llama_1b's 4096 (their size grows with the row length).

Register a language-modelling task and pass `--config.data.task_modules="('my_tasks',)"
--config.data.task=my_lm --config.vocabulary.path=/path/to/tokenizer.json` as for
llama_1b_pretrain.py; check the config for a slice with `//launchers:jobset` (64 chips or more).
"""

from cairn.launchers import config_base


def get_config():
    config = config_base.base_config()
    config_base.pretrain(config, "llama_1b", "llama", "my_lm", {"targets": 2048}, batch_size=1024, steps=100000)
    config.experiment = "moe_1b_pretrain"
    config.vocabulary.kind = "tokenizer_json"
    config.vocabulary.extra_ids = 0
    config.model.vocab_size = 128256  # the preset's (Llama 3's tokenizer), not rounded up to 128
    config.model.moe.num_experts = 8
    config.model.moe.top_k = 2
    config.model.moe.expert_mlp_dim = 4096
    config.model.moe.capacity_factor = 1.25
    config_base.bf16_scan_remat(config)
    config.partitioning.mesh = {"data": -1, "fsdp": 4, "expert": 8, "model": 1}
    config.partitioning.fsdp_rules = True
    return config
