"""The prompt-length policy (`cairn.launchers.prompt_limit`): the limit from the config, a longer
prompt cut (a decoder-only prompt keeps its end, an encoder input its start and EOS) with one
warning naming the rows, or refused naming the first."""

import logging
from types import SimpleNamespace

import pytest

from cairn.launchers.prompt_limit import PromptLimit
from cairn.launchers.validation import ConfigError


def _spec(kind, lengths, max_input_length=0, long_inputs="truncate"):
    post = SimpleNamespace(max_input_length=max_input_length, long_inputs=long_inputs)
    keys = SimpleNamespace(model=SimpleNamespace(kind=kind), post_training=post)
    return SimpleNamespace(
        keys=keys, reader=SimpleNamespace(sequence_length=lengths), vocabulary=SimpleNamespace(eos_id=1)
    )


def test_the_limit_comes_from_the_config():
    assert PromptLimit.of(_spec("decoder_only", {"targets": 64})) == PromptLimit(64, False, True, 1)
    assert PromptLimit.of(_spec("llama", {"inputs": 32, "targets": 64})).max_tokens == 32
    assert PromptLimit.of(_spec("encoder_decoder", {"inputs": 16, "targets": 8})) == PromptLimit(16, False, False, 1)
    limit = PromptLimit.of(_spec("decoder_only", {"targets": 64}, 5, "refuse"))
    assert (limit.max_tokens, limit.refuse) == (5, True)


def test_a_longer_prompt_is_cut_with_one_warning_naming_its_rows(caplog):
    rows = [[5, 6, 7, 8, 9, 10], [3, 4], [11, 12, 13, 14, 15, 16, 17]]
    with caplog.at_level(logging.WARNING, logger="cairn.launchers.prompt_limit"):
        cut = PromptLimit(4, False, True).fit(rows, first_index=10)
    assert cut == [[7, 8, 9, 10], [3, 4], [14, 15, 16, 17]]
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "row 10 (6 tokens), 12 (7 tokens)" in message and "last" in message
    # An encoder input keeps its start, then its EOS (as the tasks trim).
    assert PromptLimit(4, False, False).fit([[5, 6, 7, 8, 9, 1], [5, 6, 7, 8, 9]]) == [[5, 6, 7, 1], [5, 6, 7, 8]]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cairn.launchers.prompt_limit"):
        assert PromptLimit(4, False, True).fit(rows[1:2]) == rows[1:2]
    assert not caplog.records  # nothing cut, nothing said


def test_refuse_names_the_first_longer_row():
    with pytest.raises(ConfigError, match=r"'post_training.max_input_length': input 11 has 6 tokens, more than 4"):
        PromptLimit(4, True, True).fit([[1, 2], [5, 6, 7, 8, 9, 10]], first_index=10)
