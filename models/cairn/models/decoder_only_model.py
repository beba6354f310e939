"""`DecoderOnlyModel`: a GPT-style decoder with its loss, scoring and decoding."""

from __future__ import annotations

from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp

from cairn.models.decoder_only import DecoderOnlyConfig
from cairn.models.llama.config import LlamaConfig
from cairn.models.losses import LossNormalizingFactor
from cairn.models.model_base import Batch, DecodeOptions, ModelBase, check_predict_args, run_decoding
from cairn.models.params import network_for

Params = Any


class DecoderOnlyModel(ModelBase):
    """Wraps a decoder-only network: `network`, else the one the config's family uses
    (`params.network_for`: `decoder_only.Decoder` for a `DecoderOnlyConfig`, `llama.Llama` for a
    `LlamaConfig`). Batches: `decoder_input_tokens`, `decoder_target_tokens`,
    `decoder_loss_weights`, optional `decoder_segment_ids` and `decoder_positions` (packing)
    and `decoder_causal_attention` (prefix LM: 1 on input positions)."""

    def __init__(
        self,
        config: DecoderOnlyConfig | LlamaConfig,
        label_smoothing: float = 0.0,
        z_loss: float = 1e-4,
        loss_normalizing_factor: LossNormalizingFactor = None,
        network: nn.Module | None = None,
    ):
        module = network if network is not None else network_for(config)
        super().__init__(config, module, label_smoothing, z_loss, loss_normalizing_factor)

    def init_boxed(self, rng: jax.Array, length: int = 8) -> Any:
        return jax.jit(self.module.init)(rng, jnp.ones((1, length), jnp.int32))["params"]

    def init(self, rng: jax.Array, length: int = 8) -> Params:
        """Random parameters (deterministic given `rng`)."""
        return super().init(rng, length)

    def apply(self, params: Params, batch: Batch, dropout_rng: jax.Array | None = None) -> jnp.ndarray:
        rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
        logits = self.module.apply(
            {"params": params},
            batch["decoder_input_tokens"],
            batch.get("decoder_segment_ids"),
            batch.get("decoder_causal_attention"),
            deterministic=dropout_rng is None,
            decoder_positions=batch.get("decoder_positions"),
            rngs=rngs,
        )
        return cast(jnp.ndarray, logits)

    def predict_batch(
        self,
        params: Params,
        prompts: jnp.ndarray,
        options: DecodeOptions = DecodeOptions(),
        rng: jax.Array | None = None,
    ) -> tuple[jnp.ndarray, jnp.ndarray]:
        """Continues each row of `prompts` `[b, p]` (right-padded with 0; may be all 0).

        Returns `(tokens [b, max_decode_length], scores [b])`; each row starts with its prompt
        (forced, attended causally even for prefix-LM configs) followed by the generated tokens.
        Beam search takes no prompt (`prompts` of shape `[b, 0]`).
        """
        check_predict_args(options, rng)
        prompts = jnp.asarray(prompts, jnp.int32)
        rows, length = prompts.shape[0], options.max_decode_length
        prompt: jax.Array | None = prompts
        if options.method == "beam":
            if prompts.shape[1]:
                raise NotImplementedError("beam search with a prompt is not supported: pass prompts of shape [b, 0]")
            prompt, rows = None, rows * options.num_beams
        variables = {"params": params}
        if options.use_cache:

            def make_cache():
                _, mutated = self.module.apply(
                    variables, jnp.zeros((rows, length), jnp.int32), decode=True, mutable=["cache"]
                )
                return mutated["cache"]

            cache = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(make_cache))

            def tokens_to_logits(tokens, cache, step):
                logits, mutated = self.module.apply(
                    {"params": params, "cache": cache}, tokens[:, None], decode=True, mutable=["cache"]
                )
                return logits[:, 0], mutated["cache"]
        else:
            cache = jnp.zeros((rows, length), jnp.int32)

            def tokens_to_logits(tokens, buffer, step):
                buffer = buffer.at[:, step].set(tokens)
                return jnp.take(self.module.apply(variables, buffer), step, axis=1), buffer

        return run_decoding(options, tokens_to_logits, cache, prompts.shape[0], rng, prompt)
