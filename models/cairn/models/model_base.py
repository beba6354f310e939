"""What `EncoderDecoderModel` and `DecoderOnlyModel` share: loss options, metrics, decoding dispatch."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from cairn.models import decoding, prompt_tuning
from cairn.models.argmax import argmax_last
from cairn.models.chunked_loss import Unembedding, chunked_cross_entropy, chunked_token_log_probs
from cairn.models.fp8 import FP8_STATE, initial_amax_history
from cairn.models.losses import LossNormalizingFactor, normalizing_weights, weighted_cross_entropy
from cairn.models.moe_metrics import COLLECTION as MOE_COLLECTION
from cairn.models.moe_metrics import moe_losses

Batch = Mapping[str, jnp.ndarray]
DECODE_METHODS = ("greedy", "sample", "beam")


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """How `predict_batch` decodes.

    `method`: greedy, sample (`temperature`, `top_k`: the k most likely tokens, 0 all;
    `top_p`: the smallest set of tokens whose probability reaches p, 1 all; from the stateless
    `rng` given to `predict_batch`, each row's key folded with an id of its prompt, so that a
    row's sample does not depend on its batch) or beam (`num_beams`, t5x's brevity penalty
    `((5 + length) / 6) ** alpha` dividing a finished beam's log-probability, `alpha` >= 0,
    0: none). `num_decodes`: outputs per example (sample: independent samples; beam: the best
    `num_decodes` beams, at most `num_beams`), returned as `b * num_decodes` rows, each
    example's adjacent. `max_decode_length`: the columns returned (a decoder-only model's
    prompt and continuation); `max_new_tokens` > 0: each row generates at most that many tokens
    after its own prompt (0: as many as the columns leave), whatever the other rows' prompts, so
    callers that pad prompts to a width `w` ask for `max_decode_length = w + new` and
    `max_new_tokens = new`. Decoder-only
    prompts: `prefill` runs one forward pass over the prompts to fill the cache (False:
    force them token by token through the loop, causally; no beam search then);
    `prefix_lm` lets the prompt attend bidirectionally within itself during the prefill,
    as a prefix LM trained with `decoder_causal_attention` on its inputs expects.
    """

    method: str = "greedy"
    max_decode_length: int = 32
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    num_beams: int = 4
    alpha: float = 0.6
    eos_id: int = 1
    use_cache: bool = True
    num_decodes: int = 1
    prefill: bool = True
    prefix_lm: bool = False
    max_new_tokens: int = 0

    def __post_init__(self):
        if self.method not in DECODE_METHODS:
            raise ValueError(f"DecodeOptions.method must be one of {DECODE_METHODS}, got {self.method!r}")
        if self.max_decode_length < 1:
            raise ValueError(f"DecodeOptions.max_decode_length must be >= 1, got {self.max_decode_length}")
        if self.max_new_tokens < 0:
            raise ValueError(f"DecodeOptions.max_new_tokens must be >= 0 (0: no cap), got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"DecodeOptions.temperature must be >= 0 (0: greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"DecodeOptions.top_k must be >= 0 (0: all tokens), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"DecodeOptions.top_p must be in (0, 1] (1: all tokens), got {self.top_p}")
        if self.alpha < 0:
            raise ValueError(f"DecodeOptions.alpha (the length penalty's exponent) must be >= 0, got {self.alpha}")
        if self.num_beams < 1:
            raise ValueError(f"DecodeOptions.num_beams must be >= 1, got {self.num_beams}")
        if self.num_decodes < 1:
            raise ValueError(f"DecodeOptions.num_decodes must be >= 1, got {self.num_decodes}")
        if self.method == "greedy" and self.num_decodes > 1:
            raise ValueError("DecodeOptions.num_decodes > 1 needs method 'sample' or 'beam' (greedy decodes agree)")
        if self.method == "beam" and self.num_decodes > self.num_beams:
            raise ValueError(
                f"DecodeOptions.num_decodes ({self.num_decodes}) must be <= num_beams ({self.num_beams}) for beam"
            )
        if self.prefix_lm and not self.prefill:
            raise ValueError("DecodeOptions.prefix_lm needs prefill=True (a forced prompt is attended causally)")

    @property
    def rows_per_example(self) -> int:
        """Cache rows per example: `num_beams` for beam, `num_decodes` for sampling, else 1."""
        if self.method == "beam":
            return self.num_beams
        return self.num_decodes if self.method == "sample" else 1


def loss_and_metrics(
    logits, batch: Batch, label_smoothing: float, z_loss: float, loss_normalizing_factor: LossNormalizingFactor
) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
    """The training loss of `logits` against `decoder_target_tokens`, and t5x-style metrics."""
    targets = batch["decoder_target_tokens"]
    weights = batch.get("decoder_loss_weights")
    if weights is None:
        weights = (targets > 0).astype(jnp.float32)
    loss, z, weight_sum = weighted_cross_entropy(
        logits,
        targets,
        weights,
        label_smoothing=label_smoothing,
        z_loss=z_loss,
        loss_normalizing_factor=loss_normalizing_factor,
        segment_ids=batch.get("decoder_segment_ids"),
    )
    correct = (argmax_last(logits) == targets).astype(jnp.float32) * (weights > 0)
    metrics = {
        "loss": loss,
        "z_loss": z,
        "cross_ent_loss": loss - z,
        "weight_sum": weight_sum,
        "accuracy": jnp.sum(correct) / jnp.maximum(jnp.sum(weights > 0), 1),
    }
    return loss, metrics


def chunked_loss_and_metrics(
    head: Unembedding,
    batch: Batch,
    label_smoothing: float,
    z_loss: float,
    loss_normalizing_factor: LossNormalizingFactor,
    chunk_size: int,
) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
    """`loss_and_metrics` from a network's hidden states and output projection
    (`return_hidden=True`), the logits computed `chunk_size` tokens at a time
    (`cairn.models.chunked_loss`): the same loss and metrics, never the whole logits tensor."""
    targets = batch["decoder_target_tokens"]
    weights = batch.get("decoder_loss_weights")
    weights = (targets > 0).astype(jnp.float32) if weights is None else weights.astype(jnp.float32)
    loss_weights, factor = normalizing_weights(
        weights, targets, loss_normalizing_factor, batch.get("decoder_segment_ids")
    )
    loss, z, correct = chunked_cross_entropy(
        head,
        targets,
        loss_weights,
        chunk_size,
        label_smoothing=label_smoothing,
        z_loss=z_loss,
        accuracy_mask=weights > 0,
    )
    if factor is not None:
        factor = jnp.maximum(factor, 1e-8)
        loss, z = loss / factor, z / factor
    metrics = {
        "loss": loss,
        "z_loss": z,
        "cross_ent_loss": loss - z,
        "weight_sum": jnp.sum(loss_weights),
        "accuracy": correct / jnp.maximum(jnp.sum(weights > 0), 1),
    }
    return loss, metrics


def sequence_log_likelihood(logits, targets, weights=None) -> jnp.ndarray:
    """`[b]`: the summed log-probability of each row's target tokens (weights default to targets > 0)."""
    if weights is None:
        weights = (targets > 0).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    token = jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return jnp.sum(token * weights, axis=-1)


