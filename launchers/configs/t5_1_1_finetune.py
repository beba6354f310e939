"""Fine-tuning T5.1.1 from a pretrained checkpoint: `--config=launchers/configs/t5_1_1_finetune.py:SIZE`.

Start from either
* a Hugging Face `transformers` T5 directory (config.json + model.safetensors, e.g. a
  download of google/t5-v1_1-base): `--config.init.hf_checkpoint=/path/to/t5-v1_1-base`
  (the model's shape comes from its config.json; `cairn.models.import_hf`), or
* a cairn run: `--config.init.checkpoint=/path/to/model_dir [--config.init.checkpoint_step=N]`
  (`cairn.trainer.restore_params`; the preset must match the run's).

Register the downstream task (`--config.data.task_modules`, `--config.data.task`) and give
its vocabulary (T5's 32k SentencePiece model for the released checkpoints). T5's recipe:
Adafactor at a constant learning rate of 1e-3, no warmup.
"""

from cairn.launchers import config_base

SIZES = ("tiny", "small", "base", "large", "xl", "xxl")


def get_config(size: str = "base"):
    if size not in SIZES:
        raise ValueError(f"t5_1_1_finetune.py:SIZE takes one of {', '.join(SIZES)}, got {size!r}")
    config = config_base.base_config()
    config.experiment = f"t5_1_1_{size}_finetune"
    config.model.preset = f"t5_1_1_{size}"
    config.data.task = "my_finetune_task"
    config.data.sequence_length = {"inputs": 512, "targets": 128}
    config.data.batch_size = 128
    config.num_train_steps = 20000
    config.optimizer.name = "adafactor"
    config.optimizer.schedule = "constant"
    config.optimizer.learning_rate = 1e-3
    config.optimizer.warmup_steps = 0
    config.trainer.checkpoint_every = 1000
    config.trainer.eval_every = 1000
    config_base.model_parallel_mesh(config, size)
    return config
