"""ByT5 pretraining on bytes: `--config=launchers/configs/byt5_pretrain.py:SIZE`, SIZE in
small, base, large, xl, xxl (default small).

The vocabulary is `ByteVocabulary(extra_ids=125)` (3 special ids + 256 bytes + 125
sentinels = 384, ByT5's size); no file is needed. Register a span-corruption task over
your text with that vocabulary (`--config.data.task_modules`, `--config.data.task`).
"""

from cairn.launchers import config_base

SIZES = ("small", "base", "large", "xl", "xxl")


def get_config(size: str = "small"):
    if size not in SIZES:
        raise ValueError(f"byt5_pretrain.py:SIZE takes one of {', '.join(SIZES)}, got {size!r}")
    config = config_base.base_config()
    config_base.pretrain(
        config,
        f"byt5_{size}",
        "encoder_decoder",
        "mc4_byte_span_corruption",
        {"inputs": 1024, "targets": 229},
        batch_size=1024,
        steps=1000000,
    )
    config.vocabulary.kind = "byte"
    config.vocabulary.extra_ids = 125
    config_base.model_parallel_mesh(config, size)
    return config
