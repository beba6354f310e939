"""Prompt tuning of the default experiment's checkpoint on line completion (the LoRA
experiment's task, `shakespeare_t5_lora.py`).

First train the default experiment (its checkpoint is the frozen base), then, from the same
directory:

    ./bazelw run //launchers:train -- --config=launchers/configs/shakespeare_t5_tiny.py
    ./bazelw run //launchers:train -- --config=launchers/configs/shakespeare_t5_prompt_tuning.py

A prompt of 20 embeddings in front of every encoder input, started from the embeddings of 20
frequent tokens (seeded), is all that trains (Lester et al. 2021); the model is frozen.
Checkpoints hold the prompt and `config.json` names the base. Another base:
`--config.init.checkpoint=PATH`. model_dir: runs/shakespeare_t5_prompt_tuning.
"""

from cairn.launchers import config_base


def get_config():
    config = config_base.base_config()
    config.experiment = "shakespeare_t5_prompt_tuning"
    config_base.shakespeare(config, __file__, "shakespeare_line_completion")
    config.model.kind = "encoder_decoder"
    config.model.preset = "t5_1_1_tiny"  # the base's
    config.init.checkpoint = "runs/shakespeare_t5_tiny"  # the default experiment's model_dir
    config.model.prompt_tuning.length = 20
    config.model.prompt_tuning.init = "vocab_sample"
    config.data.sequence_length = {"inputs": 32, "targets": 32}
    config.data.batch_size = 32
    config_base.tiny_run(config, steps=600, learning_rate=0.1)
    config.eval.num_examples = 64
    config.post_training.num_samples = 4
    return config