def check_predict_args(options: DecodeOptions, rng: jax.Array | None) -> None:
    """Fails before any computation when `predict_batch`'s arguments cannot work."""
    if not isinstance(options, DecodeOptions):
        raise TypeError(f"options must be a DecodeOptions, got {type(options).__name__}")
    if options.method == "sample" and rng is None:
        raise ValueError("predict_batch(method='sample') needs rng (a jax.random key)")


def run_decoding(
    options: DecodeOptions,
    tokens_to_logits,
    cache: Any,
    batch_size: int,
    rng: jax.Array | None,
    prompt=None,
    prompt_lengths=None,
    content=None,
):
    """Dispatches to the decoding algorithm; returns `(tokens [b * n, len], scores [b * n])`.

    `n = options.num_decodes`; `cache` holds `batch_size * options.rows_per_example` rows.
    Scores: the summed log-probability of each row's generated tokens (beams are ranked by
    it divided by the length penalty). `prompt` `[b * n, p]` is forced token by token;
    `prompt_lengths` `[batch_size]` says the cache already holds prompts of these lengths:
    the tokens are then the continuations only (see `decoding.decode_loop`). Each row
    generates at most `options.max_new_tokens` tokens (when > 0). `content` `[batch_size, w]`:
    the tokens each example's sampling keys derive from (`decoding.content_ids`; default the
    row index).
    """
    n_rows = options.rows_per_example
    rows, new = batch_size * n_rows, options.max_new_tokens
    row_lengths = None if prompt_lengths is None else jnp.repeat(prompt_lengths, n_rows)
    if options.method == "greedy":
        return decoding.greedy_decode(
            tokens_to_logits, cache, rows, options.max_decode_length, options.eos_id, prompt, row_lengths, new
        )
    if options.method == "sample":
        if rng is None:
            raise ValueError("predict_batch(method='sample') needs rng (a jax.random key)")
        return decoding.sample_decode(
            tokens_to_logits,
            cache,
            rows,
            options.max_decode_length,
            rng,
            options.temperature,
            options.top_k,
            options.top_p,
            options.eos_id,
            prompt,
            row_lengths,
            new,
            None if content is None else decoding.content_ids(content, n_rows),
        )
    if prompt is not None:
        raise NotImplementedError("beam search with a forced prompt is not supported (use prefill)")
    seqs, _, log_probs = decoding.beam_search(
        tokens_to_logits,
        cache,
        batch_size,
        options.num_beams,
        options.max_decode_length,
        options.alpha,
        options.eos_id,
        prompt_lengths=prompt_lengths,
        max_new=new,
    )
    n = options.num_decodes
    return seqs[:, :n].reshape(batch_size * n, -1), log_probs[:, :n].reshape(batch_size * n)


