"""Prompt tuning of the default experiment's checkpoint on line completion (the LoRA
experiment's task, `shakespeare_t5_lora.py`).

First train the default experiment (its checkpoint is the frozen base), then, from the same
directory:

    ./bazelw run //launchers:train -- --config=launchers/configs/shakespeare_t5_tiny.py
    ./bazelw run //launchers:train -- --config=launchers/configs/shakespeare_t5_prompt_tuning.py

A prompt of 20 embeddings (2,560 parameters, 0.19 % of the base's) in front of every encoder
input, started from the embeddings of 20 frequent tokens (seeded), is all that trains (Lester
et al. 2021); the model is frozen.
Checkpoints hold the prompt and `config.json` names the base. Another base:
`--config.init.checkpoint=PATH`. model_dir: runs/shakespeare_t5_prompt_tuning.
"""

from cairn.launchers import config_base


def get_config():
    config = config_base.base_config()
    config_base.adapt_default_experiment(config, __file__, "shakespeare_t5_prompt_tuning", steps=600, learning_rate=0.1)
    config.model.prompt_tuning.length = 20
    config.model.prompt_tuning.init = "vocab_sample"
    return config
