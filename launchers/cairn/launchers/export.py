"""`//launchers:export`: a checkpoint as a TensorFlow SavedModel that a server loads without
Cairn or JAX: strings in, decoded strings and scores out.

    bazel run //launchers:export -- --config=launchers/configs/shakespeare_t5_tiny.py \\
        --output=/tmp/t5_saved_model [--checkpoint=DIR] [--step=N] [--batch_size=8] \\
        [--input_length=N] [--platforms=cpu] [--overwrite] [--config.post_training.decode_method=greedy]

The model's `predict_batch` is converted with jax2tf (native serialization: the StableHLO of
the decoding, run by TensorFlow's XLA on the `--platforms` given, e.g. `cpu,cuda,tpu`), its
parameters are variables of the SavedModel (a LoRA run's adapters merged into its base, as
`infer` merges them), and the task's SentencePiece vocabulary is inside it: its model file as an
asset, its tokenization and decoding as plain TensorFlow ops (`cairn.tokenizers`'
`SentencePieceGraph`, no tensorflow-text). Signatures (`cairn.launchers.serving`):
`serving_default(inputs)` and `generate(inputs, seed)`, each returning `outputs` (strings),
`scores` (the decoding's log-probability of each output) and `output_ids`.

Fixed at export (the SavedModel's `assets.extra/cairn_export.json` records them): the decoding
(`post_training.decode_method`, `temperature`, `top_k`, `top_p`, `num_beams`, `alpha`,
`num_decodes`: the best decode is the output, as infer's; override them with
`--config.post_training.*`), the tokens an output may have
(`post_training.max_decode_length`, default the targets length, as `infer`), the prompt length
(`--input_length`, default `post_training.max_input_length`'s, as infer's limit; a longer prompt
follows `post_training.long_inputs`: truncated as infer truncates it, or refused), the characters
an input may have (`--max_input_chars`, default 16 per prompt token: a longer string is refused
before it is tokenized) and the rows per model call (`--batch_size`). Inputs: the strings (any
number, decoded `--batch_size` at a time) and, with `generate`, the seed (`serving_default` uses
`seed`, as `infer` does). Greedy outputs equal `infer`'s on the same text.
One process (not `multihost.*`). Exit status 0 written; 2 bad input (one line on stderr).
"""

from __future__ import annotations

import cairn.launchers.quiet_startup  # noqa: F401  # isort: skip  (first: silences TF/CUDA/absl start-up noise)

import contextlib
import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import jax
from absl import flags
from absl import logging as absl_logging
from jax._src.lib.mlir.dialects import hlo  # the StableHLO version jax serializes for (_older_stablehlo)

from cairn import storage
from cairn.datatasks import DataTasksError
from cairn.launchers import (
    builder,
    checkpoint_flags,
    checkpoint_params,
    cli,
    config_io,
    entry,
    infer_rows,
    predict_fns,
    run_setup,
    serving,
)
from cairn.launchers.config_base import model_family
from cairn.launchers.fingerprint import config_hash
from cairn.launchers.prompt_limit import PromptLimit
from cairn.launchers.run_spec import RunSpec
from cairn.launchers.validation import ConfigError
from cairn.tokenizers import SentencePieceVocabulary, VocabularyError
from cairn.tokenizers.sentencepiece_graph import ModelSpec

# `allow_override`: flags infer_main (or another program) defines too, so that one process (a test)
# imports both modules; a program imports only its own.
OUTPUT = flags.DEFINE_string("output", "", "the SavedModel folder to write (required)", allow_override=True)
BATCH = flags.DEFINE_integer("batch_size", 8, "rows per model call inside the SavedModel", allow_override=True)
INPUT_LENGTH = flags.DEFINE_integer(
    "input_length", 0, "prompt tokens at most (default: post_training.max_input_length's)"
)
CHARS_PER_TOKEN = 16  # the default --max_input_chars per prompt token
MAX_CHARS = flags.DEFINE_integer(
    "max_input_chars",
    0,
    f"characters an input may have, a longer one refused (default: {CHARS_PER_TOKEN} x the prompt tokens)",
)
PLATFORMS = flags.DEFINE_list("platforms", ["cpu"], "platforms the SavedModel runs on: cpu, cuda, rocm, tpu")
OVERWRITE = flags.DEFINE_bool("overwrite", False, "replace an existing --output", allow_override=True)

