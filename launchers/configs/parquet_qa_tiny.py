"""A task from a config alone: question/answer pairs in a Parquet file, no task module to write.

    ./bazelw run //launchers:train -- --config=launchers/configs/parquet_qa_tiny.py:path/to/qa.parquet

The file needs `question` and `answer` text columns (others are not read). The first 90% of its
rows train tiny T5.1.1 (text_to_text: the question is the input, the answer the target), the
last 10% are the validation split; the committed Shakespeare SentencePiece model tokenizes. Other
files, columns or recipes: `--config.data.source.files.train=...`, `data.source.columns`,
`data.source.recipe` (launchers/README.md, "A task from a config").
"""

from cairn.launchers import config_base, config_io


def get_config(arg=None):
    config = config_base.base_config()
    config.experiment = "parquet_qa_tiny"
    model = config_base.repo_path(__file__, "..", "data", "shakespeare.model")
    config.vocabulary.path = config_io.relative_to_user_dir(model)
    config.data.task = "parquet_qa"
    config.data.source.format = "parquet"
    config.data.source.files = {"train": arg or "qa.parquet"}
    config.data.source.splits = {"train": "train[:90%]", "validation": "train[90%:]"}
    config.data.source.columns = {"inputs": "question", "targets": "answer"}
    config.data.source.recipe = "text_to_text"
    config.model.preset = "t5_1_1_tiny"
    config.data.sequence_length = {"inputs": 32, "targets": 16}
    config.data.batch_size = 16
    config_base.tiny_run(config, steps=300, learning_rate=3e-3)
    config.eval.num_examples = 32
    config.post_training.num_samples = 2
    return config