class ModelBase:
    """The parts of a model wrapper that depend only on `apply` and the loss options.

    Subclasses set `config` and `module` and define `init_variables` and `call_args`.
    """

    module: nn.Module
    prompts_encoder = False  # where a prompt-tuned prompt goes: the encoder input (T5), else the decoder's

    def __init__(
        self,
        config: Any,
        module: nn.Module,
        label_smoothing: float = 0.0,
        z_loss: float = 1e-4,
        loss_normalizing_factor: LossNormalizingFactor = None,
    ):
        self.config = config
        self.module = module
        self.label_smoothing = label_smoothing
        self.z_loss = z_loss
        self.loss_normalizing_factor = loss_normalizing_factor

    def init_variables(self, rng: jax.Array, *args: Any, **kwargs: Any) -> Any:
        """The network's variables, every collection, for inputs of the given lengths (per model)."""
        raise NotImplementedError

    def init_boxed(self, rng: jax.Array, *args: Any, **kwargs: Any) -> Any:
        """Params with logical axis metadata (`nn.LogicallyPartitioned` boxes) for inputs of the
        given lengths (`init_variables`' "params")."""
        return self.init_variables(rng, *args, **kwargs)["params"]

    def init_model_state(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """What a train step carries beside the params and replaces with its gradient, for inputs
        of the given lengths: `{FP8_STATE: empty amax histories}` under `matmul_precision="fp8"`
        (`cairn.models.fp8`; give it to `loss_fn(collections=...)`), else None."""
        if getattr(self.config, "matmul_precision", "default") != "fp8":
            return None
        shapes = jax.eval_shape(lambda: self.init_variables(jax.random.PRNGKey(0), *args, **kwargs))
        return {FP8_STATE: jax.tree.map(lambda s: jnp.broadcast_to(initial_amax_history(), s.shape), shapes[FP8_STATE])}

    def call_args(self, batch: Batch) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The network's positional and keyword arguments for a teacher-forced pass over `batch`."""
        raise NotImplementedError

    def apply(self, params: Any, batch: Batch, dropout_rng: jax.Array | None = None) -> jnp.ndarray:
        """Logits `[b, target_len, vocab]` (teacher forcing; dropout when `dropout_rng` is given)."""
        return self.apply_with_aux(params, batch, dropout_rng)[0]

    def apply_with_aux(
        self,
        params: Any,
        batch: Batch,
        dropout_rng: jax.Array | None = None,
        return_hidden: bool = False,
        collections: Mapping[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """`(logits, moe)`: the logits and what routed MLPs sowed (the `moe` collection; {} for
        a dense model: see `cairn.models.moe`). `return_hidden`: a `chunked_loss.Unembedding`
        (hidden states and output projection) in place of the logits. `collections`: more
        variable collections for the network (`layers.LORA`: LoRA adapters). Prompted params
        (`cairn.models.prompt_tuning`): the prompt goes in front of each row, and the outputs
        are the rows' own positions (the prompt's are dropped)."""
        n = prompt_tuning.prompt_length(params)
        if n:
            batch = prompt_tuning.prompt_batch(batch, self.config.vocab_size, n, self.prompts_encoder)
        out, aux = self._apply_with_aux(params, batch, dropout_rng, return_hidden, collections)
        if n and not self.prompts_encoder:  # the decoder's outputs at the prompt positions
            out = dataclasses.replace(out, hidden=out.hidden[:, n:]) if return_hidden else out[:, n:]
        return out, aux

    def _apply_with_aux(
        self,
        params: Any,
        batch: Batch,
        dropout_rng: jax.Array | None,
        return_hidden: bool,
        collections: Mapping[str, Any] | None,
    ) -> tuple[Any, dict[str, Any]]:
        args, kwargs = self.call_args(batch)
        if return_hidden:
            kwargs = {**kwargs, "return_hidden": True}
        rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
        deterministic = dropout_rng is None
        variables = {"params": params, **(collections or {})}
        if getattr(self.config, "moe", None) is None:
            logits: Any = self.module.apply(variables, *args, deterministic=deterministic, rngs=rngs, **kwargs)
            return logits, {}
        out: Any = self.module.apply(
            variables, *args, deterministic=deterministic, rngs=rngs, mutable=[MOE_COLLECTION], **kwargs
        )
        logits, state = out
        return logits, dict(state.get(MOE_COLLECTION, {}))

    def init(self, rng: jax.Array, *args: Any, **kwargs: Any) -> Any:
        """Random parameters (deterministic given `rng`)."""
        return nn.meta.unbox(self.init_boxed(rng, *args, **kwargs))

    def logical_axes(self) -> Any:
        """PartitionSpecs of logical axis names, shaped like the params."""
        return nn.get_partition_spec(jax.eval_shape(lambda: self.init_boxed(jax.random.PRNGKey(0))))

    def loss_fn(
        self,
        params: Any,
        batch: Batch,
        dropout_rng: jax.Array | None = None,
        collections: Mapping[str, Any] | None = None,
    ) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
        """`(loss, metrics)`: cross-entropy with label smoothing and z-loss, normalised as configured
        (with `config.loss_chunk_size` > 0 computed in chunks of that many tokens from the hidden
        states: `chunked_loss_and_metrics`); with routed MLPs, plus the weighted router losses
        (`moe/aux_loss`, and the `moe/*` metrics of `cairn.models.moe_metrics.moe_losses`).
        `collections`: as `apply_with_aux`'s."""
        chunk = self.loss_chunk_size
        out, aux = self.apply_with_aux(params, batch, dropout_rng, return_hidden=chunk > 0, collections=collections)
        if chunk > 0:
            loss, metrics = chunked_loss_and_metrics(
                out, batch, self.label_smoothing, self.z_loss, self.loss_normalizing_factor, chunk
            )
        else:
            loss, metrics = loss_and_metrics(
                out, batch, self.label_smoothing, self.z_loss, self.loss_normalizing_factor
            )
        routed = moe_losses(aux, getattr(self.config, "moe", None))
        if routed:
            loss = loss + routed["moe/aux_loss"]
            metrics = {**metrics, **routed, "loss": loss}
        return loss, metrics

    def score_batch(self, params: Any, batch: Batch) -> jnp.ndarray:
        """`[b]`: log-likelihood of each row's targets (weighted by `decoder_loss_weights` if given)."""
        targets, weights = batch["decoder_target_tokens"], batch.get("decoder_loss_weights")
        chunk = self.loss_chunk_size
        if chunk <= 0:
            return sequence_log_likelihood(self.apply(params, batch), targets, weights)
        head, _ = self.apply_with_aux(params, batch, return_hidden=True)
        if weights is None:
            weights = (targets > 0).astype(jnp.float32)
        return jnp.sum(chunked_token_log_probs(head, targets, chunk) * weights, axis=-1)

    @property
    def loss_chunk_size(self) -> int:
        """The config's `loss_chunk_size` (0, the whole-logits loss, for a config without one)."""
        return int(getattr(self.config, "loss_chunk_size", 0) or 0)
