"""launchers/README.md's decoding keys against the config schema: the table lists exactly the
`post_training` decoding keys, with their defaults, and the sections table names every key."""

import pathlib
import re

from cairn.launchers import schema

README = pathlib.Path(__file__).absolute().parents[2] / "launchers" / "README.md"
# post_training keys that are not decoding keys (the README's decoding table lists the others).
_NOT_DECODING = {"final_eval", "num_samples", "prompts"}


def test_the_readme_decoding_table_lists_exactly_the_decoding_keys_with_their_defaults():
    """The README's table of decoding keys against the schema: the same keys, the same defaults
    (a documented key that does not exist, or one left undocumented, fails)."""
    text = README.read_text()
    table = text.split("**The decoding keys**", 1)[1].split("\n\n", 2)[1]
    documented = {}
    for line in table.splitlines()[2:]:
        key, default = re.match(r"\| `(\w+)` \| `([^`]*)` \|", line).groups()
        documented[key] = default
    keys = {k.path.split(".", 1)[1]: k.default for k in schema.keys() if k.path.startswith("post_training.")}
    assert set(documented) == set(keys) - _NOT_DECODING
    for key, default in documented.items():
        assert default == str(keys[key]), key
    row = re.search(r"^\| `post_training` \|(.*)$", text, re.M).group(1)
    assert set(re.findall(r"`(\w+)`", row)) >= set(keys)  # the sections table names every key
