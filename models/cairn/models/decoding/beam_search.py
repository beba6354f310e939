"""Beam search with a length penalty `((5 + length) / 6) ** alpha` (Wu et al. 2016, as in t5x).

Beams are flattened into the batch (`b * beams`) for the model; the cache is reordered
when beams are reselected (`gather_beams`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from cairn.models.decoding.loop import TokensToLogits, row_budgets, without_padding

NEG_INF = -1.0e7


def length_penalty(length, alpha: float):
    return jnp.power((5.0 + length) / 6.0, alpha)


def _batch_axis(path, leaf) -> int:
    """Axis of the flattened batch in a cache leaf: 1 under a scanned `layers` stack, else 0;
    -1 for leaves without one (indices, length markers)."""
    scanned = any(getattr(k, "key", None) == "layers" for k in path)
    min_ndim = 3 if scanned else 2
    return (1 if scanned else 0) if leaf.ndim >= min_ndim else -1


def gather_beams(cache: Any, flat_indices: jnp.ndarray) -> Any:
    """Reorders every batch-carrying leaf of `cache` by `flat_indices` (into `b * beams`)."""

    def gather(path, leaf):
        axis = _batch_axis(path, leaf)
        return leaf if axis < 0 else jnp.take(leaf, flat_indices, axis=axis)

    return jax.tree_util.tree_map_with_path(gather, cache)


def repeat_rows(cache: Any, n: int) -> Any:
    """Repeats every batch-carrying leaf of `cache` `n` times (`b` rows -> `b * n`, each row's
    copies adjacent), e.g. a prefilled cache for `n` beams or samples per example."""
    rows = _batch_rows(cache)
    return gather_beams(cache, jnp.repeat(jnp.arange(rows), n))


def _batch_rows(cache: Any) -> int:
    for path, leaf in jax.tree_util.tree_flatten_with_path(cache)[0]:
        axis = _batch_axis(path, leaf)
        if axis >= 0:
            return int(leaf.shape[axis])
    raise ValueError("repeat_rows: the cache has no leaf with a batch axis")


def beam_search(
    tokens_to_logits: TokensToLogits,
    cache: Any,
    batch_size: int,
    num_beams: int,
    max_decode_len: int,
    alpha: float = 0.6,
    eos_id: int = 1,
    bos_id: int = 0,
    prompt_lengths: jnp.ndarray | None = None,
    max_new: int = 0,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """`(sequences [b, beams, len], scores [b, beams], log_probs [b, beams])`, best first.

    `cache` must already hold `b * num_beams` rows (each example repeated `num_beams` times).
    A sequence's score is its log-probability (`log_probs`) divided by the length penalty of
    its length (EOS included); an EOS candidate finishes a hypothesis only if it ranks among
    the top `num_beams` candidates of its step (as in transformers), so one beam is greedy
    decoding. `prompt_lengths` `[b]`: the cache holds prompts of these lengths (a prefill);
    row `r` then extends them by at most `max_decode_len - prompt_lengths[r]` tokens, and by
    at most `max_new` when it is > 0 (a row's budget then does not depend on the other rows'
    prompts; neither do its length penalties, which count the row's generated tokens).
    A hypothesis never holds the padding id 0 (`without_padding`). A row stops once no live
    beam can beat its finished ones (it keeps its beams while other rows go on); the loop stops
    when every row has.
    """
    b, k, L = batch_size, num_beams, max_decode_len
    if k < 1:
        raise ValueError(f"num_beams must be >= 1, got {num_beams}")
    if alpha < 0:
        raise ValueError(f"alpha (the length penalty's exponent) must be >= 0, got {alpha}")
    offsets = (jnp.arange(b) * k)[:, None]
    start = jnp.zeros((b,), jnp.int32) if prompt_lengths is None else prompt_lengths
    budget = jnp.maximum(row_budgets(L, start, max_new), 0)
    budget_f = budget.astype(jnp.float32)

    def running(step, live_logp, fin_scores, fin_flags):
        """`[b]`: the rows still searching: within their budget, and either not `num_beams`
        finished yet or with a live beam that could still beat the worst finished one."""
        best_live = live_logp[:, 0] / length_penalty(budget_f, alpha)
        worst_fin = jnp.min(jnp.where(fin_flags, fin_scores, NEG_INF), axis=1)
        all_fin = jnp.all(fin_flags, axis=1)
        return (~all_fin | (best_live > worst_fin)) & (step < budget)

    def cond(state):
        step, _, live_logp, _, fin_scores, fin_flags, _, _ = state
        return (step < L) & jnp.any(running(step, live_logp, fin_scores, fin_flags))

    def body(state):
        step, live_seqs, live_logp, fin_seqs, fin_scores, fin_flags, fin_logp, cache = state
        tokens = state_tokens(live_seqs, step)
        logits, cache = tokens_to_logits(tokens.reshape(b * k), cache, step)
        logp = without_padding(jax.nn.log_softmax(logits.astype(jnp.float32))).reshape(b, k, -1)
        vocab = logp.shape[-1]
        cand = (live_logp[:, :, None] + logp).reshape(b, k * vocab)
        vals, idx = jax.lax.top_k(cand, 2 * k)
        beam, tok = idx // vocab, (idx % vocab).astype(jnp.int32)
        seqs = jnp.take_along_axis(live_seqs, beam[:, :, None], axis=1)
        seqs = seqs.at[:, :, step].set(tok)
        is_eos = tok == eos_id
        # An ending counts only if it ranks among the top k candidates (so 1 beam is greedy).
        ends = is_eos & (jnp.arange(2 * k)[None, :] < k)
        # Live: the best k candidates that did not end.
        live_vals, live_sel = jax.lax.top_k(jnp.where(is_eos, NEG_INF, vals), k)
        new_live = jnp.take_along_axis(seqs, live_sel[:, :, None], axis=1)
        src_beam = jnp.take_along_axis(beam, live_sel, axis=1)
        # Finished: merge the candidates that ended with those already finished.
        new_scores = jnp.where(ends, vals / length_penalty(step + 1.0, alpha), NEG_INF)
        all_scores = jnp.concatenate([fin_scores, new_scores], axis=1)
        all_flags = jnp.concatenate([fin_flags, ends], axis=1)
        all_seqs = jnp.concatenate([fin_seqs, seqs], axis=1)
        all_logp = jnp.concatenate([fin_logp, jnp.where(ends, vals, NEG_INF)], axis=1)
        new_fin_scores, fin_sel = jax.lax.top_k(jnp.where(all_flags, all_scores, NEG_INF), k)
        # Rows that stopped (budget reached, or nothing left to gain) keep their beams and cache
        # rows as they are: what a row returns does not depend on how long the others search.
        active = running(step, live_logp, fin_scores, fin_flags)
        keep = lambda new, old: jnp.where(active.reshape((b,) + (1,) * (new.ndim - 1)), new, old)
        src_beam = keep(src_beam, jnp.broadcast_to(jnp.arange(k), (b, k)))
        cache = gather_beams(cache, (offsets + src_beam).reshape(b * k))
        return (
            step + 1,
            keep(new_live, live_seqs),
            keep(live_vals, live_logp),
            keep(jnp.take_along_axis(all_seqs, fin_sel[:, :, None], axis=1), fin_seqs),
            keep(new_fin_scores, fin_scores),
            keep(jnp.take_along_axis(all_flags, fin_sel, axis=1), fin_flags),
            keep(jnp.take_along_axis(all_logp, fin_sel, axis=1), fin_logp),
            cache,
        )

    def state_tokens(live_seqs, step):
        prev = jnp.take(live_seqs, jnp.maximum(step - 1, 0), axis=2)
        return jnp.where(step == 0, bos_id, prev)

    live_logp = jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32), (b, 1))
    state = (
        jnp.array(0, jnp.int32),
        jnp.zeros((b, k, L), jnp.int32),
        live_logp,
        jnp.zeros((b, k, L), jnp.int32),
        jnp.full((b, k), NEG_INF, jnp.float32),
        jnp.zeros((b, k), bool),
        jnp.full((b, k), NEG_INF, jnp.float32),
        cache,
    )
    step, live_seqs, live_logp, fin_seqs, fin_scores, fin_flags, fin_logp, _ = jax.lax.while_loop(cond, body, state)
    # Rows where nothing finished return their live beams (of length min(steps, budget)).
    none_finished = ~jnp.any(fin_flags, axis=1)
    live_len = jnp.minimum(step, budget).astype(jnp.float32)
    live_scores = live_logp / length_penalty(live_len, alpha)[:, None]
    seqs = jnp.where(none_finished[:, None, None], live_seqs, fin_seqs)
    scores = jnp.where(none_finished[:, None], live_scores, fin_scores)
    log_probs = jnp.where(none_finished[:, None], live_logp, fin_logp)
    # A row with no room left (budget 0) has one empty hypothesis, repeated.
    scores = jnp.where((budget == 0)[:, None], 0.0, scores)
    log_probs = jnp.where((budget == 0)[:, None], 0.0, log_probs)
    return seqs, scores, log_probs
