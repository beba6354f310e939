"""mT5 pretraining with span corruption: `--config=launchers/configs/mt5_pretrain.py:SIZE`,
SIZE in small, base, large, xl, xxl (default small).

Register a multilingual span-corruption task (as in t5_1_1_pretrain.py) and give mT5's
250k SentencePiece model: `--config.vocabulary.path=/path/to/mc4.250000.100extra.model`
(vocab size 250000 + 100 sentinels -> 250112, the checkpoints' size).
"""

from cairn.launchers import config_base

SIZES = ("small", "base", "large", "xl", "xxl")


def get_config(size: str = "small"):
    if size not in SIZES:
        raise ValueError(f"mt5_pretrain.py:SIZE takes one of {', '.join(SIZES)}, got {size!r}")
    config = config_base.base_config()
    config_base.pretrain(
        config,
        f"mt5_{size}",
        "encoder_decoder",
        "mc4_span_corruption",
        {"inputs": 1024, "targets": 229},
        batch_size=1024,
        steps=1000000,
    )
    config_base.model_parallel_mesh(config, size)
    return config
