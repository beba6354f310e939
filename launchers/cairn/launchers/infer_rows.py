"""What `infer` reads and writes: each task's (prompt, target) rows, its output file, and the
JSON lines of one chunk in each mode (t5x's infer modes).

* `predict`: rows `{index, input, target, prediction, prediction_ids}`;
* `score`: rows `{index, input, target, score}`, the log-likelihood of the target given the
  input (the sum of the target tokens' log-probabilities);
* `predict_with_aux`: `predict`'s rows with `aux: {scores}`, the log-probability the decoding
  gave the prediction, and with `post_training.num_decodes` > 1 `aux.decodes`: every decode
  (`{prediction, prediction_ids, score}`; the prediction is the best of them).

The rows of a task: an encoder-decoder model's are its examples' `inputs` and `targets`; a
decoder-only model's are the prompts and targets of the task's decode view (`decode_views`:
`inputs` and `targets`, or the two halves of `targets`). Or, for either family,
`--input_file`'s rows (`example_rows.file_rows`, tokenized as the interactive handle tokenizes
text): a text file's lines as inputs (no targets, so no `score` mode), or a `.jsonl` file's
`{"input", "target"}` lines. The predictions and scores are `example_rows.RowPredictor`'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cairn.launchers import builder, decode_views, example_rows, predict_fns
from cairn.launchers import data as data_lib
from cairn.launchers.config_base import model_family
from cairn.launchers.run_spec import RunSpec
from cairn.launchers.validation import ConfigError

MODES = ("predict", "score", "predict_with_aux")
FILE_TASK = ""  # the task name of `--input_file`'s prompts


def check_mode(mode: str, input_file: str) -> None:
    """`ConfigError` naming `mode` for an unknown mode, or `score` of a text `--input_file`
    (prompts only; a `.jsonl` one's rows are checked for targets when read, `check_targets`)."""
    if mode not in MODES:
        raise ConfigError("mode", f"unknown mode {mode!r}; allowed: {', '.join(MODES)}")
    if mode == "score" and input_file and not input_file.endswith(".jsonl"):
        raise ConfigError(
            "mode",
            'score needs targets, and a text --input_file gives prompts only (a .jsonl one: {"input", "target"})',
        )


def check_targets(mode: str, rows: Mapping[str, list[dict]]) -> None:
    """`ConfigError` naming `mode` when `score` meets a row without a target."""
    if mode != "score":
        return
    for task, task_rows in rows.items():
        missing = [i for i, r in enumerate(task_rows) if not r["target_ids"]]
        if missing:
            where = f"--input_file row {missing[0]}" if task == FILE_TASK else f"task {task!r} row {missing[0]}"
            raise ConfigError("mode", f"score needs a target in every row; {where} has none")


def _row(ids: Any, target_ids: Any, vocabulary: Any) -> dict:
    ids, target = [int(t) for t in ids], [int(t) for t in target_ids]
    return {"ids": ids, "target_ids": target, "input": vocabulary.decode(ids), "target": vocabulary.decode(target)}


def task_rows(spec: RunSpec, num_examples: int | None, input_file: str) -> dict[str, list[dict]]:
    """`{task: [{"ids", "target_ids", "input", "target"}]}` in input order, every task of the
    evaluation task or mixture (or `{FILE_TASK: rows}` of `--input_file`)."""
    config, vocabulary = spec.keys, spec.vocabulary
    family = model_family(config.model.kind)
    if input_file:
        return {FILE_TASK: example_rows.file_rows(spec, input_file)}
    n = config.eval.num_examples if num_examples is None else num_examples
    if not family.continues_prompt:
        evaluator = builder.make_evaluator(spec, num_examples=n)
        return {
            t: [_row(ex[family.input_feature], ex["targets"], vocabulary) for ex in evaluator.examples(t)]
            for t in sorted(evaluator.task_names)
        }
    lengths = {k: int(v) for k, v in config.data.sequence_length.items()}
    out = {}
    for name, task in sorted(data_lib.get_tasks(config, "eval.task").items()):
        if config.eval.split not in task.splits:
            continue
        ev = decode_views.view_evaluator(task, lengths, config.eval.split, n or None, config.seed, kinds=())
        out[name] = [_row(ex[decode_views.PROMPT], ex["targets"], vocabulary) for ex in ev.examples(name)]
    if not out:
        raise ConfigError("eval.split", f"no task of {config.eval.task or config.data.task!r} has it")
    return out


def adds_eos(spec: RunSpec) -> bool:
    """Whether the evaluation task's (each task of a mixture's) `inputs` feature ends with EOS."""
    tasks = data_lib.get_tasks(spec.keys, "eval.task")
    features = [t.output_features.get("inputs") for _, t in sorted(tasks.items())]
    return any(f is not None and f.add_eos for f in features)


def output_paths(output: str, tasks: list[str]) -> dict[str, str]:
    """`{task: file}`: `output` itself for one task; `<output without .jsonl>-<task>.jsonl` each
    (`/` and `:` in the name made `_`) for several."""
    if len(tasks) == 1:
        return {tasks[0]: output}
    root = output[: -len(".jsonl")] if output.endswith(".jsonl") else output
    return {t: f"{root}-{t.replace('/', '_').replace(':', '_')}.jsonl" for t in tasks}


def new_tokens(spec: RunSpec, task: Any) -> int:
    """How many tokens a prediction of `task` may have: `post_training.max_decode_length`, else
    the targets length (a decoder-only model's language-model view: the second half's length)."""
    length = spec.reader.sequence_length["targets"]
    if task is not None and model_family(spec.keys.model.kind).continues_prompt:
        if not decode_views.has_prompt_feature(task):
            length -= length // 2
    return predict_fns.new_tokens(spec, length)


class ChunkWriter:
    """The JSON lines of a chunk of rows in one mode (module docstring); the rows' predictions
    and scores are `example_rows.RowPredictor`'s, their padding shared by every chunk of `rows`."""

    def __init__(
        self,
        spec: RunSpec,
        model: Any,
        partitioner: Any,
        chunk_size: int,
        mode: str,
        rows: list[dict],
        new: int,
    ):
        self.mode, self.new = mode, new
        self.prompt_width = example_rows.prompt_width(spec, rows)
        self.target_width = example_rows.target_width(rows)
        self.predictor = example_rows.RowPredictor(spec, model, partitioner, chunk_size)

    def lines(self, params: Any, chunk: list[dict], start: int, total: int) -> list[str]:
        """The chunk's rows (indices from `start`) as JSON lines; every process calls it."""
        base = [{"index": start + i, "input": r["input"], "target": r["target"]} for i, r in enumerate(chunk)]
        if self.mode == "score":
            scores = self.predictor.score(params, chunk, (self.prompt_width, self.target_width), start, total)
            out = [{**b, "score": s} for b, s in zip(base, scores)]
        else:
            preds = self.predictor.predict(params, chunk, self.prompt_width, self.new, start, total)
            out = []
            for b, p in zip(base, preds):
                row = {**b, "prediction": p["prediction"], "prediction_ids": p["prediction_ids"]}
                if self.mode == "predict_with_aux":
                    row["aux"] = {"scores": p["score"]}
                    if "decodes" in p:  # post_training.num_decodes > 1: every decode, the prediction one of them
                        row["aux"]["decodes"] = p["decodes"]
                out.append(row)
        return [json.dumps(r, ensure_ascii=False) for r in out]


def task_objects(spec: RunSpec, names: Mapping[str, Any]) -> dict[str, Any]:
    """`{name: Task or None}` of the row sets (None for `--input_file`'s)."""
    tasks = data_lib.get_tasks(spec.keys, "eval.task") if any(n != FILE_TASK for n in names) else {}
    return {n: tasks.get(n) for n in names}
