"""The data side of an experiment: vocabulary, task registration, the deterministic cache
and reader, and the data fingerprint."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import cairn.datatasks as dt
from cairn.datatasks import DEFAULT_REGISTRY, DataTasksError, Mixture
from cairn.datatasks.deterministic import DeterministicReader, cache_task_in_process, task_dir
from cairn.datatasks.deterministic.cache_writer import upgrade_in_place
from cairn.datatasks.deterministic.store import INFO, is_completed, read_json, recache_notice
from cairn.launchers import schema
from cairn.launchers.multihost import stop_together
from cairn.launchers.tasks import from_config
from cairn.launchers.validation import ConfigError, close_names
from cairn.tokenizers import ByteVocabulary, SentencePieceVocabulary, TokenizerJsonVocabulary

if TYPE_CHECKING:
    from cairn.launchers.run_spec import ReaderSpec

log = logging.getLogger(__name__)


def make_vocabulary(keys: schema.Config) -> Any:
    """The `cairn.tokenizers` vocabulary of `vocabulary.*` (`RunSpec.vocabulary`)."""

    vocabulary = keys.vocabulary
    if vocabulary.kind == "byte":
        return ByteVocabulary(extra_ids=vocabulary.extra_ids)
    if vocabulary.kind == "tokenizer_json":
        return TokenizerJsonVocabulary(vocabulary.path, extra_ids=vocabulary.extra_ids)
    return SentencePieceVocabulary(vocabulary.path, extra_ids=vocabulary.extra_ids)


def register_tasks(keys: schema.Config, vocabulary: Any) -> None:
    """Imports `data.task_modules`; calls `register_tasks(vocabulary)` where a module has it."""
    for name in keys.data.task_modules:
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            raise ConfigError("data.task_modules", f"cannot import {name!r}: {e}") from None
        register = getattr(module, "register_tasks", None)
        if callable(register):
            register(vocabulary)
    if keys.data.source.format:
        register_source_task(keys, vocabulary)


def register_source_task(keys: schema.Config, vocabulary: Any) -> None:
    """Registers `data.task` from `data.source` (`tasks/from_config.py`), replacing a task of that
    name, after checking every file's schema against the columns (no row read, nothing written):
    a `ConfigError` naming the key, or a `DataTasksError` naming the file, the column and the
    columns it has."""
    source = keys.data.source
    if not keys.data.task:
        raise ConfigError("data.task", f"name the task data.source ({source.format} files) defines")
    if not source.files:
        raise ConfigError("data.source.files", "no file pattern: give split -> pattern, e.g. {'train': 'qa.parquet'}")
    if source.format == "hf" and len(set(source.files.values())) != 1:
        raise ConfigError(
            "data.source.files", f"hf reads one datasets folder, got {sorted(set(source.files.values()))}"
        )
    needed = from_config.RECIPES[source.recipe]
    if sorted(source.columns) != sorted(needed):
        raise ConfigError(
            "data.source.columns",
            f"recipe {source.recipe} maps {', '.join(needed)} to columns, got {dict(source.columns) or 'none'}",
        )
    table = from_config.make_source(source)
    for split in table.splits:
        table.check(split)
    if keys.data.task in DEFAULT_REGISTRY:
        DEFAULT_REGISTRY.remove(keys.data.task)
    DEFAULT_REGISTRY.add_task(from_config.recipe_task(keys.data.task, table, source.recipe, vocabulary))


def get_tasks(keys: schema.Config, key: str = "data.task") -> dict[str, Any]:
    """`{name: Task}` of the task or mixture named at `key` (`ConfigError` listing close names)."""

    name = keys.eval.task or keys.data.task if key == "eval.task" else keys.data.task
    if name not in DEFAULT_REGISTRY:
        known = DEFAULT_REGISTRY.task_names() + DEFAULT_REGISTRY.mixture_names()
        close = close_names(name, known)
        hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
        listing = ", ".join(known[:30]) + (" ..." if len(known) > 30 else "")
        raise ConfigError(
            key,
            f"unknown task or mixture {name!r}; {hint}registered: {listing or 'none'} "
            f"(modules in data.task_modules register tasks: {list(keys.data.task_modules)})",
        )
    obj = DEFAULT_REGISTRY.get(name)
    return dict(obj.tasks) if isinstance(obj, Mixture) else {obj.name: obj}


def feature_converter(reader: ReaderSpec, pack: bool | None = None) -> Any:
    """The `cairn.datatasks` feature converter of the model family (`data.pack` unless `pack`),
    whose decoder inputs start with the model's start token (`reader.start_id`: 0, T5's, unless a
    decoder-only config says otherwise, e.g. an imported checkpoint's BOS), the token decoding
    puts in front of a prompt."""

    converter = getattr(dt, reader.feature_converter)
    pack = reader.pack if pack is None else pack
    return converter(pack=pack) if reader.start_id == 0 else converter(pack=pack, bos_id=reader.start_id)


def cache_missing(reader: ReaderSpec, tasks: Mapping[str, Any]) -> list[str]:
    """Tasks whose cache under `data.cache_dir` is missing, incomplete or of an older format."""

    return [n for n in sorted(tasks) if not is_completed(task_dir(reader.cache_dir, n, reader.split))]


def ensure_cached(reader: ReaderSpec, tasks: Mapping[str, Any]) -> list[str]:
    """Caches (in this process) every task whose cache is missing, incomplete or of an older
    format (a one-line notice on stderr says which and why; a local format 3 cache is upgraded
    in place instead); on several processes, process 0 writes and the others wait. Returns the
    tasks cached or upgraded now."""
    import jax

    todo = cache_missing(reader, tasks)
    error = None
    if todo and jax.process_index() == 0:
        try:
            for name in todo:
                path = task_dir(reader.cache_dir, name, reader.split)
                upgraded = upgrade_in_place(path)  # a local format 3 cache: its chunk index added
                if upgraded:
                    print(upgraded, file=sys.stderr, flush=True)
                    continue
                notice = recache_notice(path)
                if notice:
                    print(notice, file=sys.stderr, flush=True)
                print(f"caching task {name} ({reader.split}) in {path}", flush=True)
                cache_task_in_process(tasks[name], reader.split, path, overwrite=True)
        except Exception as e:
            error = e
    stop_together(error, "caching the tasks")  # also the barrier: the others wait for the cache
    return todo


def open_reader(
    reader: ReaderSpec, host_index: int = 0, host_count: int = 1, prefetch_until: int | None = None
) -> DeterministicReader:
    """The `DeterministicReader` of `reader`'s spec, host `host_index` of `host_count`'s rows,
    over a cache that exists (`make_train_data` caches first)."""
    return DeterministicReader(
        reader.task,
        reader.cache_dir,
        seed=reader.seed,
        global_batch_size=reader.batch_size,
        sequence_length=dict(reader.sequence_length),
        feature_converter=feature_converter(reader),
        host_index=host_index,
        host_count=host_count,
        split=reader.split,
        check_source_files=reader.check_source_files,
        prefetch_until=prefetch_until,
    )


def make_train_data(reader: ReaderSpec, partitioner: Any, tasks: Mapping[str, Any]) -> Any:
    """The `DeterministicReader` of this host's rows (caching the tasks first if needed).

    The rows follow the mesh, not the process id: a host reads the rows of its
    `partitioner.data_layout()` shard, so hosts of one data-parallel replica (e.g. when the
    model axis spans hosts) read identical rows."""

    layout = partitioner.data_layout()
    ensure_cached(reader, tasks)
    rows, error = None, None
    try:  # a short run reads no chunk past its end
        rows = open_reader(reader, layout.shard_id, layout.num_shards, prefetch_until=reader.num_steps)
    except DataTasksError as e:  # e.g. this host's task cache is missing: every process stops
        error = e
    stop_together(error, "opening the task cache")
    return rows


def batch_signature(rows: DeterministicReader) -> dict[str, Any]:
    """This host's batch as `jax.ShapeDtypeStruct`s, from the reader's spec
    (`DeterministicReader.batch_spec`: batch size, sequence lengths, packing and the
    converter's features): what `Trainer.setup` needs, with no batch read."""
    import jax

    return {k: jax.ShapeDtypeStruct(shape, dtype) for k, (shape, dtype) in rows.batch_spec().items()}


def data_fingerprint(reader: ReaderSpec, tasks: Mapping[str, Any]) -> str:
    """SHA-256 of the cached tasks' fingerprints (`info.json`) with the seed, the global batch
    size, the sequence lengths, the split and packing: equal fingerprints, equal batches."""

    parts = {}
    for name in sorted(tasks):
        info = read_json(os.path.join(task_dir(reader.cache_dir, name, reader.split), INFO))
        parts[name] = {"fingerprint": info.get("fingerprint"), "num_records": info.get("num_records")}
        # A chunked cache (format 3) orders its records within shards and is read in chunk
        # order by default: both shape the batches (absent from earlier caches' fingerprints).
        parts[name].update({k: info[k] for k in ("group_size", "record_order", "shuffle_key") if k in info})
        if int(info.get("group_size", 1)) > 1:  # the chunk order's packed bins end at chunk ends (issue 37)
            parts[name]["bins"] = "within_chunks"
    payload = {
        "tasks": parts,
        "mixture": reader.task,
        "seed": int(reader.seed),
        "global_batch_size": int(reader.batch_size),
        "sequence_length": dict(reader.sequence_length),
        "split": reader.split,
        "pack": bool(reader.pack),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


# -- a task's raw source that is missing or empty, as a data error (one line, exit status 2)


class SourceError(DataTasksError):
    """A task's raw source files are missing or empty (nothing to cache)."""


@contextlib.contextmanager
def source_errors_as_data_errors(task: str | None = None, split: str | None = None) -> Iterator[None]:
    """Re-raises a missing file or directory met while reading a task's source (a source function
    raising `FileNotFoundError`, a path under a file) as `SourceError`, naming the task."""
    try:
        yield
    except (FileNotFoundError, NotADirectoryError) as e:
        what = f"task {task!r}" + (f" (split {split!r})" if split else "") if task else "a task"
        raise SourceError(f"{what}: its source cannot be read: {e}") from e