PLATFORM_NAMES = ("cpu", "cuda", "rocm", "tpu")
FACTS_FILE = "cairn_export.json"  # under the SavedModel's assets.extra/


def check_args(
    output: str, batch_size: int, input_length: int, platforms: list[str], overwrite: bool, max_input_chars: int = 0
) -> None:
    """`ConfigError` naming the flag for an unusable `--output`, `--batch_size`, `--input_length`,
    `--max_input_chars` or `--platforms` (checked before JAX is imported)."""
    if not output:
        raise ConfigError("output", "--output=path/to/saved_model is required")
    if batch_size < 1:
        raise ConfigError("batch_size", f"must be >= 1, got {batch_size}")
    if input_length < 0:
        raise ConfigError("input_length", f"must be >= 0 (0: the default), got {input_length}")
    if max_input_chars < 0:
        raise ConfigError("max_input_chars", f"must be >= 0 (0: the default), got {max_input_chars}")
    unknown = [p for p in platforms if p not in PLATFORM_NAMES]
    if unknown or not platforms:
        raise ConfigError("platforms", f"unknown {unknown or 'empty list'}; allowed: {', '.join(PLATFORM_NAMES)}")
    if storage.path(output).exists() and not overwrite:
        raise ConfigError("output", f"{output} exists; use --overwrite to replace it")


def graph_vocabulary(spec: RunSpec) -> Any:
    """The spec's vocabulary in TensorFlow ops, or a `ConfigError` naming `vocabulary.*`."""

    vocabulary = spec.vocabulary
    if not isinstance(vocabulary, SentencePieceVocabulary):
        raise ConfigError(
            "vocabulary.kind", f"the export needs a SentencePiece vocabulary, got {type(vocabulary).__name__}"
        )
    try:
        ModelSpec(vocabulary.sp_model)
    except VocabularyError as e:
        raise ConfigError("vocabulary.path", str(e)) from None
    return vocabulary


def export(
    spec: RunSpec,
    output: str,
    path: str,
    step: int | None = None,
    batch_size: int = 8,
    input_length: int = 0,
    platforms: tuple[str, ...] | list[str] = ("cpu",),
    overwrite: bool = False,
    out: Callable[[str], None] = print,
    max_input_chars: int = 0,
) -> dict[str, Any]:
    """Writes the SavedModel of the checkpoint at `path` (module docstring) to `output`;
    returns the facts recorded in it (`assets.extra/cairn_export.json`)."""
    check_args(output, batch_size, input_length, list(platforms), overwrite, max_input_chars)
    vocabulary = graph_vocabulary(spec)
    from jax.experimental import jax2tf  # imports TensorFlow

    family = model_family(spec.keys.model.kind)
    limit = PromptLimit.of(spec)
    width = input_length or limit.max_tokens
    new = predict_fns.new_tokens(spec)
    ready = run_setup.prepare(spec, train=False, padded=(("batch_size", batch_size),), eval_task=True)
    if jax.process_count() > 1:
        raise ConfigError("multihost.num_processes", "the export runs on one process (the SavedModel is one file set)")
    model = builder.load_model(spec)
    layout = checkpoint_params.params_layout(spec, model, ready.partitioner)
    step, params = checkpoint_params.load_params(layout, path, step)
    params = jax.tree_util.tree_map(lambda a: jax.device_get(a), params)
    add_eos = not family.continues_prompt and infer_rows.adds_eos(spec)
    eos = vocabulary.eos_id if vocabulary.eos_id is not None else 1

    chars = max_input_chars or CHARS_PER_TOKEN * width
    shape = serving.ServingShape(
        batch_size, width, new, family.continues_prompt, add_eos, eos, spec.keys.seed, limit.refuse, chars
    )
    options = predict_fns.decode_options(spec, new, width if family.continues_prompt else 0)

    def decode(params, prompts, seed):
        out = model.predict_batch(params, family.decode_batch(prompts), options, rng=jax.random.PRNGKey(seed))
        return predict_fns.best_decodes(*out, options)

    decode_fn = jax2tf.convert(decode, with_gradient=False, native_serialization_platforms=tuple(platforms))
    facts = {
        "checkpoint": storage.absolute(path),
        "step": step,
        "model_kind": spec.keys.model.kind,
        "config_hash": config_hash(config_io.hashable_config(spec.stored)),
        "vocabulary_sha256": vocabulary.fingerprint,
        "batch_size": batch_size,
        "input_length": width,
        "max_input_chars": chars,
        "long_inputs": spec.keys.post_training.long_inputs,
        "max_decode_length": new,
        "add_eos": add_eos,
        "seed": spec.keys.seed,
        "decode": dataclasses.asdict(options),
        "platforms": list(platforms),
        "signatures": ["serving_default", "generate"],
    }
    _save(decode_fn, params, vocabulary, shape, output, overwrite, facts)
    kind, method = spec.keys.model.kind, options.method
    out(f"exported step {step} of {storage.absolute(path)} to {output} ({kind}, {method})")
    return facts


