"""Decoding algorithms over a `tokens_to_logits` function: greedy, sampling, beam search."""

from cairn.models.decoding.beam_search import beam_search, gather_beams, length_penalty
from cairn.models.decoding.greedy import greedy_decode
from cairn.models.decoding.loop import decode_loop
from cairn.models.decoding.sampling import filter_logits, sample_decode

__all__ = [
    "beam_search",
    "decode_loop",
    "filter_logits",
    "gather_beams",
    "greedy_decode",
    "length_penalty",
    "sample_decode",
]
