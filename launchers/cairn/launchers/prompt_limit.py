"""The prompt-length policy that infer, eval's decoding, the interactive handle and the export
share: a prompt has at most `post_training.max_input_length` tokens (0: the model's input length,
`data.sequence_length.inputs`; for a decoder-only model without it, `.targets`);
a longer one is, by `post_training.long_inputs`,

* `truncate`: a decoder-only prompt keeps its last tokens (those its continuation follows), an
  encoder input its first ones, then its EOS when it ended with one (as the tasks trim), with one
  warning per call naming the rows that were cut;
* `refuse`: a `ConfigError` naming the first such row (infer: exit 2).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from cairn.launchers.config_base import model_family
from cairn.launchers.validation import ConfigError

log = logging.getLogger(__name__)
_NAMED = 5  # rows a warning names


@dataclasses.dataclass(frozen=True)
class PromptLimit:
    """`max_tokens` per prompt; `refuse` a longer one, else cut it: keep its end (`keep_end`,
    decoder-only) or its start and a final `eos_id`."""

    max_tokens: int
    refuse: bool
    keep_end: bool
    eos_id: int = 1

    @classmethod
    def of(cls, spec: Any) -> PromptLimit:
        """The spec's policy (`post_training.max_input_length`, `long_inputs`)."""
        family = model_family(spec.keys.model.kind)
        pt = spec.keys.post_training
        lengths = spec.reader.sequence_length
        feature = family.input_feature or ("inputs" if "inputs" in lengths else "targets")
        default = lengths[feature]
        eos = spec.vocabulary.eos_id
        return cls(
            int(pt.max_input_length or default),
            pt.long_inputs == "refuse",
            family.continues_prompt,
            1 if eos is None else int(eos),
        )

    def cut(self, row: Sequence[int]) -> list[int]:
        """`row` within `max_tokens` (unchanged when it fits)."""
        row, n = [int(t) for t in row], self.max_tokens
        if len(row) <= n:
            return row
        if self.keep_end:
            return row[len(row) - n :]
        return row[: n - 1] + [self.eos_id] if row[-1] == self.eos_id else row[:n]

    def fit(self, rows: Sequence[Sequence[int]], first_index: int = 0) -> list[list[int]]:
        """Every row within the limit (module docstring); `first_index` numbers the rows in the
        warning or the error (a chunk's first row)."""
        long = [(first_index + i, len(r)) for i, r in enumerate(rows) if len(r) > self.max_tokens]
        if long and self.refuse:
            index, n = long[0]
            raise ConfigError(
                "post_training.max_input_length",
                f"input {index} has {n} tokens, more than {self.max_tokens} (post_training.long_inputs='refuse'; "
                "'truncate' cuts it)",
            )
        if long:
            kept = "last" if self.keep_end else "first"
            named = ", ".join(f"{i} ({n} tokens)" for i, n in long[:_NAMED])
            more = f" and {len(long) - _NAMED} more" if len(long) > _NAMED else ""
            log.warning(
                "%d input(s) longer than post_training.max_input_length=%d cut to their %s tokens: row %s%s",
                len(long),
                self.max_tokens,
                kept,
                named,
                more,
            )
        return [self.cut(r) for r in rows]
