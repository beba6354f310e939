"""The decoder-only twin of the default experiment: a tiny GPT-style LM on Shakespeare,
ending by generating text from prompts.

    ./bazelw run //launchers:train -- --config=launchers/configs/shakespeare_lm_tiny.py
"""

from cairn.launchers import config_base


def get_config():
    config = config_base.base_config()
    config.experiment = "shakespeare_lm_tiny"
    config_base.shakespeare(config, __file__, "shakespeare_lm")
    config.model.kind = "decoder_only"
    config.model.preset = "decoder_only_tiny"
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
