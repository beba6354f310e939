"""Decoding and scoring in sharded global batches, for both model families: what `eval
--decode`, decode metrics during training and `infer` run.

`Decoder(spec, model, partitioner, batch_size)(params, prompts, new_tokens)` decodes with the
spec's `DecodeOptions` (`post_training.*`) through `predict_batch(params, family.decode_batch(prompts),
options, rng)`: for an encoder-decoder model `prompts` are the encoder inputs and the output is
the prediction; for a decoder-only model (`continues_prompt`) each row of the output is its
prompt (the row's leading non-zero tokens) followed by the continuation, and the prompt is removed here.
Either way a row's prediction has at most `new_tokens` tokens, whatever the other prompts of its
batch (`decode_options`: a per-row budget), next to `predict_batch`'s score (the log-probability
of exactly those tokens).

`score_features(family, prompts, targets)` builds the batch whose `score_batch` is the
log-likelihood of each target given its prompt: the encoder's inputs and decoder targets, or,
for a decoder-only model, the prompt and target as one causal sequence with loss weights on the
target tokens only.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from cairn.launchers.config_base import model_family
from cairn.launchers.decode_views import PROMPT
from cairn.launchers.prompt_limit import PromptLimit
from cairn.launchers.run_spec import RunSpec
from cairn.launchers.sharded_batches import ShardedBatches


def decode_options(spec: RunSpec, new: int, width: int = 0) -> Any:
    """The spec's `DecodeOptions` (`post_training.*`) for predictions of at most `new` tokens
    each: `max_new_tokens=new`, and `max_decode_length=width + new` where a decoder-only
    model's prompts are padded to `width` (its output holds the prompt), so that every row's
    budget is `new` whatever the other rows' prompts and the padding width."""
    return dataclasses.replace(spec.decode, max_decode_length=width + new, max_new_tokens=new)


def best_decodes(tokens: Any, scores: Any, options: Any) -> tuple[Any, Any]:
    """`(tokens [b, len], scores [b])`: one prediction per example of `predict_batch`'s
    `b * num_decodes` rows (each example's adjacent): with beam search its best beam (the first:
    ranked by the length-penalized score), when sampling the sample of highest log-probability
    (t5x's `predict_batch` without `return_all_decodes`). Traceable (jit, jax2tf)."""
    import jax.numpy as jnp

    k = options.num_decodes
    if k == 1:
        return tokens, scores
    tokens, scores = tokens.reshape(-1, k, tokens.shape[-1]), scores.reshape(-1, k)
    pick = best_index(scores, options, jnp)
    best = jnp.take_along_axis(tokens, pick[:, None, None], axis=1)[:, 0]
    return best, jnp.take_along_axis(scores, pick[:, None], axis=1)[:, 0]


def best_index(scores: Any, options: Any, xp: Any = np) -> Any:
    """`[b]`: which of each example's decodes `scores` `[b, num_decodes]` is its prediction
    (`best_decodes`), in `xp` (numpy, or jax.numpy when traced)."""
    if options.method == "beam":
        return xp.zeros(scores.shape[:1], xp.int32)
    return xp.argmax(scores, axis=1).astype(xp.int32)


def new_tokens(spec: RunSpec, default: int | None = None) -> int:
    """How many tokens a prediction may have: `post_training.max_decode_length`, else `default`,
    else `data.sequence_length.targets`."""
    return int(spec.keys.post_training.max_decode_length or default or spec.reader.sequence_length["targets"])


