"""cairn.models' EncoderDecoderModel trains through the Trainer (T5.1.1-tiny's shapes with a small
vocabulary and one encoder and one decoder layer: the loop does not depend on the depth), and a
LoRA run (`cairn.models.lora.LoraModel`): only the adapters train and have optimizer state, the
base is the state's frozen tree (sharded by its own specs, never changed, never checkpointed),
evaluation sees the merged params, and a resumed run is given the base again."""

import dataclasses

import jax
import numpy as np
import pytest
from mesh_util import make_partitioner

import cairn.models as models
from cairn.trainer import OptimizerConfig, Trainer, TrainerConfig, stored_params


class Batches:
    """Random batches for an encoder-decoder model; `decoder_only`: decoder features alone, and
    `period` > 0 repeats the first `period` batches (a stream a model can fit)."""

    def __init__(self, vocab, batch=8, length=16, decoder_only=False, period=0):
        self.vocab, self.batch, self.length, self.position = vocab, batch, length, 0
        self.decoder_only, self.period = decoder_only, period

    def __iter__(self):
        return self

    def __next__(self):
        rng = np.random.default_rng([0, self.position % self.period if self.period else self.position])
        self.position += 1
        tgt = rng.integers(2, self.vocab, size=(self.batch, self.length), dtype=np.int32)
        if self.decoder_only:
            return {"decoder_input_tokens": np.pad(tgt[:, :-1], ((0, 0), (1, 0))), "decoder_target_tokens": tgt}
        return {
            "encoder_input_tokens": tgt[:, ::-1].copy(),
            "decoder_input_tokens": np.pad(tgt[:, :-1], ((0, 0), (1, 0))),
            "decoder_target_tokens": tgt,
            "decoder_loss_weights": np.ones(tgt.shape, np.float32),
        }

    def get_state(self):
        return {"position": self.position}

    def set_state(self, state):
        self.position = state["position"]


def test_t5_tiny_trains_with_accumulation_and_model_sharding(tmp_path):
    config = models.get_preset("t5_1_1_tiny", vocab_size=64, num_encoder_layers=1, num_decoder_layers=1)
    model = models.EncoderDecoderModel(config)
    cfg = TrainerConfig(
        model_dir=str(tmp_path),
        num_train_steps=4,
        log_every=2,
        num_microbatches=2,
        microbatch_reduction="sum",
        tensorboard=False,
        flops_per_token=1e6,
    )
    trainer = Trainer(model, OptimizerConfig(), 0.01, make_partitioner(4, 2), cfg)
    result = trainer.train(Batches(config.vocab_size))
    assert result.step == 4 and np.isfinite(result.metrics["loss"])
    assert 0 <= result.metrics["accuracy"] <= 1
    sharded = [x for x in __import__("jax").tree.leaves(result.state.params) if not x.sharding.is_fully_replicated]
    assert sharded, "no parameter is sharded over the model axis"


def _lm_batches():
    """Decoder-only batches of a 64-token vocabulary, two batches repeating (the adapters can fit them)."""
    return Batches(64, decoder_only=True, period=2)


