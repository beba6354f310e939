"""Decoding algorithms over a `tokens_to_logits` function: greedy, sampling, beam search."""

from cairn.models.decoding.beam_search import beam_search, gather_beams, length_penalty, repeat_rows
from cairn.models.decoding.greedy import greedy_decode
from cairn.models.decoding.loop import decode_loop, with_first_logits
from cairn.models.decoding.prompts import content_ids, left_align, prepend_prompts, prompt_lengths
from cairn.models.decoding.sampling import filter_logits, sample_decode

__all__ = [
    "beam_search",
    "content_ids",
    "decode_loop",
    "filter_logits",
    "gather_beams",
    "greedy_decode",
    "left_align",
    "length_penalty",
    "prepend_prompts",
    "prompt_lengths",
    "repeat_rows",
    "sample_decode",
    "with_first_logits",
]
