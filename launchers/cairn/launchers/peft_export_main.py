"""`//launchers:export_peft`: a LoRA run's adapters as a Hugging Face PEFT adapter, with its base
as a transformers checkpoint, for `peft` to load.

    bazel run //launchers:export_peft -- --config=RUN/config.json --output_dir=DIR \
        [--checkpoint=DIR] [--step=N]

writes `DIR/base` (the run's frozen base, `init.*`, through the family's `export_hf`:
`config.json` + `model.safetensors`) and `DIR/adapter` (`adapter_config.json` +
`adapter_model.safetensors`, `cairn.models.peft_interchange.export_peft`, naming `DIR/base` as
its base), from the latest complete checkpoint of the run (or `--step`'s). In Python:

    model = AutoModelForCausalLM.from_pretrained("DIR/base")  # T5ForConditionalGeneration for T5
    model = PeftModel.from_pretrained(model, "DIR/adapter")

Llama, Mixtral and T5 runs (the families with a Hugging Face export), on one process (the
adapters and the base are gathered to the host and written by it). A run without
`model.lora.rank`, a family without export, or a LoRA target PEFT has no module for exits 2 with
one line naming the key. The other way, `import_peft` reads an adapter saved by peft
(models/README.md).
"""

from __future__ import annotations

import cairn.launchers.quiet_startup  # noqa: F401  # isort: skip  (first: silences TF/CUDA/absl start-up noise)

import dataclasses
from collections.abc import Callable

import jax
from absl import flags

from cairn import storage
from cairn.launchers import builder, checkpoint_flags, checkpoint_params, cli, config_io, entry, run_setup, run_spec
from cairn.launchers.config_base import model_family
from cairn.launchers.run_spec import RunSpec
from cairn.launchers.validation import ConfigError

OUTPUT = flags.DEFINE_string("output_dir", "", "the folder to write base/ and adapter/ into (required)")


def export(
    spec: RunSpec, output: str, path: str, step: int | None = None, out: Callable[[str], None] = print
) -> tuple[str, str]:
    """Writes `output/base` and `output/adapter` (module docstring) from the checkpoint at `path`
    (`step`, or the latest complete one); returns both folders."""
    from cairn.models.peft_interchange import PeftInterchangeError, export_peft

    if spec.lora is None:
        raise ConfigError("model.lora.rank", "None: export_peft writes a LoRA run's adapters, and this run has none")
    hf = model_family(spec.keys.model.kind).hf
    if hf is None:
        raise ConfigError("model.kind", f"{spec.keys.model.kind!r} has no Hugging Face export (PEFT needs one)")
    if not output:
        raise ConfigError("output_dir", "is required: the folder to write base/ and adapter/ into")
    bound = run_spec.bind(spec, jax.devices(), jax.process_count(), train=False)
    model = builder.load_model(spec)
    layout = checkpoint_params.params_layout(spec, model, bound.partitioner)
    chosen, adapters = checkpoint_params.load_params(dataclasses.replace(layout, to_model=lambda p: p), path, step)
    base_dir, adapter_dir = storage.join(output, "base"), storage.join(output, "adapter")
    if run_setup.is_process_0():
        adapters, base = jax.device_get(adapters), jax.device_get(layout.frozen)
        try:
            export_peft(adapters, spec.lora, spec.model, adapter_dir, base_model_name_or_path=base_dir)
        except PeftInterchangeError as e:
            raise ConfigError("model.lora.targets", str(e)) from None
        hf.export_dir(base, spec.model, base_dir)
        out(f"step {chosen}: PEFT adapter (rank {spec.lora.rank}) in {adapter_dir}, its base in {base_dir}")
    return base_dir, adapter_dir


def _main(spec: RunSpec) -> None:
    path = checkpoint_flags.checkpoint_path(spec)
    export(
        spec, config_io.resolve_path(OUTPUT.value), path, checkpoint_flags.STEP.value, out=run_setup.print_on_process_0
    )


def run() -> None:
    """The program; a missing checkpoint or unusable storage exits 2 (one line)."""
    from cairn.trainer import NoCheckpointError

    cli.run_entry_point(_main, expected=(NoCheckpointError, storage.StorageError))


if __name__ == "__main__":
    entry.main(run)
