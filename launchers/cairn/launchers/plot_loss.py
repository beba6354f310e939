"""`//launchers:plot_loss`: a PNG of a run's train loss (and eval metrics) from its summaries.

    bazel run //launchers:plot_loss -- --model_dir=DIR --output=docs/loss.png [--metric=loss]

Reads `<model_dir>/summaries/metrics.jsonl` (rows `{task, step, metric, value}`; a step's last
row wins, a truncated last line is ignored). The train metric is drawn on top; eval metrics, if
any, below. matplotlib (Agg backend) is imported only here.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import sys
from typing import Mapping, Optional, Sequence

from cairn import storage
from cairn.evaluation import read_metrics as read_metric_rows
from cairn.launchers.verify import resolve


def read_metrics(model_dir: str | os.PathLike) -> dict:
    """`{(task, metric): {step: value}}` from the run's summaries (last value per step; local or
    a URL)."""
    summaries = storage.join(os.fspath(model_dir), "summaries")
    rows, _ = read_metric_rows(summaries)
    if not rows:
        raise FileNotFoundError(f"{storage.join(summaries, 'metrics.jsonl')} not found or empty: is "
                                f"{model_dir} a model_dir of a training run?")
    series: dict = {}
    for row in rows:
        try:
            key, step, value = (row["task"], row["metric"]), int(row["step"]), row["value"]
            value = math.nan if value is None else float(value)
        except (ValueError, KeyError, TypeError):
            continue
        series.setdefault(key, {})[step] = value
    return {k: dict(sorted(v.items())) for k, v in series.items()}


def plot(series: Mapping, output: str | os.PathLike, metric: str = "loss", title: Optional[str] = None) -> str:
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
        smooth = [sum(values[max(0, i - k + 1):i + 1]) / len(values[max(0, i - k + 1):i + 1])
                  for i in range(len(values))]
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="plot_loss", description=__doc__.split("\n\n")[0])
    p.add_argument("--model_dir", required=True, help="the run's model_dir")
    p.add_argument("--output", required=True, help="the PNG to write")
    p.add_argument("--metric", default="loss", help="the train metric to draw (default: loss)")
    p.add_argument("--title", default=None, help="the plot title")
    args = p.parse_args(argv)
    model_dir, output = resolve(args.model_dir), resolve(args.output)
    try:
        series = read_metrics(model_dir)
        path = plot(series, output, args.metric, args.title)
    except (FileNotFoundError, ValueError) as e:
        print(f"plot_loss: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"plot_loss: needs matplotlib ({e}); pip install matplotlib", file=sys.stderr)
        return 2
    steps = series[("train", args.metric)]
    print(f"plot_loss: wrote {path} ({len(steps)} steps of train/{args.metric})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
