"""`vocabulary.kind = "tokenizer_json"`: the path is checked like a SentencePiece model's, and
the launcher builds a `TokenizerJsonVocabulary` with the config's sentinels."""

import pytest
from launch_util import tiny_tokenizer_json

from cairn.launchers import config_base, run_spec, validation
from cairn.launchers import data as data_lib
from cairn.launchers.validation import ConfigError
from cairn.tokenizers import TokenizerJsonVocabulary


def config_for(path):
    """The typed keys (`run_spec.checked_keys`) of a config with a tokenizer.json vocabulary at `path`."""
    config = config_base.base_config()
    config.vocabulary.kind = "tokenizer_json"
    config.vocabulary.path = str(path)
    config.vocabulary.extra_ids = 5
    return run_spec.checked_keys(config)[1]


def test_a_missing_or_empty_path_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"'vocabulary.path': no such file '.*absent/tokenizer.json'"):
        validation.check_paths(config_for(tmp_path / "absent" / "tokenizer.json"))
    with pytest.raises(ConfigError, match="tokenizer_json vocabulary needs a Hugging Face tokenizer.json path"):
        validation.check_paths(config_for(""))


def test_the_launcher_builds_the_vocabulary(tmp_path):
    config = config_for(tiny_tokenizer_json(tmp_path / "tokenizer.json"))
    validation.check_paths(config)
    vocab = data_lib.make_vocabulary(config)
    assert isinstance(vocab, TokenizerJsonVocabulary)
    assert (vocab.eos_id, vocab.extra_ids) == (1, 5)
    assert vocab.encode("<extra_id_0>") == [vocab.vocab_size - 1]
    assert vocab.decode(vocab.encode("that is the question")) == "that is the question"
