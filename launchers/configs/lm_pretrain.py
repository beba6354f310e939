"""Decoder-only language-model pretraining: `--config=launchers/configs/lm_pretrain.py:SIZE`,
SIZE in 125m, 350m, 1b, 3b, 8b (default 125m).

Register a language-modelling task (tokenize, `reduce_concat_tokens` + `split_tokens` before
the cache, `random_crop` after it; see cairn/launchers/tasks/shakespeare.py) and pass
`--config.data.task_modules="('my_tasks',)" --config.data.task=my_lm
--config.vocabulary.path=/path/to/spm.model`.
"""

from cairn.launchers import config_base

SIZES = ("125m", "350m", "1b", "3b", "8b")


def get_config(size: str = "125m"):
    if size not in SIZES:
        raise ValueError(f"lm_pretrain.py:SIZE takes one of {', '.join(SIZES)}, got {size!r}")
    config = config_base.base_config()
    config_base.pretrain(
        config, f"decoder_only_{size}", "decoder_only", "my_lm", {"targets": 2048}, batch_size=256, steps=100000
    )
    config.optimizer.learning_rate = 6e-4 if size in ("125m", "350m") else 3e-4
    config.optimizer.final_learning_rate = config.optimizer.learning_rate / 10
    config_base.model_parallel_mesh(config, size)
    return config
