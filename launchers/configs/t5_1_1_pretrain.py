"""T5.1.1 pretraining with span corruption: `--config=launchers/configs/t5_1_1_pretrain.py:SIZE`,
SIZE in tiny, small, base, large, xl, xxl (default small), or xl_bf16, xxl_bf16: xl / xxl with
bfloat16 compute, scanned layers and full rematerialization (`config_base.bf16_scan_remat`;
parameters stay float32), what fits them on a pod's memory.

C4 is not available offline: register your own span-corruption task (tokenize, then
`reduce_concat_tokens` + `split_tokens` before the cache, `span_corruption_one_to_one` +
`append_eos_after_trim` after it; see cairn/launchers/tasks/shakespeare.py) in a module,
and pass `--config.data.task_modules="('my_tasks',)" --config.data.task=my_span_corruption
--config.vocabulary.path=/path/to/t5_spm.model` (T5's 32k SentencePiece model: 32000 pieces
+ 100 sentinels -> vocab size 32128).
"""

from cairn.launchers import config_base

SIZES = ("tiny", "small", "base", "large", "xl", "xxl")
BF16_SIZES = ("xl_bf16", "xxl_bf16")


def get_config(size: str = "small"):
    if size not in SIZES + BF16_SIZES:
        raise ValueError(f"t5_1_1_pretrain.py:SIZE takes one of {', '.join(SIZES + BF16_SIZES)}, got {size!r}")
    base, _, variant = size.partition("_")
    config = config_base.base_config()
    config_base.pretrain(
        config,
        f"t5_1_1_{base}",
        "encoder_decoder",
        "c4_span_corruption",
        {"inputs": 512, "targets": 114},
        batch_size=2048,
        steps=524288,
    )
    config_base.model_parallel_mesh(config, base)
    if variant:
        config.experiment = f"t5_1_1_{size}_pretrain"
        config_base.bf16_scan_remat(config)
    return config
