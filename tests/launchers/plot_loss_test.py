"""`//launchers:plot_loss` on a synthetic summaries/metrics.jsonl: a real PNG of the right size."""

import json
import math
import os
import struct
import subprocess
import sys

import pytest

from cairn.launchers.plot_loss import plot, plot_run, read_metrics

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _write_metrics(model_dir, steps=60, evals=True, truncated=True):
    (model_dir / "summaries").mkdir(parents=True)
    with open(model_dir / "summaries" / "metrics.jsonl", "w") as f:
        for step in range(1, steps + 1):
            for metric, value in (("loss", 4.0 * math.exp(-step / 20) + 0.5), ("accuracy", step / steps)):
                f.write(json.dumps({"task": "train", "step": step, "metric": metric, "value": value}) + "\n")
            if evals and step % 20 == 0:
                f.write(
                    json.dumps({"task": "eval", "step": step, "metric": "tiny/accuracy", "value": step / 100}) + "\n"
                )
        f.write(json.dumps({"task": "train", "step": 3, "metric": "loss", "value": 99.0}) + "\n")  # a re-run step
        if truncated:
            f.write('{"task": "train", "step": 61, "metr')


def test_read_metrics_last_row_wins_and_truncated_line_ignored(tmp_path):
    _write_metrics(tmp_path)
    series = read_metrics(tmp_path)
    assert list(series[("train", "loss")]) == list(range(1, 61))
    assert series[("train", "loss")][3] == 99.0
    assert series[("eval", "tiny/accuracy")] == {20: 0.2, 40: 0.4, 60: 0.6}


@pytest.mark.parametrize("evals", [True, False])
def test_plot_writes_a_png(tmp_path, evals):
    _write_metrics(tmp_path / "run", evals=evals)
    out = tmp_path / "docs" / "loss.png"
    assert plot(read_metrics(tmp_path / "run"), out) == str(out)
    width, height = _png_size(out)
    assert width == 800 and height == (700 if evals else 380)
    assert out.stat().st_size > 5000


def _plot_loss(*args, cwd):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), BUILD_WORKING_DIRECTORY=str(cwd))
    return subprocess.run(
        [sys.executable, "-m", "cairn.launchers.plot_loss", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_plot_run_resolves_paths_and_raises_on_bad_input(tmp_path, monkeypatch, capsys):
    _write_metrics(tmp_path / "run", evals=False)
    monkeypatch.setenv("BUILD_WORKING_DIRECTORY", str(tmp_path))
    assert plot_run("run", "out/acc.png", "accuracy") == str(tmp_path / "out" / "acc.png")
    assert "60 steps of train/accuracy" in capsys.readouterr().out
    assert _png_size(tmp_path / "out" / "acc.png")[0] == 800
    with pytest.raises(ValueError, match="no train metric 'perplexity'"):
        plot_run("run", "x.png", "perplexity")
    assert not (tmp_path / "x.png").exists()
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "missing")):
        plot_run("missing", "x.png")


def test_the_program_exits_2_with_one_line(tmp_path):
    _write_metrics(tmp_path / "run", evals=False)
    ok = _plot_loss("--model_dir=run", "--output=loss.png", cwd=tmp_path)
    assert ok.returncode == 0 and "60 steps of train/loss" in ok.stdout, ok.stderr
    bad = _plot_loss("--model_dir=run", "--output=x.png", "--metric=perplexity", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("plot_loss: ") and len(bad.stderr.splitlines()) == 1
    assert "no train metric 'perplexity'" in bad.stderr
    missing = _plot_loss("--output=x.png", cwd=tmp_path)
    assert missing.returncode != 0 and "model_dir" in missing.stderr


def test_importing_plot_loss_does_not_load_matplotlib():
    code = "import sys, cairn.launchers.plot_loss; print('matplotlib' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True)
    assert out.stdout.strip() == "False"
