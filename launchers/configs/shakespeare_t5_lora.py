"""LoRA of the default experiment's checkpoint on a second Shakespeare task: line completion.

First train the default experiment (its checkpoint is the frozen base), then, from the same
directory:

    ./bazelw run //launchers:train -- --config=launchers/configs/shakespeare_t5_tiny.py
    ./bazelw run //launchers:train -- --config=launchers/configs/shakespeare_t5_lora.py

Rank-8 adapters of every attention and MLP kernel (86k parameters, 6.4 % of the base's 1.35 M)
learn to complete a line of Shakespeare from its first half (`shakespeare_line_completion`):
only they train and have optimizer state; checkpoints hold them and `config.json` names the
base. Another base: `--config.init.checkpoint=PATH` (a model_dir or one of its checkpoints).
model_dir: runs/shakespeare_t5_lora.
"""

from cairn.launchers import config_base


def get_config():
    config = config_base.base_config()
    config_base.adapt_default_experiment(config, __file__, "shakespeare_t5_lora", steps=600, learning_rate=1e-2)
    config.model.lora.rank = 8
    config.model.lora.alpha = 16.0
    return config
