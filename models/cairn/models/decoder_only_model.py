"""`DecoderOnlyModel`: a GPT-style decoder with its loss, scoring and decoding."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from cairn.models import prompt_tuning
from cairn.models.decoding.beam_search import repeat_rows
from cairn.models.decoding.loop import with_first_logits
from cairn.models.decoding.prompts import left_align, prepend_prompts
from cairn.models.gpt.config import DecoderOnlyConfig
from cairn.models.llama.config import LlamaConfig
from cairn.models.losses import LossNormalizingFactor
from cairn.models.model_base import Batch, DecodeOptions, ModelBase, check_predict_args, run_decoding
from cairn.models.params import network_for

Params = Any


class DecoderOnlyModel(ModelBase):
    """Wraps a decoder-only network: `network`, else the one the config's family uses
    (`params.network_for`: `gpt.Decoder` for a `DecoderOnlyConfig`, `llama.Llama` for a
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

    def init_variables(self, rng: jax.Array, length: int = 8) -> Any:
        return jax.jit(self.module.init)(rng, jnp.ones((1, length), jnp.int32))

    def init(self, rng: jax.Array, length: int = 8) -> Params:
        """Random parameters (deterministic given `rng`)."""
        return super().init(rng, length)

    def call_args(self, batch: Batch) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The decoder's arguments for a teacher-forced pass."""
        args = (batch["decoder_input_tokens"], batch.get("decoder_segment_ids"), batch.get("decoder_causal_attention"))
        return args, {"decoder_positions": batch.get("decoder_positions")}

    def predict_batch(
        self,
        params: Params,
        prompts: jnp.ndarray,
        options: DecodeOptions = DecodeOptions(),
        rng: jax.Array | None = None,
    ) -> tuple[jnp.ndarray, jnp.ndarray]:
        """Continues each row of `prompts` `[b, p]` (right-padded with 0; may be all 0).

        Returns `(tokens [b * num_decodes, max_decode_length], scores [b * num_decodes])`:
        each row is its prompt (cut at `max_decode_length`) followed by the generated tokens
        (at most `options.max_new_tokens` when > 0: a row's budget is its own, whatever the
        other prompts), then 0; scores are the log-probabilities of the generated tokens. With
        `options.prefill` (the default) one forward pass over the left-aligned prompts fills
        the cache (bidirectionally over each prompt if `options.prefix_lm`), then the loop
        decodes step by step; otherwise the prompt is forced token by token (causally).

        Prompted params (`cairn.models.prompt_tuning`) put the learned prompt in front of all
        (prefill only). The config's `prompt_start_id` goes in front of every prompt (0 by default, T5's
        decoder start; an imported checkpoint's BOS); None puts nothing there, for prompts
        that begin with their own start token (then `prefill` is required).
        """
        check_predict_args(options, rng)
        start = self.prompt_start_id
        if start is None and not options.prefill:
            raise ValueError(
                "predict_batch(prefill=False) needs the config's prompt_start_id (None: the prompt's own first "
                "token starts it); use prefill=True"
            )
        prompts = jnp.asarray(prompts, jnp.int32)[:, : options.max_decode_length]
        n_prompt = prompt_tuning.prompt_length(params)
        if n_prompt and not options.prefill:
            raise ValueError("predict_batch with a prompt-tuned prompt needs prefill=True (the prompt is prefilled)")
        if not options.prefill:
            return self._predict_forced(params, prompts, options, rng)
        tokens, segments, lengths = left_align(prompts, start)
        if n_prompt:  # the learned prompt just before the start token (as in training)
            tokens, segments = prompt_tuning.prepend_to_aligned(tokens, segments, self.config.vocab_size, n_prompt)
        b, n = prompts.shape[0], options.rows_per_example
        prefix = segments if options.prefix_lm else None
        fed = min(options.max_decode_length, options.max_new_tokens or options.max_decode_length)
        total = tokens.shape[1] + fed - 1  # the prefill and the fed tokens (each row's budget, less 1)
        if options.use_cache:
            tokens_to_logits, cache = self._prefilled_steps(params, tokens, segments, prefix, total, n)
        else:
            tokens_to_logits, cache = self._recomputed_steps(params, tokens, segments, prefix, total, n)
        out, scores = run_decoding(options, tokens_to_logits, cache, b, rng, prompt_lengths=lengths, content=prompts)
        rows = jnp.repeat(jnp.arange(b), options.num_decodes)
        return prepend_prompts(prompts[rows], lengths[rows], out), scores

    @property
    def prompt_start_id(self) -> int | None:
        """The token put in front of every prompt: the config's `prompt_start_id` (0 without one)."""
        return getattr(self.config, "prompt_start_id", 0)

    def _prefilled_steps(self, params, tokens, segments, prefix, total: int, n: int):
        """One decode-mode pass over the left-aligned prompts fills a cache of `total`
        positions; its last logits are step 0's. Cache and logits repeated `n` times."""
        b, width = tokens.shape

        def make_cache():
            dummy = jnp.zeros((b, total), jnp.int32)
            return self.module.apply({"params": params}, dummy, decode=True, mutable=["cache"])[1]["cache"]

        cache = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(make_cache))

        def chunk(cache, tokens, segments, prefix=None):
            logits, mutated = self.module.apply(
                {"params": params, "cache": cache}, tokens, segments, prefix, decode=True, mutable=["cache"]
            )
            return logits, mutated["cache"]

        if prefix is None and width > 1:
            # Causal: all but the last column first (their logits are unused, so never computed:
            # the vocabulary projection of every prompt position would cost more than the rest).
            _, cache = chunk(cache, tokens[:, :-1], segments[:, :-1])
            logits, cache = chunk(cache, tokens[:, -1:], segments[:, -1:])
        else:  # a prefix LM's prompt attends within one chunk
            logits, cache = chunk(cache, tokens, segments, prefix)

        def step(tokens, cache, _):
            logits, mutated = self.module.apply(
                {"params": params, "cache": cache}, tokens[:, None], decode=True, mutable=["cache"]
            )
            return logits[:, 0], mutated["cache"]

        first = jnp.repeat(logits[:, -1], n, axis=0)
        return with_first_logits(step, first), repeat_rows(cache, n)

    def _recomputed_steps(self, params, tokens, segments, prefix, total: int, n: int):
        """Without a cache: a full forward over the left-aligned buffer (padding masked by
        segment id 0) at every step; the buffer, repeated `n` times, is the loop's state."""
        width = tokens.shape[1]
        pad = ((0, 0), (0, total - width))
        causal = None if prefix is None else jnp.repeat(jnp.pad(prefix, pad), n, axis=0)

        def step(tokens, state, step):
            buffer, segs = state
            pos = width - 1 + step  # step 0 reads the prompt's last position, later steps the fed token's
            fed = step > 0
            buffer = jnp.where(fed, buffer.at[:, pos].set(tokens), buffer)
            segs = jnp.where(fed, segs.at[:, pos].set(1), segs)
            logits = self.module.apply({"params": params}, buffer, segs, causal)
            return jnp.take(logits, pos, axis=1), (buffer, segs)

        return step, repeat_rows((jnp.pad(tokens, pad), jnp.pad(segments, pad)), n)

    def _predict_forced(self, params: Params, prompts: jnp.ndarray, options: DecodeOptions, rng: jax.Array | None):
        """The prompt forced token by token through the decoding loop (attended causally), after
        the start token (the loop feeds 0 at step 0; another `prompt_start_id` replaces it)."""
        if options.method == "beam":
            raise NotImplementedError("beam search with a forced prompt is not supported: use prefill=True")
        n = options.rows_per_example
        content, prompts = prompts, jnp.repeat(prompts, n, axis=0)
        rows, length = prompts.shape[0], options.max_decode_length
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

        start = self.prompt_start_id
        if start:
            inner = tokens_to_logits

            def tokens_to_logits(tokens, state, step):
                return inner(jnp.where(step == 0, start, tokens), state, step)

        return run_decoding(options, tokens_to_logits, cache, rows // n, rng, prompt=prompts, content=content)
