"""Rows of examples, what `infer` and the interactive handle (`cairn.launchers.interactive`)
both compute on: text tokenized into rows, and the rows' predictions and scores in sharded
batches. One code path, so a string given to `InteractiveModel.predict` and the same string in
infer's `--input_file` become the same ids, the same padded batches and the same prediction.

A row is `{"ids", "target_ids", "input", "target"}`: the prompt's ids (an encoder-decoder's
encoder input, a decoder-only model's prompt), the target's ids (empty when there is none), and
their text.

Text is tokenized as the shipped tasks tokenize (`TextEncoding`): an encoder-decoder's inputs
and targets are trimmed to `data.sequence_length` less one and end with EOS (t5x's and seqio's
`append_eos_after_trim`); a decoder-only prompt is the vocabulary's ids of the text, nothing
added (it is continued), and its target too (a continuation; for training, trimmed to the
targets length). A prompt to decode follows `prompt_limit` instead of the inputs length:
at most `post_training.max_input_length` tokens, a longer one cut (a decoder-only prompt keeps
its end) with a warning naming its row, or refused.

`RowPredictor` decodes rows (`predict_fns.Decoder`, the spec's `post_training.*` options: the
prediction at most `new` tokens, cut at the first padding id, and for a decoder-only model
without its prompt) and scores them (`predict_fns.score_features` + `score_batch`: the target's
log-likelihood given the prompt), `batch_size` rows per global batch sharded over the mesh.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from cairn import storage
from cairn.launchers import predict_fns
from cairn.launchers.config_base import model_family
from cairn.launchers.post_training import pad_rows
from cairn.launchers.prompt_limit import PromptLimit
from cairn.launchers.run_spec import RunSpec
from cairn.launchers.validation import ConfigError


@dataclasses.dataclass(frozen=True)
class TextEncoding:
    """How text becomes ids (module docstring): the vocabulary, whether the model continues its
    prompt (decoder-only), and the `data.sequence_length` of each feature."""

    vocabulary: Any
    continues_prompt: bool
    lengths: Mapping[str, int]

    @classmethod
    def of(cls, spec: RunSpec) -> TextEncoding:
        family = model_family(spec.keys.model.kind)
        return cls(spec.vocabulary, family.continues_prompt, dict(spec.reader.sequence_length))

    def _with_eos(self, text: str, feature: str) -> list[int]:
        ids = list(self.vocabulary.encode(text))[: self.lengths[feature] - 1]
        return ids + [int(self.vocabulary.eos_id)]

    def prompt(self, text: str) -> list[int]:
        """The ids of an input: the encoder's (trimmed, EOS) or a prompt to continue (as is)."""
        if self.continues_prompt:
            return [int(t) for t in self.vocabulary.encode(text)]
        return self._with_eos(text, "inputs")

    def full_prompt(self, text: str) -> list[int]:
        """The ids of an input to decode, before `prompt_limit` cuts it: an encoder's (with EOS,
        untrimmed) or a prompt to continue (as is)."""
        ids = [int(t) for t in self.vocabulary.encode(text)]
        return ids if self.continues_prompt else ids + [int(self.vocabulary.eos_id)]

    def target(self, text: str, train: bool = False) -> list[int]:
        """The ids of a target: an encoder-decoder's (trimmed, EOS); a decoder-only model's as
        is (with `train`, cut to the targets length)."""
        if not self.continues_prompt:
            return self._with_eos(text, "targets")
        ids = [int(t) for t in self.vocabulary.encode(text)]
        return ids[: self.lengths["targets"]] if train else ids


def text_rows(spec: RunSpec, inputs: Sequence[str], targets: Sequence[str] | None = None) -> list[dict]:
    """Rows of texts (and their targets, None: none), tokenized by `TextEncoding`, each prompt
    within `post_training.max_input_length` (`prompt_limit`: cut with one warning naming the
    rows, or refused)."""
    encoding = TextEncoding.of(spec)
    targets = targets if targets is not None else [""] * len(inputs)
    prompts = PromptLimit.of(spec).fit([encoding.full_prompt(i) for i in inputs])
    return [
        {
            "ids": ids,
            "target_ids": encoding.target(t) if t else [],
            "input": i,
            "target": t,
        }
        for ids, i, t in zip(prompts, inputs, targets)
    ]


