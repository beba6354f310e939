"""Llama 3.2 1B-shaped pretraining on a pod: `--config=launchers/configs/llama_1b_pretrain.py`.

The `llama_1b` preset (16 layers, 2048 wide, 32 heads over 8 key/value heads, tied embeddings,
rope theta 500000 with llama3 scaling, vocab 128256) with bfloat16 compute (float32
parameters), scanned layers and full rematerialization; 4096-token packed rows, 512 rows a step
(2M tokens); AdamW with a cosine schedule (the decoder families' `pretrain_optimizer`);
parameters and optimizer state sharded over an 8-way `fsdp` axis (`partitioning.fsdp_rules`),
the rest of the devices data parallel.

Register a language-modelling task (tokenize, `reduce_concat_tokens` + `split_tokens` before
the cache, `random_crop` after it; see cairn/launchers/tasks/shakespeare.py) and pass
`--config.data.task_modules="('my_tasks',)" --config.data.task=my_lm
--config.vocabulary.path=/path/to/tokenizer.json` (Llama 3's tokenizer: 128256 ids, no sentinels).
"""

from cairn.launchers import config_base


def get_config():
    config = config_base.base_config()
    config_base.pretrain(config, "llama_1b", "llama", "my_lm", {"targets": 4096}, batch_size=512, steps=100000)
    config.vocabulary.kind = "tokenizer_json"
    config.vocabulary.extra_ids = 0
    config.model.vocab_size = 128256  # the preset's (Llama 3's tokenizer), not rounded up to 128
    config_base.bf16_scan_remat(config)
    config.partitioning.mesh = {"data": -1, "fsdp": 8, "model": 1}
    config.partitioning.fsdp_rules = True
    return config
