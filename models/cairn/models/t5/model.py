"""`EncoderDecoderModel`: a T5 network with its loss, scoring and decoding (t5x's model API)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from cairn.models import prompt_tuning
from cairn.models.losses import LossNormalizingFactor
from cairn.models.model_base import Batch, DecodeOptions, ModelBase, check_predict_args, run_decoding
from cairn.models.t5.config import T5Config
from cairn.models.t5.network import EncoderDecoder

Params = Any


class EncoderDecoderModel(ModelBase):
    """Wraps `t5.EncoderDecoder`. Batches use t5x's feature names: `encoder_input_tokens`,
    `decoder_input_tokens`, `decoder_target_tokens`, `decoder_loss_weights`, and when packed
    `encoder_segment_ids` / `decoder_segment_ids`. `params` is the unboxed parameter tree; a
    prompted one (`cairn.models.prompt_tuning`) puts its prompt in front of the encoder input."""

    prompts_encoder = True

    def __init__(
        self,
        config: T5Config,
        label_smoothing: float = 0.0,
        z_loss: float = 1e-4,
        loss_normalizing_factor: LossNormalizingFactor = None,
    ):
        super().__init__(config, EncoderDecoder(config), label_smoothing, z_loss, loss_normalizing_factor)

    def init_variables(self, rng: jax.Array, input_length: int = 8, target_length: int = 8) -> Any:
        """Variables with logical axis metadata (`nn.LogicallyPartitioned` boxes)."""
        enc = jnp.ones((1, input_length), jnp.int32)
        dec = jnp.ones((1, target_length), jnp.int32)
        return jax.jit(self.module.init)(rng, enc, dec)

    def init(self, rng: jax.Array, input_length: int = 8, target_length: int = 8) -> Params:
        """Random parameters (deterministic given `rng`)."""
        return super().init(rng, input_length, target_length)

    def call_args(self, batch: Batch) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """`EncoderDecoder`'s arguments for a teacher-forced pass."""
        args = (
            batch["encoder_input_tokens"],
            batch["decoder_input_tokens"],
            batch.get("encoder_segment_ids"),
            batch.get("decoder_segment_ids"),
        )
        return args, {}

    def predict_batch(
        self, params: Params, batch: Batch, options: DecodeOptions = DecodeOptions(), rng: jax.Array | None = None
    ) -> tuple[jnp.ndarray, jnp.ndarray]:
        """`(tokens [b * num_decodes, max_decode_length], scores [b * num_decodes])` decoded
        from `encoder_input_tokens` (each example's decodes adjacent).

        Tokens after EOS are 0. Scores: the log-probabilities of the generated tokens.
        """
        check_predict_args(options, rng)
        enc_tokens = jnp.asarray(batch["encoder_input_tokens"], jnp.int32)
        n = prompt_tuning.prompt_length(params)
        if n:
            prompted = prompt_tuning.prompt_batch({"encoder_input_tokens": enc_tokens}, self.config.vocab_size, n, True)
            enc_tokens = prompted["encoder_input_tokens"]
        enc_tokens = jnp.repeat(enc_tokens, options.rows_per_example, axis=0)
        rows, length = enc_tokens.shape[0], options.max_decode_length
        variables = {"params": params}
        encoded = self.module.apply(variables, enc_tokens, method=EncoderDecoder.encode)
        decode = EncoderDecoder.decode
        if options.use_cache:

            def make_cache(params, encoded, enc_tokens):
                # The sizing call: zero self-attention caches, and the cross-attention keys and
                # values projected once from `encoded` (jit drops the rest of the forward).
                _, mutated = self.module.apply(
                    {"params": params},
                    encoded,
                    enc_tokens,
                    jnp.zeros((rows, length), jnp.int32),
                    decode=True,
                    mutable=["cache"],
                    method=decode,
                )
                return mutated["cache"]

            cache = jax.jit(make_cache)(params, encoded, enc_tokens)

            def tokens_to_logits(tokens, cache, step):
                logits, mutated = self.module.apply(
                    {"params": params, "cache": cache},
                    encoded,
                    enc_tokens,
                    tokens[:, None],
                    decode=True,
                    mutable=["cache"],
                    method=decode,
                )
                return logits[:, 0], mutated["cache"]
        else:
            cache = jnp.zeros((rows, length), jnp.int32)  # the decoder inputs so far

            def tokens_to_logits(tokens, buffer, step):
                buffer = buffer.at[:, step].set(tokens)
                logits = self.module.apply(variables, encoded, enc_tokens, buffer, method=decode)
                return jnp.take(logits, step, axis=1), buffer

        b = batch["encoder_input_tokens"].shape[0]
        return run_decoding(options, tokens_to_logits, cache, b, rng, content=batch["encoder_input_tokens"])
