"""`//launchers:plot_loss`: a PNG of a run's train loss (and eval metrics) from its summaries.

    bazel run //launchers:plot_loss -- --model_dir=DIR --output=docs/loss.png [--metric=loss]

Reads `<model_dir>/summaries/metrics.jsonl` (rows `{task, step, metric, value}`; a step's last
row wins, a truncated last line is ignored). The train metric is drawn on top; eval metrics, if
any, below. matplotlib (Agg backend) is imported only here.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable, Mapping

from absl import flags

from cairn import storage
from cairn.evaluation import read_metrics as read_metric_rows
from cairn.launchers import entry


def read_metrics(model_dir: str | os.PathLike) -> dict:
    """`{(task, metric): {step: value}}` from the run's summaries (last value per step; local or
    a URL)."""
    summaries = storage.join(os.fspath(model_dir), "summaries")
    rows, _ = read_metric_rows(summaries)
    if not rows:
        raise FileNotFoundError(
            f"{storage.join(summaries, 'metrics.jsonl')} not found or empty: is "
            f"{model_dir} a model_dir of a training run?"
        )
    series: dict = {}
    for row in rows:
        try:
            key, step, value = (row["task"], row["metric"]), int(row["step"]), row["value"]
            value = math.nan if value is None else float(value)
        except (ValueError, KeyError, TypeError):
            continue
        series.setdefault(key, {})[step] = value
    return {k: dict(sorted(v.items())) for k, v in series.items()}


def plot(series: Mapping, output: str | os.PathLike, metric: str = "loss", title: str | None = None) -> str:
    """Draws train `metric` (and every eval metric) to the PNG `output`; returns its path."""
    train = series.get(("train", metric))
    if not train:
        have = sorted(m for t, m in series if t == "train")
        raise ValueError(f"no train metric {metric!r} in the summaries (train metrics: {', '.join(have) or 'none'})")
    evals = {m: v for (t, m), v in sorted(series.items()) if t == "eval" and v}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = 2 if evals else 1
    fig, axes = plt.subplots(rows, 1, figsize=(8, 3.2 * rows + 0.6), squeeze=False)
    ax = axes[0][0]
    steps, values = list(train), list(train.values())
    ax.plot(steps, values, linewidth=1.0, label=f"train/{metric}")
    if len(values) >= 20:  # a moving average helps to read a noisy loss
        k = max(2, len(values) // 20)
        smooth = [
            sum(values[max(0, i - k + 1) : i + 1]) / len(values[max(0, i - k + 1) : i + 1]) for i in range(len(values))
        ]
        ax.plot(steps, smooth, linewidth=2.0, label=f"moving average ({k} steps)")
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right")
    ax.set_title(title or f"{metric}: final {values[-1]:.4g} at step {steps[-1]}")
    if evals:
        ax = axes[1][0]
        for name, points in evals.items():
            ax.plot(list(points), list(points.values()), marker="o", markersize=3, label=f"eval/{name}")
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    storage.write_bytes(output, buffer.getvalue())
    return os.fspath(output)


MODEL_DIR = flags.DEFINE_string("model_dir", None, "the run's model_dir")
OUTPUT = flags.DEFINE_string("output", None, "the PNG to write")
METRIC = flags.DEFINE_string("metric", "loss", "the train metric to draw")
TITLE = flags.DEFINE_string("title", None, "the plot title")


def plot_run(
    model_dir: str, output: str, metric: str = "loss", title: str | None = None, out: Callable[[str], None] = print
) -> str:
    """Plots the run at `model_dir` into `output` (both resolved as a user typed them) and says
    so; returns the path written. Raises `FileNotFoundError` or `ValueError` for unusable input,
    `ImportError` without matplotlib."""
    series = read_metrics(entry.user_path(model_dir))
    path = plot(series, entry.user_path(output), metric, title)
    out(f"plot_loss: wrote {path} ({len(series[('train', metric)])} steps of train/{metric})")
    return path


def _describe(error: BaseException) -> BaseException | str:
    if isinstance(error, ImportError):
        return f"needs matplotlib ({error}); pip install matplotlib"
    return error


def _main() -> None:
    plot_run(str(MODEL_DIR.value), str(OUTPUT.value), METRIC.value, TITLE.value)


def run() -> None:
    """The program (exit status 2 on unusable input)."""
    flags.mark_flags_as_required(["model_dir", "output"])
    entry.run(
        _main,
        expected=(FileNotFoundError, ValueError, ImportError),
        prefix="plot_loss",
        describe=_describe,
    )


if __name__ == "__main__":
    entry.main(run)
