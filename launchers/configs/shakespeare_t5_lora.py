"""LoRA of the default experiment's checkpoint on a second Shakespeare task: line completion.

First train the default experiment (its checkpoint is the frozen base), then, from the same
directory:

    ./bazelw run //launchers:train -- --config=launchers/configs/shakespeare_t5_tiny.py
    ./bazelw run //launchers:train -- --config=launchers/configs/shakespeare_t5_lora.py

Rank-8 adapters of every attention and MLP kernel (1.5 % of the base's parameters) learn to
complete a line of Shakespeare from its first half (`shakespeare_line_completion`): only they
train and have optimizer state; checkpoints hold them and `config.json` names the base. Another
base: `--config.init.checkpoint=PATH` (a model_dir or one of its checkpoints). model_dir:
runs/shakespeare_t5_lora.
"""

from cairn.launchers import config_base


def get_config():
    config = config_base.base_config()
    config.experiment = "shakespeare_t5_lora"
    config_base.shakespeare(config, __file__, "shakespeare_line_completion")
    config.model.kind = "encoder_decoder"
    config.model.preset = "t5_1_1_tiny"  # the base's
    config.init.checkpoint = "runs/shakespeare_t5_tiny"  # the default experiment's model_dir
    config.model.lora.rank = 8
    config.model.lora.alpha = 16.0
    config.data.sequence_length = {"inputs": 32, "targets": 32}
    config.data.batch_size = 32
    config_base.tiny_run(config, steps=600, learning_rate=1e-2)
    config.eval.num_examples = 64
    config.post_training.num_samples = 4
    return config
