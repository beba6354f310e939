"""An interactive handle on a model, for a notebook (t5x's `InteractiveModel`): load a run or a
config and a checkpoint, then predict, score and train on Python strings.

    from cairn.launchers.interactive import InteractiveModel

    model = InteractiveModel.from_run("runs/shakespeare_t5_tiny")          # its config.json, latest step
    model.predict(["To be, or not to be"])                                 # -> [str]
    model.score(["To be, or not"], ["to be"])                              # -> [log-likelihood]
    model.train_step([{"inputs": "Thou art", "targets": "more lovely"}])   # -> {"loss": ...}

The handle is a façade over the code the entry points run, not a copy of it: the config is
resolved into the run's `RunSpec` (`run_spec.load`) and bound to the devices (`run_spec.bind`);
the model, its checkpoint layout and its `Trainer` are infer's and eval's
(`builder.load_model`, `checkpoint_params.params_layout`, `checkpoint_params.load_stored`);
text is tokenized, padded, decoded and scored by `example_rows` (what infer's `--input_file`
runs), so `predict` equals infer's predictions and `score` infer's `--mode=score` on the same
strings; `train_step` runs the run's own partitioned train step (`Trainer.train_step`: its
optimizer, schedule, microbatches and loss) on a batch made by the run's feature converter.

* Encoder-decoder models are given inputs; decoder-only models continue prompts, and the
  prediction excludes the prompt (infer's convention). The model's `prompt_start_id` and the
  config's decoding options (`post_training.decode_method`, `max_decode_length`, ...) apply,
  and its prompt-length policy (`post_training.max_input_length`, `long_inputs`: a longer
  prompt is cut, with one warning naming its rows, or refused; `cairn.launchers.prompt_limit`).
* A LoRA run (`model.lora.*`) loads its adapters over the frozen base of its `init.*` source;
  `predict` and `score` use the adapters folded in, and `train_step` trains the adapters only.
* The mesh is the config's `partitioning.mesh` on `devices` (default: every local device); one
  process.
* `train_step` continues the checkpoint's training: its step (the schedule goes on from there)
  and its optimizer state (moments, counts), as t5x's handle restores them; with another
  optimizer than the checkpoint's (an override), that state starts afresh (logged). `save(dir)`
  writes a checkpoint and `config.json` that `from_run`, infer and eval read.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from cairn import storage
from cairn.datatasks.ragged import Ragged
from cairn.launchers import builder, checkpoint_params, config_io, example_rows, predict_fns, run_spec
from cairn.launchers import data as data_lib
from cairn.launchers.validation import ConfigError

log = logging.getLogger(__name__)


def _texts(name: str, values: Any) -> list[str]:
    """`values` as a non-empty list of strings (`ValueError` / `TypeError` naming `name`)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a list of strings, got {type(values).__name__}")
    if not values:
        raise ValueError(f"{name} is empty: give at least one string")
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise TypeError(f"{name}[{i}] must be a string, got {type(v).__name__}")
    return list(values)