def test_lora_trains_only_the_adapters_and_resumes_with_its_base(tmp_path):
    base_model = models.DecoderOnlyModel(models.get_preset("llama_tiny", vocab_size=64))
    model = models.LoraModel(base_model, models.LoraConfig(rank=4, alpha=8.0))
    base = jax.jit(base_model.init)(jax.random.PRNGKey(0))
    loss_fn = jax.jit(base_model.loss_fn)
    seen = []

    def eval_fn(params, step):  # evaluation gets the base model's params, adapters merged in
        seen.append((step, jax.tree.structure(params) == jax.tree.structure(base)))
        return {"loss": float(loss_fn(params, next(_lm_batches()))[0])}

    def run(steps):
        cfg = TrainerConfig(
            model_dir=str(tmp_path), num_train_steps=steps, log_every=2, eval_every=steps, tensorboard=False
        )
        trainer = Trainer(model, OptimizerConfig(name="adamw"), 1e-2, make_partitioner(4, 2), cfg, eval_fn=eval_fn)
        return trainer, trainer.train(_lm_batches(), frozen_params=base)

    trainer, result = run(6)
    state = result.state
    adapters = jax.tree.leaves(state.params)
    n_adapter = sum(x.size for x in adapters)
    assert n_adapter == models.lora.adapter_count(model.init(jax.random.PRNGKey(0)))
    opt_sizes = [x.size for x in jax.tree.leaves(state.opt_state)]
    assert sum(opt_sizes) - opt_sizes.count(1) == 2 * n_adapter  # AdamW's two moments, for the adapters alone
    jax.tree.map(np.testing.assert_array_equal, state.frozen, base)  # the base never moves
    sharded = [x for x in jax.tree.leaves(state.frozen) if not x.sharding.is_fully_replicated]
    assert sharded, "the frozen base is not sharded over the model axis"
    lora_b = [
        x for p, x in jax.tree_util.tree_flatten_with_path(state.params)[0] if "lora_b" in jax.tree_util.keystr(p)
    ]
    assert all(np.abs(np.asarray(x)).max() > 0 for x in lora_b)  # trained away from their zero init
    losses = [float(loss_fn(p, next(_lm_batches()))[0]) for p in (base, trainer.eval_params(state))]
    assert losses[1] < losses[0] - 0.1, losses  # the merged adapters fit the (repeating) batches
    assert seen == [(6, True)] and np.isclose(result.metrics.get("eval/loss", losses[1]), losses[1])
    stored = stored_params(str(tmp_path))
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(stored)[0]]
    assert paths and all(p.endswith(("['lora_a']", "['lora_b']")) for p in paths)  # no base weights written

    with pytest.raises(ValueError, match="frozen_params"):
        Trainer(model, OptimizerConfig(name="adamw"), 1e-2, make_partitioner(4, 2), trainer.config).train(_lm_batches())
    offloaded = dataclasses.replace(trainer.config, offload_params=True)  # not with a frozen tree
    with pytest.raises(ValueError, match="offload_params is not supported for a model with a frozen tree"):
        Trainer(model, OptimizerConfig(name="adamw"), 1e-2, make_partitioner(4, 2), offloaded).setup(
            next(_lm_batches())
        )
    _, resumed = run(8)
    assert resumed.step == 8
    jax.tree.map(np.testing.assert_array_equal, resumed.state.frozen, base)


def test_prompt_tuning_trains_only_the_prompt(tmp_path):
    """A prompt-tuning run (`cairn.models.PromptTuningModel`) on the GPT-style decoder: the
    params and optimizer state are the prompt's alone, the base never moves, the checkpoint holds
    the prompt only, and the prompted loss on the (repeating) batches falls."""
    base_model = models.DecoderOnlyModel(models.get_preset("decoder_only_tiny", vocab_size=64))
    model = models.PromptTuningModel(base_model, models.PromptTuningConfig(length=4))
    base = jax.jit(base_model.init)(jax.random.PRNGKey(0))
    init = model.initial_params(jax.random.PRNGKey(1), base)  # sampled vocabulary rows
    cfg = TrainerConfig(model_dir=str(tmp_path), num_train_steps=8, log_every=4, tensorboard=False)
    trainer = Trainer(model, OptimizerConfig(name="adamw"), 3e-2, make_partitioner(4, 2), cfg)
    result = trainer.train(_lm_batches(), init_params=init, frozen_params=base)
    state = result.state
    assert jax.tree.structure(state.params) == jax.tree.structure(init)
    opt_sizes = [x.size for x in jax.tree.leaves(state.opt_state)]
    assert sum(opt_sizes) - opt_sizes.count(1) == 2 * 4 * base["token_embedder"]["embedding"].shape[1]
    jax.tree.map(np.testing.assert_array_equal, state.frozen, base)
    loss_fn = jax.jit(base_model.loss_fn)
    merged = trainer.eval_params(state)
    assert merged["token_embedder"]["prompt"].shape == (4, base["token_embedder"]["embedding"].shape[1])
    losses = [float(loss_fn(p, next(_lm_batches()))[0]) for p in (model.merged(init, base), merged)]
    assert losses[1] < losses[0] - 0.1, losses
    stored = stored_params(str(tmp_path))
    assert [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(stored)[0]] == [
        "['token_embedder']['prompt']"
    ]