def file_rows(spec: RunSpec, path: str) -> list[dict]:
    """The rows of infer's `--input_file`: a `.jsonl` file's lines `{"input": str, "target":
    str}` (the target optional), else each non-empty line of a text file as an input."""
    text = storage.read_text(path)
    if not path.endswith(".jsonl"):
        lines = [line.rstrip("\r") for line in text.split("\n") if line.strip()]
        return text_rows(spec, lines)
    inputs, targets = [], []
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError("input_file", f"{path}:{n}: not valid JSON: {e.msg}") from None
        if not isinstance(row, dict) or not isinstance(row.get("input"), str):
            raise ConfigError("input_file", f'{path}:{n}: a line is {{"input": str, "target": str (optional)}}')
        if not isinstance(row.get("target", ""), str):
            raise ConfigError("input_file", f"{path}:{n}: 'target' must be a string")
        inputs.append(row["input"])
        targets.append(row.get("target", ""))
    return text_rows(spec, inputs, targets)


def prompt_width(spec: RunSpec, rows: Sequence[dict]) -> int:
    """The width prompts are padded to: an encoder-decoder's input length (`prompt_limit`'s:
    `post_training.max_input_length`, default `data.sequence_length.inputs`), a decoder-only
    model's longest prompt among `rows` (chunks of one file share it)."""
    family = model_family(spec.keys.model.kind)
    if family.continues_prompt:
        return max([len(r["ids"]) for r in rows] + [1])
    return PromptLimit.of(spec).max_tokens


def target_width(rows: Sequence[dict]) -> int:
    """The width targets are padded to when scored: the longest among `rows`."""
    return max([len(r["target_ids"]) for r in rows] + [1])


class RowPredictor:
    """Predictions and scores of rows, `batch_size` rows per sharded global batch (module
    docstring). Its compiled programs are kept: calls with the same widths compile once."""

    def __init__(self, spec: RunSpec, model: Any, partitioner: Any, batch_size: int, log_level: int = logging.INFO):
        self.family = model_family(spec.keys.model.kind)
        self.vocabulary, self.start_id = spec.vocabulary, spec.reader.start_id
        self.decoder = predict_fns.Decoder(spec, model, partitioner, batch_size, log_level)
        self.scorer = predict_fns.scorer(model, partitioner, batch_size, log_level)

    def predict(
        self, params: Any, rows: Sequence[dict], width: int, new: int, first_index: int = 0, total: int | None = None
    ) -> list[dict]:
        """`[{"prediction", "prediction_ids", "score"}]` of `rows`, their prompts padded to
        `width`, at most `new` tokens each; `score` is the log-probability the decoding gave the
        prediction. With `post_training.num_decodes` > 1 the prediction is the best decode
        (`predict_fns.best_decodes`) and `"decodes"` lists every one (`{"prediction",
        "prediction_ids", "score"}`: samples in drawing order, beams best first). `first_index`
        and `total` number the rows in the log line."""
        prompts = pad_rows([r["ids"] for r in rows], width)
        preds, scores = self.decoder.decode_all(params, prompts, new, first_index, total)
        picks = predict_fns.best_index(scores, self.decoder.spec.decode)
        out = []
        for decodes, row_scores, pick in zip(preds, scores, picks):
            each = [self._prediction(p, s) for p, s in zip(decodes, row_scores)]
            out.append({**each[pick], "decodes": each} if len(each) > 1 else each[0])
        return out

    def _prediction(self, pred: list[int], score: float) -> dict:
        ids = pred[: pred.index(0)] if 0 in pred else pred
        return {"prediction": self.vocabulary.decode(ids), "prediction_ids": ids, "score": float(score)}

    def score(
        self,
        params: Any,
        rows: Sequence[dict],
        widths: tuple[int, int],
        first_index: int = 0,
        total: int | None = None,
    ) -> list[float]:
        """The log-likelihood of each row's target given its prompt (`widths`: the prompt and
        target padding, `prompt_width` and `target_width`)."""
        feats = predict_fns.score_features(
            self.family,
            [r["ids"] for r in rows],
            [r["target_ids"] for r in rows],
            widths[0],
            widths[1],
            self.start_id,
        )
        return [float(s) for s in self.scorer(params, feats, first_index, total)]