class InteractiveModel:
    """A model and its params, loaded from a run or a config (module docstring).

    Args:
      spec: the run's `RunSpec` (`from_run` and `from_config` make it).
      checkpoint: a model_dir, its `checkpoints/` folder or one step's folder; "" for no
        checkpoint (the params of the config's `init.*` source, else freshly initialized).
      step: that step's checkpoint (default: the latest complete one).
      batch_size: rows per global batch of `predict` and `score` (default `eval.batch_size`).
      devices: the devices of the mesh (default: `jax.local_devices()`).
    """

    def __init__(
        self,
        spec: run_spec.RunSpec,
        checkpoint: str = "",
        step: int | None = None,
        *,
        batch_size: int | None = None,
        devices: Sequence[Any] | None = None,
    ):
        if checkpoint and not storage.path(checkpoint).exists():
            raise ConfigError("checkpoint", f"{checkpoint!r} does not exist")
        if checkpoint:  # before anything is built: which step (ConfigError when none is complete)
            step, checkpoint = checkpoint_params.locate(checkpoint, step)
        self.spec = spec
        self.batch_size = int(batch_size or spec.keys.eval.batch_size)
        devices = list(devices) if devices is not None else jax.local_devices()
        bound = run_spec.bind(spec, devices, 1, train=False, padded=(("batch_size", self.batch_size),))
        self.mesh, self.partitioner = dict(bound.mesh), bound.partitioner
        self.model = builder.load_model(spec)
        layout = checkpoint_params.params_layout(spec, self.model, self.partitioner)
        self.trainer = layout.trainer
        if checkpoint:
            self.step, stored = checkpoint_params.load_stored(layout, checkpoint, step)
        else:
            rows = self.partitioner.batch_parts() // self.partitioner.data_layout().num_shards
            self.step = 0
            stored = builder.pretrained_params(spec, self.trainer, checkpoint_params.zero_batch(spec, rows))
        state = self.trainer.initial_state(stored, layout.frozen)
        if checkpoint:
            state = state.replace(opt_state=self._stored_opt_state(checkpoint, state.opt_state))
        self.state = state.replace(step=jax.device_put(np.int32(self.step), self.trainer.state_shardings.step))
        self.checkpoint = checkpoint
        self._params: Any = None
        self.predictor = example_rows.RowPredictor(spec, self.model, self.partitioner, self.batch_size, logging.DEBUG)
        self.encoding = example_rows.TextEncoding.of(spec)
        self.continues_prompt = self.encoding.continues_prompt

    def _stored_opt_state(self, checkpoint: str, fresh: Any) -> Any:
        """The checkpoint's optimizer state, else (another optimizer's state) `fresh`."""
        from cairn.trainer import restore_opt_state

        try:
            return restore_opt_state(checkpoint, self.trainer.abstract_state.opt_state)
        except (KeyError, TypeError, ValueError) as e:
            log.info("the optimizer state of %s is not this optimizer's (%s): it starts afresh", checkpoint, e)
            return fresh

    # -- constructors ----------------------------------------------------------------------
    @classmethod
    def from_run(cls, model_dir: str, step: int | None = None, **kwargs: Any) -> InteractiveModel:
        """The run in `model_dir` (its `config.json`, model_dir set to it) at its latest
        complete checkpoint (or `step`)."""
        path = storage.join(os.fspath(model_dir), "config.json")
        if not storage.path(path).is_file():
            raise ConfigError("model_dir", f"{model_dir!r} holds no config.json (not a run's model_dir)")
        config = config_io.load_saved_config(path)
        config.model_dir = os.fspath(model_dir)
        return cls.from_config(config, checkpoint=os.fspath(model_dir), step=step, **kwargs)

    @classmethod
    def from_config(
        cls,
        config: str | os.PathLike | ml_collections.ConfigDict,
        checkpoint: str | os.PathLike = "",
        step: int | None = None,
        overrides: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> InteractiveModel:
        """A config (an experiment file `path.py[:arg]`, a saved `config.json`, or a loaded
        `ConfigDict`) with `overrides` (`{"dotted.key": value}`, as `--config.dotted.key`), and
        the params of `checkpoint` ("" : none, see the class)."""
        if not isinstance(config, ml_collections.ConfigDict):
            config = config_io.load_config_file(os.fspath(config))
        config = ml_collections.ConfigDict(config.to_dict())
        for key, value in (overrides or {}).items():
            try:
                config_io.set_path(config, key, value)
            except (KeyError, AttributeError):
                raise ConfigError(key, "no such config key") from None
        spec = run_spec.load(config_io.resolve_paths(config))
        return cls(spec, config_io.resolve_path(os.fspath(checkpoint)) if checkpoint else "", step, **kwargs)

    # -- params ----------------------------------------------------------------------------
    @property
    def params(self) -> Any:
        """The params `predict` and `score` use (a LoRA run's adapters folded into its base),
        on the device."""
        if self._params is None:
            self._params = self.trainer.eval_params(self.state)
        return self._params

    # -- inference -------------------------------------------------------------------------
    def predict(self, inputs: Sequence[str], max_decode_length: int | None = None) -> list[str]:
        """The model's prediction of each input (infer's `predict` mode); at most
        `max_decode_length` tokens (default `post_training.max_decode_length`, else the
        targets length)."""
        return self.predict_with_aux(inputs, max_decode_length)[0]

    def predict_with_aux(
        self, inputs: Sequence[str], max_decode_length: int | None = None
    ) -> tuple[list[str], dict[str, list]]:
        """`(predictions, {"scores", "prediction_ids"})`: `predict`'s strings, the
        log-probability the decoding gave each (infer's `predict_with_aux` `aux.scores`) and
        their token ids; with `post_training.num_decodes` > 1 also `"decodes"`, every decode of
        each input (infer's `aux.decodes`)."""
        rows = example_rows.text_rows(self.spec, _texts("inputs", inputs))
        new = int(max_decode_length) if max_decode_length else predict_fns.new_tokens(self.spec)
        out = self.predictor.predict(self.params, rows, example_rows.prompt_width(self.spec, rows), new)
        aux = {"scores": [p["score"] for p in out], "prediction_ids": [p["prediction_ids"] for p in out]}
        if out and "decodes" in out[0]:  # post_training.num_decodes > 1: every decode of each input
            aux["decodes"] = [p["decodes"] for p in out]
        return [p["prediction"] for p in out], aux

    def score(self, inputs: Sequence[str], targets: Sequence[str]) -> list[float]:
        """The log-likelihood of each target given its input, summed over the target's tokens
        (infer's `score` mode)."""
        inputs, targets = _texts("inputs", inputs), _texts("targets", targets)
        if len(inputs) != len(targets):
            raise ValueError(f"score needs one target per input: {len(inputs)} inputs, {len(targets)} targets")
        if "" in targets:
            raise ValueError(f"targets[{targets.index('')}] is empty: there is nothing to score")
        rows = example_rows.text_rows(self.spec, inputs, targets)
        widths = (example_rows.prompt_width(self.spec, rows), example_rows.target_width(rows))
        return self.predictor.score(self.params, rows, widths)

    def evaluate(self, decode: bool = False, num_examples: int | None = None) -> dict[str, dict[str, float]]:
        """`{task: {metric: value}}` of the config's evaluation task or mixture (`eval.task`,
        default `data.task`; `eval.split`; `num_examples` per task, default
        `eval.num_examples`, 0 for all): eval's score metrics and, with `decode`, its prediction
        metrics (`builder.params_evaluation`, what `//launchers:eval` runs), at `step`."""
        data_lib.register_tasks(self.spec.keys, self.spec.vocabulary)
        evaluator = builder.make_evaluator(self.spec, decode=decode, num_examples=num_examples)
        evaluate = builder.params_evaluation(
            self.spec, self.model, self.partitioner, evaluator, self.batch_size, decode, logging.DEBUG
        )
        result = evaluate(self.params, self.step)
        if result.errors:
            raise ValueError("; ".join(f"{t}: {'; '.join(e)}" for t, e in sorted(result.errors.items())))
        return {t: {k: float(v) for k, v in m.items()} for t, m in result.metrics.items()}

    # -- training --------------------------------------------------------------------------
    def _train_features(self, examples: Any) -> list[dict[str, list[int]]]:
        """Task features (ids) of string examples: `{"inputs", "targets"}` dicts for an
        encoder-decoder model; strings or `{"targets"}` dicts for a decoder-only one."""
        if isinstance(examples, (str, bytes, Mapping)) or not isinstance(examples, Sequence):
            raise TypeError(f"examples must be a list, got {type(examples).__name__}")
        if not examples:
            raise ValueError("examples is empty: give at least one example")
        want = ("targets",) if self.continues_prompt else ("inputs", "targets")
        out = []
        for i, ex in enumerate(examples):
            if isinstance(ex, str) and self.continues_prompt:
                ex = {"targets": ex}
            if not isinstance(ex, Mapping) or set(ex) != set(want) or not all(isinstance(ex[k], str) for k in want):
                shape = "a string or {'targets': str}" if self.continues_prompt else "{'inputs': str, 'targets': str}"
                raise TypeError(f"examples[{i}] must be {shape}, got {ex!r:.80}")
            feats = {"targets": self.encoding.target(ex["targets"], train=True)}
            if not self.continues_prompt:
                feats["inputs"] = self.encoding.prompt(ex["inputs"])
            out.append(feats)
        return out

    def train_batch(self, examples: Any) -> dict[str, np.ndarray]:
        """The model batch of string examples (`train_step`'s): the run's feature converter on
        their ids (one example per row), padded with empty rows to a multiple of the
        data-parallel devices times `trainer.num_microbatches`, in the dtypes the trainer was
        set up with."""
        rows = self._train_features(examples)
        multiple = self.partitioner.batch_parts() * self.spec.trainer.num_microbatches
        rows += [{k: [] for k in rows[0]}] * (-len(rows) % multiple)
        converter = data_lib.feature_converter(self.spec.reader)
        ragged = {k: Ragged.from_list([np.asarray(r[k], np.int32) for r in rows]) for k in rows[0]}
        batch = converter.convert_numpy(ragged, np.ones(len(rows), np.int64), dict(self.spec.reader.sequence_length))
        template = checkpoint_params.zero_batch(self.spec, 1)
        return {k: np.asarray(v, template[k].dtype) for k, v in batch.items()}

    def train_step(self, examples: Any) -> dict[str, float]:
        """One optimizer step of the run's trainer on `examples` (`train_batch`); returns the
        step's metrics (`loss`, `grad_norm`, `learning_rate`, ...). Later calls to `predict`
        and `score` see the updated params."""
        batch = self.train_batch(examples)
        self.trainer.setup(batch)  # at once when the shapes are those it was set up with
        self.state, metrics = self.trainer.train_step(self.state, self.partitioner.shard_batch(batch))
        self._params = None
        self.step += 1
        return {k: float(v) for k, v in jax.device_get(metrics).items()}

    def save(self, model_dir: str | os.PathLike) -> str:
        """Writes the current state as the checkpoint of step `step` under `model_dir` (a LoRA
        run's: its adapters) and the run's `config.json` there; returns the model_dir, which
        `from_run`, infer and eval read."""
        from cairn.trainer import Checkpointer

        model_dir = config_io.resolve_path(os.fspath(model_dir))
        stored = {**dict(self.spec.stored), "model_dir": model_dir}
        ckpt = Checkpointer(model_dir, self.spec.checkpoint)
        try:
            ckpt.save(self.step, self.state, {}, dict(self.spec.plain))
        finally:
            ckpt.close()
        config_io.write_config_json(stored, model_dir)
        return model_dir
