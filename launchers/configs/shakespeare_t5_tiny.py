"""The default experiment: tiny T5.1.1 learning span corruption on Shakespeare, on a CPU.

    ./bazelw run //launchers:train -- --config=launchers/configs/shakespeare_t5_tiny.py

A few minutes on 2 CPU cores: caches the task (first run only), trains, evaluates on Hamlet
(perplexity), prints denoising samples. model_dir: runs/shakespeare_t5_tiny (where the command runs).
"""

from cairn.launchers import config_base


def get_config():
    config = config_base.base_config()
    config.experiment = "shakespeare_t5_tiny"
    config_base.shakespeare(config, __file__, "shakespeare_span_corruption")
    config.model.kind = "encoder_decoder"
    config.model.preset = "t5_1_1_tiny"
    config.data.sequence_length = {"inputs": 64, "targets": 16}
    config.data.batch_size = 32
    config_base.tiny_run(config, steps=600, learning_rate=3e-3)
    config.eval.num_examples = 64
    config.post_training.num_samples = 4
    return config