@contextlib.contextmanager
def _older_stablehlo() -> Iterator[None]:
    """jax's StableHLO serialization aimed at consumers 12 weeks old instead of 4 (jax 0.10.2:
    StableHLO 1.13.7 instead of 1.15.0): TensorFlow 2.21's XlaCallModule reads 1.13.7, and jax's
    default writes ops it cannot read (`vhlo.composite_v2`, from `lax.top_k` when sampling)."""
    original = hlo.get_version_from_compatibility_requirement

    def older(requirement: Any) -> Any:
        return original(hlo.StablehloCompatibilityRequirement.WEEK_12)

    hlo.get_version_from_compatibility_requirement = older
    try:
        yield
    finally:
        hlo.get_version_from_compatibility_requirement = original


def _save(
    decode_fn: Callable,
    params: Any,
    vocabulary: Any,
    shape: Any,
    output: str,
    overwrite: bool,
    facts: dict,
) -> None:
    import tensorflow as tf

    with tempfile.TemporaryDirectory(prefix="cairn-export-") as tmp:
        model_file = os.path.join(tmp, "vocabulary.model")
        with open(model_file, "wb") as f:
            f.write(vocabulary.sp_model)
        with _older_stablehlo():  # jax2tf serializes while the functions are traced
            module, signatures = serving.serving_module(decode_fn, params, vocabulary, model_file, shape)
            staged = os.path.join(tmp, "saved_model")
            tf.saved_model.save(module, staged, signatures=signatures)
        os.makedirs(os.path.join(staged, "assets.extra"), exist_ok=True)
        with open(os.path.join(staged, "assets.extra", FACTS_FILE), "w") as f:
            json.dump(facts, f, indent=1, sort_keys=True)
        if overwrite and storage.path(output).exists():
            storage.remove_tree(output)
        for root, _, files in os.walk(staged):
            for name in sorted(files):
                local = os.path.join(root, name)
                storage.copy_file(local, storage.join(output, os.path.relpath(local, staged)))


def _main(spec: RunSpec) -> None:
    path = checkpoint_flags.checkpoint_path(spec)
    export(
        spec,
        config_io.resolve_path(OUTPUT.value),
        path,
        checkpoint_flags.STEP.value,
        BATCH.value,
        INPUT_LENGTH.value,
        PLATFORMS.value,
        OVERWRITE.value,
        out=run_setup.print_on_process_0,
        max_input_chars=MAX_CHARS.value,
    )


def run() -> None:
    """The program; bad data, a missing checkpoint or unusable storage exit 2 (one line)."""
    from cairn.trainer import NoCheckpointError

    def quiet_logs() -> None:  # TensorFlow's SavedModel writer logs through absl at INFO
        absl_logging.set_verbosity(absl_logging.INFO if entry.VERBOSE.value else absl_logging.WARNING)

    cli.run_entry_point(_main, expected=(DataTasksError, NoCheckpointError, storage.StorageError), logs=quiet_logs)


if __name__ == "__main__":
    entry.main(run)