class Decoder:
    """Predictions of prompt rows, `batch_size` rows per sharded global batch (module docstring)."""

    def __init__(
        self,
        spec: RunSpec,
        model: Any,
        partitioner: Any,
        batch_size: int,
        log_level: int = logging.INFO,
    ):
        self.spec, self.model, self.partitioner = spec, model, partitioner
        self.batch_size, self.log_level = batch_size, log_level
        self.family = model_family(spec.keys.model.kind)
        self.limit = PromptLimit.of(spec)
        self._batches: dict[tuple[int, int], ShardedBatches] = {}

    def _sharded(self, width: int, new: int) -> ShardedBatches:
        if (width, new) not in self._batches:
            options = decode_options(self.spec, new, width if self.family.continues_prompt else 0)
            seed, decode_batch = self.spec.keys.seed, self.family.decode_batch

            def fn(p, x):  # `[b, num_decodes, len]` tokens and `[b, num_decodes]` scores: a row per prompt
                tokens, scores = self.model.predict_batch(p, decode_batch(x), options, rng=jax.random.PRNGKey(seed))
                k = options.num_decodes
                return tokens.reshape(-1, k, tokens.shape[-1]), scores.reshape(-1, k)

            self._batches[width, new] = ShardedBatches(self.partitioner, fn, self.batch_size, "decodes", self.log_level)
        return self._batches[width, new]

    def __call__(
        self, params: Any, prompts: np.ndarray, new: int, first_index: int = 0, total: int | None = None
    ) -> tuple[list[list[int]], np.ndarray]:
        """`(predictions, scores)` of `prompts` `[n, width]` (int32, right-padded with 0), each
        within `post_training.max_input_length` first (`prompt_limit`: cut with a warning, or
        refused): each prompt's best decode (`best_decodes`; `decode_all` has every one)."""
        preds, scores = self.decode_all(params, prompts, new, first_index, total)
        pick = best_index(scores, self.spec.decode)
        return [p[i] for p, i in zip(preds, pick)], scores[np.arange(len(preds)), pick]

    def decode_all(
        self, params: Any, prompts: np.ndarray, new: int, first_index: int = 0, total: int | None = None
    ) -> tuple[list[list[list[int]]], np.ndarray]:
        """`(predictions [n][num_decodes], scores [n, num_decodes])`: every decode of each prompt
        (`post_training.num_decodes`: samples in drawing order, beams best first)."""
        prompts = self._within_limit(np.asarray(prompts, np.int32), first_index)
        tokens, scores = self._sharded(prompts.shape[1], new)(params, prompts, first_index, total)
        starts = (
            np.cumprod(prompts != 0, axis=1).sum(1) if self.family.continues_prompt else np.zeros(len(prompts), int)
        )
        preds = [[[int(t) for t in row[s : s + new]] for row in rows] for rows, s in zip(np.asarray(tokens), starts)]
        return preds, np.asarray(scores, np.float32)

    def _within_limit(self, prompts: np.ndarray, first_index: int) -> np.ndarray:
        lengths = np.cumprod(prompts != 0, axis=1).sum(1)
        if not np.any(lengths > self.limit.max_tokens):
            return prompts
        rows = self.limit.fit([p[:n] for p, n in zip(prompts, lengths)], first_index)
        out = np.zeros((len(rows), self.limit.max_tokens), np.int32)
        for i, r in enumerate(rows):
            out[i, : len(r)] = r
        return out


def score_features(
    family: Any, prompts: list, targets: list, prompt_width: int = 0, target_width: int = 0, start_id: int = 0
) -> dict[str, np.ndarray]:
    """The `score_batch` features of (prompt, target) id lists (module docstring), padded to at
    least `prompt_width` / `target_width` (decoder-only: their sum) so that chunks share a shape;
    the decoder inputs start with `start_id`, as the run's feature converter starts them
    (`ReaderSpec.start_id`: 0, T5's, unless a decoder-only config's `prompt_start_id` says
    otherwise), so a score is the log-likelihood training and eval compute."""
    if not family.continues_prompt:
        enc = _padded(prompts, prompt_width)
        dec = _padded(targets, target_width)
        return {
            "encoder_input_tokens": enc,
            "decoder_target_tokens": dec,
            "decoder_input_tokens": _shift_right(dec, start_id),
            "decoder_loss_weights": (dec > 0).astype(np.int32),
        }
    rows = [list(p) + list(t) for p, t in zip(prompts, targets)]
    seq = _padded(rows, prompt_width + target_width)
    weights = np.zeros_like(seq)
    for i, (p, t) in enumerate(zip(prompts, targets)):
        weights[i, len(p) : len(p) + len(t)] = 1
    return {
        "decoder_target_tokens": seq,
        "decoder_input_tokens": _shift_right(seq, start_id),
        "decoder_loss_weights": weights,
    }


def _padded(rows: list, width: int = 0) -> np.ndarray:
    out = np.zeros((len(rows), max([len(r) for r in rows] + [1, width])), np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _shift_right(x: np.ndarray, start_id: int = 0) -> np.ndarray:
    """Decoder inputs: the targets shifted right by one, `start_id` first (the feature converters')."""
    return np.concatenate([np.full((len(x), 1), start_id, x.dtype), x[:, :-1]], axis=1)


def scorer(model: Any, partitioner: Any, batch_size: int, log_level: int = logging.INFO) -> ShardedBatches:
    """`score(params, features) -> [n]` log-likelihoods (`model.score_batch`), sharded."""
    return ShardedBatches(partitioner, model.score_batch, batch_size, "scores", log_level)


def predict_fn_factory(
    spec: RunSpec,
    model: Any,
    batch_size: int,
    max_decode_length: int | None = None,
    *,
    partitioner: Any,
    log_level: int = logging.INFO,
) -> Callable:
    """`make_predict_fn(params)` for `Evaluator.evaluate` (both families): the prompts are the
    model dataset's `encoder_input_tokens` (encoder-decoder) or its `inputs` (a decoder-only
    decode view, `decode_views`), decoded with the config's options; the predictions hold at
    most `max_decode_length` (default: `post_training.max_decode_length`, else the targets
    length of the dataset) tokens and, for a decoder-only model, no prompt."""
    family = model_family(spec.keys.model.kind)
    key = PROMPT if family.continues_prompt else "encoder_input_tokens"
    decoder = Decoder(spec, model, partitioner, batch_size, log_level)

    def make(params):
        def predict(ds):
            rows = list(ds.as_numpy_iterator())
            idx = [int(i) for i, _ in rows]
            prompts = np.stack([f[key] for _, f in rows])
            width = int(np.shape(rows[0][1]["decoder_target_tokens"])[0])
            preds, _ = decoder(params, prompts, max_decode_length or new_tokens(spec, width))
            return list(zip(idx, preds))

        return predict

    return make
