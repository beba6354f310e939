"""The end of a train run: the summary and the next commands carry this run's flags and paths,
as `python -m` commands or, under `bazel run`, as `./bazelw run` ones."""

import types

from cairn.launchers import config_base, post_training


def config(model_dir, wandb=""):
    c = config_base.base_config()
    c.model_dir = model_dir
    c.logging.wandb = wandb
    return c


ARGV = [
    "train_main.py",
    "--config",
    "launchers/configs/shakespeare_t5_tiny.py",
    "--config.num_train_steps=50",
    "--config.model_dir",
    "/old/place",
    "--verbose",
]


def test_config_args_keep_the_experiment_and_overrides_and_set_model_dir():
    assert post_training.config_args(ARGV, "/runs/a b") == [
        "--config=launchers/configs/shakespeare_t5_tiny.py",
        "--config.num_train_steps=50",
        "--config.model_dir=/runs/a b",
    ]


def test_next_commands_without_and_with_bazel(monkeypatch):
    monkeypatch.delenv("BUILD_WORKSPACE_DIRECTORY", raising=False)
    lines = post_training.next_commands(config("/runs/a b", wandb="proj"), ARGV)
    assert lines[0] == (
        "evaluate:     python -m cairn.launchers.eval_main --config=launchers/configs/shakespeare_t5_tiny.py "
        "--config.num_train_steps=50 '--config.model_dir=/runs/a b'"
    )
    assert lines[1].endswith("'--output=/runs/a b/predictions.jsonl'")
    assert lines[2] == (
        "export:       python -m cairn.launchers.export --config=launchers/configs/shakespeare_t5_tiny.py "
        "--config.num_train_steps=50 '--config.model_dir=/runs/a b' '--output=/runs/a b/saved_model'"
    )
    assert lines[3] == (
        "notebook:     from cairn.launchers.interactive import InteractiveModel; "
        "model = InteractiveModel.from_run('/runs/a b')"
    )
    assert (
        lines[4]
        == "loss curve:   python -m cairn.launchers.plot_loss '--model_dir=/runs/a b' '--output=/runs/a b/loss.png'"
    )
    assert lines[5] == "TensorBoard:  tensorboard --logdir '/runs/a b/tensorboard'"
    assert lines[6] == "W&B upload:   wandb sync '/runs/a b/wandb'/offline-run-*"
    monkeypatch.setenv("BUILD_WORKSPACE_DIRECTORY", "/src")
    lines = post_training.next_commands(config("/r"), ARGV)
    assert lines[0].startswith("evaluate:     ./bazelw run //launchers:eval -- --config=")
    assert lines[2].startswith("export:       ./bazelw run //launchers:export -- --config=")
    assert len(lines) == 6  # no W&B line without logging.wandb


def test_the_summary_says_where_everything_is():
    printed = []
    result = types.SimpleNamespace(step=600, preempted=False, metrics={"loss": 4.25321})
    lines = post_training.summary(config("/r"), result, 175.0, 181.4, printed.append, argv=ARGV)
    assert printed == lines
    assert lines[:5] == [
        "trained to step 600 in 2m55s (total 3m01s); loss 4.2532",
        "model_dir: /r",
        "  checkpoints:  /r/checkpoints",
        "  metrics:      /r/summaries/metrics.jsonl",
        "  TensorBoard:  /r/tensorboard",
    ]
    assert lines[5] == "next:" and len(lines) == 12
