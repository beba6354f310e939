"""`--checkpoint` and `--step`: which checkpoint of a run the reading programs use.

`eval`, `infer`, `export` and `export_peft` import this module for the two flags (defined once
here, so one process may import several of those programs: a test calling them in turn).
`checkpoint_params.locate` then picks the step folder.
"""

from __future__ import annotations

from absl import flags

from cairn.launchers import config_io
from cairn.launchers.run_spec import RunSpec

CHECKPOINT = flags.DEFINE_string(
    "checkpoint", "", "model_dir, checkpoints folder or step folder (default: config.model_dir)"
)
STEP = flags.DEFINE_integer("step", None, "this step's checkpoint (default: the latest complete one)")


def checkpoint_path(spec: RunSpec) -> str:
    """`--checkpoint` resolved against where the command ran, else the run's `model_dir`."""
    return config_io.resolve_path(CHECKPOINT.value) if CHECKPOINT.value else spec.keys.model_dir
