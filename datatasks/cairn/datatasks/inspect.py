"""`inspect`: print a task's examples raw, preprocessed and converted, ids beside text.

    bazel run //datatasks:inspect -- --module_file=my_tasks.py --task=NAME --split=train --n=5

Tasks are found in the default registry after importing `--module` (a dotted module
name) or `--module_file` (a path; relative paths are resolved against the directory
`bazel run` was started from).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np

from cairn.datatasks import feature_converters as fc

# --converter NAME -> the converter it makes: every converter of the library, named once here.
CONVERTERS: dict[str, type[fc.FeatureConverter]] = {
    "encdec": fc.EncDecFeatureConverter,
    "lm": fc.LMFeatureConverter,
    "prefix_lm": fc.PrefixLMFeatureConverter,
    "prefix_suffix_lm": fc.PrefixSuffixLMFeatureConverter,
    "decoder": fc.DecoderFeatureConverter,
    "encoder": fc.EncoderFeatureConverter,
    "pass_through": fc.PassThroughFeatureConverter,
    "prepacked_encdec": fc.PrePackedEncDecFeatureConverter,
    "prepacked_lm": fc.PrePackedLMFeatureConverter,
    "prepacked_prefix_lm": fc.PrePackedPrefixLMFeatureConverter,
}


def _parse_lengths(text: str) -> dict[str, int]:
    out = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if not value.strip().isdigit():
            raise argparse.ArgumentTypeError(
                f"--sequence_length wants name=int pairs like inputs=512,targets=128, got {part!r}"
            )
        out[key.strip()] = int(value)
    return out


def _load(module: str | None, module_file: str | None) -> None:
    if module:
        importlib.import_module(module)
    if module_file:
        path = module_file
        if not os.path.isabs(path):
            path = os.path.join(os.environ.get("BUILD_WORKING_DIRECTORY", os.getcwd()), path)
        if not os.path.exists(path):
            raise SystemExit(f"inspect: --module_file {module_file!r} not found ({path})")
        spec = importlib.util.spec_from_file_location("_inspected_tasks", path)
        if spec is None or spec.loader is None:
            raise SystemExit(f"inspect: --module_file {module_file!r} is not a Python module ({path})")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["_inspected_tasks"] = mod
        spec.loader.exec_module(mod)


def _show(value: Any, vocab: Any | None, width: int) -> str:
    if isinstance(value, bytes):
        text = value.decode("utf-8", errors="replace")
        return repr(text if len(text) <= width else text[:width] + "…")
    if isinstance(value, np.ndarray) and value.ndim == 1 and np.issubdtype(value.dtype, np.integer):
        ids = value.tolist()
        shown = ids if len(ids) <= width // 4 else ids[: width // 4] + ["…"]
        line = f"ids({len(ids)}) {shown}"
        if vocab is not None:
            nonpad = [i for i in ids if i != 0]
            line += f"\n{'':28}text {vocab.decode(nonpad)!r}"
        return line
    return repr(value.tolist() if isinstance(value, np.ndarray) else value)


def _print_example(title: str, ex: Any, vocabs: dict, out: TextIO, width: int) -> None:
    print(f"  [{title}]", file=out)
    if not isinstance(ex, dict):
        print(f"    {_show(ex, None, width)}", file=out)
        return
    for key in sorted(ex):
        base = key.replace("encoder_input_tokens", "inputs").replace("decoder_target_tokens", "targets")
        vocab = vocabs.get(base) if key in (base, "encoder_input_tokens", "decoder_target_tokens") else None
        print(f"    {key:22s}  {_show(ex[key], vocab, width)}", file=out)


def inspect_task(
    name: str,
    split: str = "train",
    n: int = 5,
    sequence_length: dict | None = None,
    converter: str = "encdec",
    pack: bool = False,
    seed: int = 0,
    out: TextIO | None = None,
    width: int = 120,
    mask_id: int | None = None,
) -> None:
    """Prints `n` examples of task `name`: raw, preprocessed and converted (`converter`: a
    name of `CONVERTERS`; `mask_id` is `EncoderFeatureConverter`'s mask sentinel)."""
    import cairn.datatasks as dt

    out = out or sys.stdout
    task = dt.get_mixture_or_task(name)
    if isinstance(task, dt.Mixture):
        raise SystemExit(f"inspect: {name!r} is a mixture; give one of its tasks: {sorted(task.tasks)}")
    if split not in task.splits:
        raise SystemExit(f"inspect: task {name!r} has no split {split!r}; it has {task.splits}")
    lengths = sequence_length or {k: 512 if k == "inputs" else 128 for k in task.output_features}
    if converter not in CONVERTERS:
        raise SystemExit(f"inspect: unknown converter {converter!r}; choose one of {', '.join(CONVERTERS)}")
    if (converter == "encoder") != (mask_id is not None):
        raise SystemExit("inspect: --mask_id (the mask token's id) goes with --converter=encoder, and only with it")
    extra: dict[str, Any] = {} if mask_id is None else {"mask_id": mask_id}
    conv = CONVERTERS[converter](pack=pack, **extra)
    vocabs = {k: f.vocabulary for k, f in task.output_features.items()}
    stats = dt.DataStats()
    raw = list(task.source.get_dataset(split, shuffle=False).take(n).as_numpy_iterator())
    # One preprocessed pipeline (built, so traced, once) read twice: its first `n` examples, then
    # through the converter. The bad-data counts are those of the first reading.
    model_in = task.get_dataset(lengths, split, shuffle=False, seed=seed, stats=stats)
    pre = list(model_in.take(n).as_numpy_iterator())
    bad = stats.as_dict()
    converted = list(conv(model_in, lengths).take(n).as_numpy_iterator())
    print(f"task {name!r} split {split!r} lengths {lengths} converter {conv!r}", file=out)
    for i in range(max(len(raw), len(pre), len(converted))):
        print(f"example {i}", file=out)
        if i < len(raw):
            _print_example("raw", raw[i], vocabs, out, width)
        if i < len(pre):
            _print_example("preprocessed", pre[i], vocabs, out, width)
        if i < len(converted):
            _print_example("converted", converted[i], vocabs, out, width)
    print(f"bad data (examples read so far): {bad or 'none'}", file=out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="inspect", description=__doc__.split("\n")[0])
    p.add_argument("--task", required=True)
    p.add_argument("--split", default="train")
    p.add_argument("--n", type=int, default=5)
    p.add_argument("--module", help="dotted module that registers the task")
    p.add_argument("--module_file", help="python file that registers the task")
    p.add_argument("--sequence_length", type=_parse_lengths, default=None, help="e.g. inputs=512,targets=128")
    p.add_argument("--converter", choices=tuple(CONVERTERS), default="encdec")
    p.add_argument("--mask_id", type=int, default=None, help="the mask token's id (--converter=encoder)")
    p.add_argument("--pack", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.n < 1:
        p.error("--n must be >= 1")
    _load(args.module, args.module_file)
    from cairn.datatasks.errors import DataTasksError

    try:
        inspect_task(
            args.task,
            args.split,
            args.n,
            args.sequence_length,
            args.converter,
            args.pack,
            args.seed,
            mask_id=args.mask_id,
        )
    except (DataTasksError, KeyError) as e:
        print(f"inspect: {e}", file=sys.stderr)
        return 2
    return 0
