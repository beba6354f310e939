"""`--help` of the config programs: the program's docstring, its flags, then every config key
(`--config.<key>`) with its type, default and help, from `schema.describe()` (the one table).

No JAX import here beyond what `schema.describe()` loads for library-owned choices.
"""

from __future__ import annotations

import sys

from absl import flags

from cairn.launchers import schema
from cairn.launchers.entry import HELP_FLAGS

__all__ = ["HELP_FLAGS", "help_text", "key_lines"]

_CONFIG_USAGE = (
    "--config=FILE.py[:ARG] | RUN/config.json",
    "the experiment file (launchers/configs/), or a run's saved config.json; "
    "--config.<key>=VALUE overrides one key (below)",
)


def _program_flags() -> list[tuple[str, str]]:
    """`(usage, help)` of the flags the program defines (its own module and the launchers'),
    without `--config` (shown first) and absl's own."""
    out = []
    for module, module_flags in sorted(flags.FLAGS.flags_by_module_dict().items()):
        if "cairn" not in module and module != sys.argv[0] and not module.endswith("_main.py"):
            continue
        for f in sorted(module_flags, key=lambda f: f.name):
            if f.name == "config":
                continue
            default = f"; default {f.default!r}" if f.default not in (None, "", False) else ""
            out.append((f"--{f.name}", f"{f.help}{default}"))
    return sorted(set(out))


def key_lines() -> list[str]:
    """Two lines per config key: `--config.<key>  <type> (default <d>; <allowed>)` and its help."""
    lines = []
    for path, type_name, default, allowed, help_text in schema.describe():
        extra = f"; {allowed}" if allowed else ""
        lines.append(f"  --config.{path}  {type_name} (default {default}{extra})")
        lines.append(f"      {help_text}")
    return lines


def help_text(doc: str) -> str:
    """The whole `--help` text of a config program whose module docstring is `doc`."""
    lines = [doc.strip(), "", "Flags:", f"  {_CONFIG_USAGE[0]}", f"      {_CONFIG_USAGE[1]}"]
    for usage, help_line in _program_flags():
        lines += [f"  {usage}", f"      {help_line}"]
    lines += [
        "",
        "Config keys (--config.<key>=VALUE; model_dir default: runs/<experiment> where the command runs):",
    ]
    lines += key_lines()
    return "\n".join(lines)
