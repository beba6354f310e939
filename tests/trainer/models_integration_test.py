"""cairn.models' EncoderDecoderModel trains through the Trainer (T5.1.1-tiny's shapes with a small
vocabulary and one encoder and one decoder layer: the loop does not depend on the depth)."""

import numpy as np
from mesh_util import make_partitioner

import cairn.models as models
from cairn.trainer import OptimizerConfig, Trainer, TrainerConfig


class Batches:
    def __init__(self, vocab, batch=8, length=16):
        self.vocab, self.batch, self.length, self.position = vocab, batch, length, 0

    def __iter__(self):
        return self

    def __next__(self):
        rng = np.random.default_rng([0, self.position])
        self.position += 1
        tgt = rng.integers(2, self.vocab, size=(self.batch, self.length), dtype=np.int32)
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
