"""The README quotes exactly the figures of the latest recorded run of the default experiment
(`tools/readme_figures.py` measures them into docs/readme_figures.json and renders the block)."""

import importlib.util
import json
import os
import re

# Under Bazel this file is a runfiles link to the checkout: its real path finds the repository.
ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def _tool():
    spec = importlib.util.spec_from_file_location("readme_figures", os.path.join(ROOT, "tools", "readme_figures.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def test_readme_quotes_the_recorded_figures():
    tool = _tool()
    record = json.loads(_read(tool.RECORD))
    assert tool.quoted_block(_read("README.md")) == tool.render(record)


def test_record_is_a_whole_measurement():
    tool = _tool()
    record = json.loads(_read(tool.RECORD))
    assert record["first_step"] == 1 and record["steps"] > 1
    assert 0 < record["loss_last"] < record["loss_first"]
    assert record["perplexity"] > 1 and record["train_s"] > 0 and record["wall_s"] >= record["train_s"]
    assert record["samples"] and all(set(s) == {"input", "target", "prediction"} for s in record["samples"])
    assert os.path.exists(os.path.join(ROOT, tool.PLOT))
    assert record["console_lines"] <= 40, "the default run's console is at most 40 lines"


def test_recorded_samples_fill_spans_with_words():
    """The default experiment shows learning: at least half of the spans its printed predictions
    fill hold letters (words), not only punctuation: a list of sentinels with commas fails."""
    tool = _tool()
    record = json.loads(_read(tool.RECORD))
    spans = [span for s in record["samples"] for span in re.split(r"<extra_id_\d+>", s["prediction"])[1:]]
    worded = [span for span in spans if re.search(r"[A-Za-z]", span)]
    assert spans and 2 * len(worded) >= len(spans), [s["prediction"] for s in record["samples"]]


def test_no_figures_quoted_outside_the_block():
    """Timings, losses and perplexities of the default run appear only in the generated blocks."""
    tool = _tool()
    readme = _read("README.md")
    start, end = readme.index(tool.FIGURES_BEGIN), readme.index(tool.FIGURES_END)
    outside = readme[:start] + readme[end:]
    # The test suite's measured figures are the other generated block (tools/ci/suite_figures.py).
    outside = re.sub(r"<!-- suite:.*?<!-- /suite -->", "", outside, flags=re.S)
    for pattern in (r"\d+ min \d+ s", r"perplexity[^.\n]* \d", r"loss (fell|of) [\d.]+", r"about [\d.]+ minutes"):
        assert not re.search(pattern, outside), pattern


def test_render_and_parse_round_trip():
    tool = _tool()
    console = (
        "sample 0: input:      a <extra_id_0> c\n          target:     <extra_id_0> b\n"
        "          prediction: <extra_id_0> b\ntrained to step 600 in 1m06s (total 1m08s); loss 4.3777\n"
    )
    assert tool.parse_samples(console) == [
        {"input": "a <extra_id_0> c", "target": "<extra_id_0> b", "prediction": "<extra_id_0> b"}
    ]
    assert tool._seconds(tool.TRAINED_RE.search(console).group(2)) == 66
    block = "figures"
    readme = f"x\n{tool.FIGURES_BEGIN}\nold\n{tool.FIGURES_END}\ny"
    assert tool.quoted_block(tool.replace_block(readme, block)) == block
