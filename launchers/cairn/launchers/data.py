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
from typing import Any

import ml_collections

import cairn.datatasks as dt
from cairn.datatasks import DEFAULT_REGISTRY, DataTasksError, Mixture
from cairn.datatasks.deterministic import DeterministicReader, cache_task_in_process, task_dir
from cairn.datatasks.deterministic.cache_writer import upgrade_in_place
from cairn.datatasks.deterministic.store import INFO, is_completed, read_json, recache_notice
from cairn.launchers.config_base import model_family
from cairn.launchers.config_io import to_plain
from cairn.launchers.multihost import stop_together
from cairn.launchers.validation import ConfigError, close_names, prompt_start_id
from cairn.tokenizers import ByteVocabulary, SentencePieceVocabulary, TokenizerJsonVocabulary

log = logging.getLogger(__name__)


def make_vocabulary(config: ml_collections.ConfigDict) -> Any:
    """The config's `cairn.tokenizers` vocabulary."""

    if config.vocabulary.kind == "byte":
        return ByteVocabulary(extra_ids=config.vocabulary.extra_ids)
    if config.vocabulary.kind == "tokenizer_json":
        return TokenizerJsonVocabulary(config.vocabulary.path, extra_ids=config.vocabulary.extra_ids)
    return SentencePieceVocabulary(config.vocabulary.path, extra_ids=config.vocabulary.extra_ids)


def register_tasks(config: ml_collections.ConfigDict, vocabulary: Any = None) -> None:
    """Imports `data.task_modules`; calls `register_tasks(vocabulary)` where a module has it."""
    for name in config.data.task_modules:
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            raise ConfigError("data.task_modules", f"cannot import {name!r}: {e}") from None
        register = getattr(module, "register_tasks", None)
        if callable(register):
            register(vocabulary if vocabulary is not None else make_vocabulary(config))


def get_tasks(config: ml_collections.ConfigDict, key: str = "data.task") -> dict[str, Any]:
    """`{name: Task}` of the task or mixture named at `key` (`ConfigError` listing close names)."""

    name = config.eval.task or config.data.task if key == "eval.task" else config.data.task
    if name not in DEFAULT_REGISTRY:
        known = DEFAULT_REGISTRY.task_names() + DEFAULT_REGISTRY.mixture_names()
        close = close_names(name, known)
        hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
        listing = ", ".join(known[:30]) + (" ..." if len(known) > 30 else "")
        raise ConfigError(
            key,
            f"unknown task or mixture {name!r}; {hint}registered: {listing or 'none'} "
            f"(modules in data.task_modules register tasks: {list(config.data.task_modules)})",
        )
    obj = DEFAULT_REGISTRY.get(name)
    return dict(obj.tasks) if isinstance(obj, Mixture) else {obj.name: obj}


def feature_converter(config: ml_collections.ConfigDict, pack: bool | None = None) -> Any:
    """The `cairn.datatasks` feature converter of the model family (`data.pack` unless `pack`),
    whose decoder inputs start with the model's start token (`validation.prompt_start_id`: 0,
    T5's, unless a decoder-only config says otherwise, e.g. an imported checkpoint's BOS), the
    token decoding puts in front of a prompt."""

    pack = config.data.pack if pack is None else pack
    converter = getattr(dt, model_family(config.model.kind).feature_converter)
    start = prompt_start_id(config)
    return converter(pack=pack) if start == 0 else converter(pack=pack, bos_id=start)


def sequence_length(config: ml_collections.ConfigDict) -> dict[str, int]:
    """`data.sequence_length` of the features the model family reads."""
    lengths = to_plain(config.data.sequence_length)
    return {k: int(lengths[k]) for k in model_family(config.model.kind).features}


def cache_missing(config: ml_collections.ConfigDict, tasks: Mapping[str, Any]) -> list[str]:
    """Tasks whose cache under `data.cache_dir` is missing, incomplete or of an older format."""

    return [n for n in sorted(tasks) if not is_completed(task_dir(config.data.cache_dir, n, config.data.split))]


def ensure_cached(config: ml_collections.ConfigDict, tasks: Mapping[str, Any]) -> list[str]:
    """Caches (in this process) every task whose cache is missing, incomplete or of an older
    format (a one-line notice on stderr says which and why; a local format 3 cache is upgraded
    in place instead); on several processes, process 0 writes and the others wait. Returns the
    tasks cached or upgraded now."""
    import jax

    todo = cache_missing(config, tasks)
    error = None
    if todo and jax.process_index() == 0:
        try:
            for name in todo:
                path = task_dir(config.data.cache_dir, name, config.data.split)
                upgraded = upgrade_in_place(path)  # a local format 3 cache: its chunk index added
                if upgraded:
                    print(upgraded, file=sys.stderr, flush=True)
                    continue
                notice = recache_notice(path)
                if notice:
                    print(notice, file=sys.stderr, flush=True)
                print(f"caching task {name} ({config.data.split}) in {path}", flush=True)
                cache_task_in_process(tasks[name], config.data.split, path, overwrite=True)
        except Exception as e:
            error = e
    stop_together(error, "caching the tasks")  # also the barrier: the others wait for the cache
    return todo


def make_train_data(config: ml_collections.ConfigDict, partitioner: Any, tasks: Mapping[str, Any] | None = None) -> Any:
    """The `DeterministicReader` of this host's rows (caching the tasks first if needed).

    The rows follow the mesh, not the process id: a host reads the rows of its
    `partitioner.data_layout()` shard, so hosts of one data-parallel replica (e.g. when the
    model axis spans hosts) read identical rows."""

    tasks = tasks if tasks is not None else get_tasks(config)

    layout = partitioner.data_layout()
    ensure_cached(config, tasks)
    reader, error = None, None
    try:
        reader = DeterministicReader(
            config.data.task,
            config.data.cache_dir,
            seed=config.seed,
            global_batch_size=config.data.batch_size,
            sequence_length=sequence_length(config),
            feature_converter=feature_converter(config),
            host_index=layout.shard_id,
            host_count=layout.num_shards,
            split=config.data.split,
            check_source_files=config.data.check_source_files,
            prefetch_until=config.num_train_steps,  # a short run reads no chunk past its end
        )
    except DataTasksError as e:  # e.g. this host's task cache is missing: every process stops
        error = e
    stop_together(error, "opening the task cache")
    return reader


def data_fingerprint(config: ml_collections.ConfigDict, tasks: Mapping[str, Any]) -> str:
    """SHA-256 of the cached tasks' fingerprints (`info.json`) with the seed, the global batch
    size, the sequence lengths, the split and packing: equal fingerprints, equal batches."""

    parts = {}
    for name in sorted(tasks):
        info = read_json(os.path.join(task_dir(config.data.cache_dir, name, config.data.split), INFO))
        parts[name] = {"fingerprint": info.get("fingerprint"), "num_records": info.get("num_records")}
        # A chunked cache (format 3) orders its records within shards and is read in chunk
        # order by default: both shape the batches (absent from earlier caches' fingerprints).
        parts[name].update({k: info[k] for k in ("group_size", "record_order", "shuffle_key") if k in info})
        if int(info.get("group_size", 1)) > 1:  # the chunk order's packed bins end at chunk ends (issue 37)
            parts[name]["bins"] = "within_chunks"
    payload = {
        "tasks": parts,
        "mixture": config.data.task,
        "seed": int(config.seed),
        "global_batch_size": int(config.data.batch_size),
        "sequence_length": sequence_length(config),
        "split": config.data.split,
        "pack": bool(config.data.pack),
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
