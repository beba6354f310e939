"""`//launchers:verify_cache`: the full check of an experiment's task caches.

    bazel run //launchers:verify_cache -- \
        --config=launchers/configs/shakespeare_t5_tiny.py [--verbose]

Re-hashes every shard of the config's training tasks under `data.cache_dir` against the
checksums the cache writer recorded, and fingerprints their source files again
(`cairn.datatasks.deterministic.verify_cache`; training start-up reads metadata only).
Prints `<task>/<split>: ok`, or one line per problem naming the shard or source file.
Exit status 0 when everything matches, 2 otherwise (also on a bad config; a traceback only
with --verbose).
"""

from __future__ import annotations

import cairn.launchers.startup  # noqa: F401  # isort: skip  (first: silences TF/CUDA/absl start-up noise)

from cairn.datatasks.deterministic import verify_cache
from cairn.datatasks.deterministic.verify_main import report
from cairn.launchers import cli, entry
from cairn.launchers import data as data_lib
from cairn.launchers.run_spec import RunSpec
from cairn.launchers.validation import ConfigError


def verify(spec: RunSpec) -> dict[str, list[str]]:
    """`{task: [problem, ...]}` for the spec's training tasks (all empty: all match)."""

    data_lib.register_tasks(spec.keys, spec.vocabulary)
    tasks = data_lib.get_tasks(spec.keys)
    return verify_cache(spec.reader.cache_dir, list(tasks.values()), split=spec.reader.split)


def _main(spec: RunSpec) -> int:

    return report(verify(spec), spec.reader.split)


def run() -> None:
    """The program: any failure to read a cache is one line, exit 2 (a traceback with --verbose)."""
    cli.run_entry_point(
        _main,
        expected=(Exception,),
        describe=lambda e: e if isinstance(e, ConfigError) else RuntimeError(f"{type(e).__name__}: {e}"),
    )


if __name__ == "__main__":
    entry.main(run)
