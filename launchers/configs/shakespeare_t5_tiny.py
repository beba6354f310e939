"""The default experiment: tiny T5.1.1 learning span corruption on Shakespeare, on a CPU.

    ./bazelw run //launchers:train -- --config=launchers/configs/shakespeare_t5_tiny.py

A few minutes on 2 CPU cores: caches the task (first run only), trains, evaluates on Hamlet
(perplexity), prints denoising samples (sampled, top-k 10). model_dir: runs/shakespeare_t5_tiny
(where the command runs).
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
    # 1800 steps: about 3 minutes on 2 quiet CPU cores (600 left greedy decoding at lists of
    # sentinels); held-out perplexity falls from ~86 at 600 steps to ~60.
    config_base.tiny_run(config, steps=1800, learning_rate=3e-3)
    config.eval.num_examples = 64
    config.post_training.num_samples = 4
    # Samples are drawn (top-k 10, temperature 0.7, seeded by config.seed): greedy decoding of a
    # model this small fills every span with its most frequent token (",").
    config.post_training.decode_method = "sample"
    config.post_training.temperature = 0.7
    config.post_training.top_k = 10
    return config
