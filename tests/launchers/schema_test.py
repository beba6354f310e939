"""The config schema (cairn.launchers.schema): each key declared once, `base_config()` generated
from it, validation walking it, help for every key, library-owned choices and defaults."""

import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys

import launch_util
import pytest

from cairn.launchers import config_base, config_io, schema, validation
from cairn.launchers.validation import ConfigError

# `base_config()` as it was written by hand before the schema (keys and defaults).
HAND_WRITTEN = {
    "experiment": "experiment",
    "model_dir": "",
    "seed": 0,
    "num_train_steps": 1000,
    "fingerprint_every": 10,
    "model": {
        "kind": "encoder_decoder",
        "preset": "t5_1_1_tiny",
        "overrides": {},
        "vocab_size": 0,
        "dtype": "preset",
        "param_dtype": "preset",
        "matmul_precision": "preset",
        "label_smoothing": 0.0,
        "z_loss": 1e-4,
        "loss_normalizing_factor": "NUM_REAL_TARGET_TOKENS",
        "moe": {
            "num_experts": 0,
            "top_k": 2,
            "routing": "token_choice",
            "capacity_factor": 1.25,
            "dropless": False,
            "every": 1,
            "expert_mlp_dim": None,
            "renormalize": True,
            "jitter_noise": 0.0,
            "load_balance_loss_weight": 0.01,
            "router_z_loss_weight": 0.001,
        },
        "lora": {
            "rank": None,
            "alpha": 16.0,
            "dropout": 0.0,
            "targets": [r"attention/(query|key|value|out)(/kernel)?$", r"mlp/(wi|wi_\d+|wo)(/kernel)?$"],
        },
        "prompt_tuning": {
            "length": None,
            "init": "vocab_sample",
            "tokens": [],
            "text": "",
            "sample_top": 5000,
            "uniform_scale": 0.5,
        },
    },
    "vocabulary": {"kind": "sentencepiece", "path": "", "extra_ids": 100},
    "data": {
        "task": "",
        "task_modules": [],
        "split": "train",
        "sequence_length": {"inputs": 512, "targets": 114},
        "batch_size": 128,
        "pack": False,
        "cache_dir": "",
        "check_source_files": True,
        "cache_with_beam": False,
        "source": {"format": "", "files": {}, "splits": {}, "columns": {}, "recipe": "text_to_text"},
    },
    "partitioning": {
        "mesh": {"data": -1, "fsdp": 1, "expert": 1, "model": 1},
        "fsdp_rules": False,
        "num_slices": 1,
        "dcn_mesh": {"data": -1, "fsdp": 1, "model": 1},
    },
    "optimizer": {
        "name": "adafactor",
        "schedule": "factor",
        "learning_rate": 1.0,
        "factors": "constant * linear_warmup * rsqrt_decay",
        "warmup_steps": 1000,
        "final_learning_rate": 0.0,
        "clip_grad_norm": None,
        "weight_decay": 0.0,
        "b1": 0.9,
        "b2": 0.999,
        "factoring": "heuristic",
        "factor_rules": {},
        "factored": True,
        "min_dim_size_to_factor": 128,
        "multiply_by_parameter_scale": True,
        "decay_rate": 0.8,
        "clipping_threshold": 1.0,
        "no_decay": [r"(^|/)(scale|bias|embedding)$"],
        "freeze": [],
        "groups": [],
    },
    "trainer": {
        "num_microbatches": 1,
        "checkpoint_every": 1000,
        "keep_checkpoints": 3,
        "eval_every": 0,
        "log_every": 100,
        "tensorboard": True,
        "peak_flops": None,
        "offload_optimizer_state": False,
        "offload_params": False,
        "compiler_options": {},
    },
    "eval": {"task": "", "split": "validation", "num_examples": 64, "batch_size": 16, "decode_metrics": False},
    "post_training": {
        "final_eval": True,
        "num_samples": 4,
        "prompts": [],
        "decode_method": "greedy",
        "max_decode_length": 0,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "num_beams": 4,
        "alpha": 0.6,
        "num_decodes": 1,
        "max_input_length": 0,
        "long_inputs": "truncate",
    },
    "logging": {"wandb": ""},
    "init": {"checkpoint": "", "checkpoint_step": None, "hf_checkpoint": "", "t5x_checkpoint": "", "upcycle_from": ""},
    "multihost": {
        "coordinator_address": "",
        "coordinator_bind_address": "",
        "num_processes": None,
        "process_id": None,
        "initialization_timeout_seconds": 300,
        "heartbeat_timeout_seconds": 20,
    },
}
PLACEHOLDERS = {
    ("optimizer", "clip_grad_norm"): float,
    ("init", "checkpoint_step"): int,
    ("multihost", "num_processes"): int,
    ("multihost", "process_id"): int,
    ("model.moe", "expert_mlp_dim"): int,
    ("model.lora", "rank"): int,
    ("model.prompt_tuning", "length"): int,
}


def _leaves(node, prefix=""):
    for k, v in node.items():
        if isinstance(v, dict) and f"{prefix}{k}" not in config_base.FREE_FORM + ("partitioning.dcn_mesh",):
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def test_generated_base_config_has_the_hand_written_keys_and_defaults():
    config = config_base.base_config()
    assert config_io.to_plain(config) == HAND_WRITTEN
    for (section, name), want in PLACEHOLDERS.items():
        node = config
        for part in section.split("."):
            node = node[part]
        assert node.get_ref(name).get_type() is want
    assert config_base.FREE_FORM == (
        "model.overrides",
        "data.sequence_length",
        "data.source.files",
        "data.source.splits",
        "data.source.columns",
        "partitioning.mesh",
        "optimizer.factor_rules",
        "trainer.compiler_options",
    )
    assert isinstance(config.data.task_modules, tuple)
    # Two calls give independent configs (mutable defaults are copied).
    config.data.sequence_length.inputs = 1
    assert config_base.base_config().data.sequence_length.inputs == 512


def test_every_key_has_a_one_line_help_string():
    keys = {k.path: k for k in schema.keys()}
    assert set(_leaves(config_io.to_plain(config_base.base_config()))) == set(keys)
    for k in keys.values():
        assert k.help and "\n" not in k.help, k.path
    for name in schema.sections():  # top-level sections, and model.moe inside model
        assert name.split(".")[0] in {f.name for f in dataclasses.fields(schema.Config)}


def test_describe_lists_every_key_with_type_default_range_and_help():
    rows = {row[0]: row for row in schema.describe()}
    assert set(rows) == {k.path for k in schema.keys()}
    assert rows["optimizer.name"] == (
        "optimizer.name",
        "str",
        "'adafactor'",
        "one of adafactor, adamw",
        "the optimizer",
    )
    assert rows["trainer.num_microbatches"][3] == ">= 1"
    assert rows["optimizer.clip_grad_norm"][1:3] == ("float or None", "None")
    assert rows["partitioning.mesh"][1] == "mapping of int"
    assert rows["partitioning.mesh"][3] == "keys data, fsdp, expert, model; >= 1 or -1"
    assert rows["model.moe.routing"][3] == "one of token_choice, expert_choice"
    assert rows["model.moe.num_experts"][1:4] == ("int", "0", ">= 0")
    assert rows["model.kind"][3] == "one of encoder_decoder, decoder_only, llama"
    assert all(len(row) == 5 and all(isinstance(x, str) for x in row) for row in rows.values())


def _library_value(owner):
    module, _, attr = owner.partition(":")
    cls_name, _, field = attr.partition(".")
    value = getattr(importlib.import_module(module), cls_name)
    if not field:
        return value
    f = {f.name: f for f in dataclasses.fields(value)}[field]
    return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]


# Keys whose 0 (None) the spec resolves into another value of the field: dense MLPs (no MoeConfig), the
# targets length, no LoRA (no LoraConfig), no prompt tuning (no PromptTuningConfig).
RESOLVED_BY_THE_SPEC = (
    "model.moe.num_experts",
    "post_training.max_decode_length",
    "model.lora.rank",
    "model.prompt_tuning.length",
)


def test_keys_a_library_owns_have_its_defaults_and_choices():
    from cairn.launchers import run_spec

    owned = {k.path: k.owner for k in schema.keys() if k.owner}
    for section, library_class in run_spec.LIBRARY_SECTIONS.items():  # keys named like the class's fields
        fields = {f.name for f in dataclasses.fields(_library_value(library_class))}
        shared = [
            k for k in schema.keys() if k.path.rpartition(".")[0] == section and k.path.rpartition(".")[2] in fields
        ]
        assert len(shared) >= 2, section
        owned.update({k.path: f"{library_class}.{k.path.rpartition('.')[2]}" for k in shared})
    assert len(owned) >= 30
    for path, owner in owned.items():
        if path not in RESOLVED_BY_THE_SPEC:
            assert _library_value(owner) == schema.key(path).default, path
    from cairn.models import families, losses, model_base
    from cairn.partitioning import DEFAULT_AXES
    from cairn.trainer import optimizers

    assert schema.key("optimizer.name").allowed() == optimizers.OPTIMIZERS
    assert schema.key("model.kind").allowed() == families.names()
    assert schema.key("model.loss_normalizing_factor").allowed() == (*losses.NORMALIZING_MODES, "none")
    assert schema.key("post_training.decode_method").allowed() == model_base.DECODE_METHODS
    from cairn.models.transformer_config import DTYPES

    assert schema.key("model.dtype").allowed() == schema.key("model.param_dtype").allowed() == (*DTYPES, "preset")
    assert schema.key("partitioning.mesh").allowed_keys() == tuple(DEFAULT_AXES)


def test_importing_the_schema_and_an_experiment_loads_no_jax():
    code = (
        "import json, sys; from cairn.launchers import config_base, config_io, schema; "
        f"config_io.load_config_file({launch_util.T5_CONFIG!r}); schema.keys(); config_base.base_config(); "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ), timeout=120, check=True
    ).stdout
    assert set(json.loads(out.strip().splitlines()[-1])) & {"jax", "flax", "tensorflow", "optax"} == set()


@pytest.mark.parametrize(
    "path,value,message",
    [
        ("trainer.log_every", -1, "'trainer.log_every': must be >= 0, got -1"),
        ("data.batch_size", 0, "'data.batch_size': must be >= 1, got 0"),
        (
            "optimizer.schedule",
            "cosin",
            "'optimizer.schedule': unknown value 'cosin'; did you mean 'cosine'? allowed: "
            "constant, cosine, factor, linear",
        ),
        ("optimizer.clip_grad_norm", "1", "'optimizer.clip_grad_norm': must be float, got str '1'"),
        ("data.task_modules", ["a", 3], "'data.task_modules[1]': must be str, got int 3"),
        ("data.sequence_length", {"inputs": "64"}, "'data.sequence_length.inputs': must be int, got str '64'"),
        (
            "partitioning.mesh",
            {"dta": 2},
            "'partitioning.mesh.dta': unknown key of 'partitioning.mesh'; did you mean 'data'?",
        ),
        ("partitioning.mesh", {"model": 0}, "'partitioning.mesh.model': must be a positive int or -1, got 0"),
        ("eval", 3, "'eval': must be a section (keys batch_size, decode_metrics, num_examples, split, task), got 3"),
    ],
)
def test_errors_come_from_the_field_and_name_the_key(path, value, message):
    config = config_io.to_plain(config_base.base_config())
    config_io.set_path(config, path, value)
    with pytest.raises(ConfigError) as e:
        validation.check_schema(config)
    assert message in str(e.value)


def test_none_is_allowed_only_for_placeholders():
    config = config_io.to_plain(config_base.base_config())
    config["optimizer"]["clip_grad_norm"] = 1  # an int passes as a float
    validation.check_schema(config)
    config["seed"] = None
    with pytest.raises(ConfigError, match="'seed': must be int, got NoneType None"):
        validation.check_schema(config)


def test_the_spec_and_its_binding_run_each_check_once(tmp_path, monkeypatch):
    """`run_spec.load` then `run_setup.prepare` (what an entry point runs before compiling): the
    config crosses into plain values once, and each check runs once (no memo hides a second)."""
    import ml_collections

    from cairn.launchers import data as data_lib
    from cairn.launchers import optimizer_setup, run_setup, run_spec

    config = config_io.resolve_paths(config_io.load_config_file(launch_util.T5_CONFIG))
    config.model_dir = str(tmp_path / "run")
    calls: dict[str, int] = {}

    def spy(module, name, counts=lambda *a: True):
        real = getattr(module, name)

        def counted(*args, **kwargs):
            if counts(*args):
                calls[name] = calls.get(name, 0) + 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)

    checks = (
        "check_schema",
        "check_model",
        "check_paths",
        "check_lora",
        "check_data",
        "check_expert_axis",
        "resolve_mesh",
    )
    for name in (*checks, "check_batch_size"):
        spy(validation, name)
    spy(config_io, "to_plain", lambda value: isinstance(value, ml_collections.ConfigDict))  # not its recursion
    spy(optimizer_setup, "optimizer_config")
    spy(run_spec, "make_schedule")
    spy(data_lib, "make_vocabulary")
    spec = run_spec.load(config)
    ready = run_setup.prepare(spec)
    assert calls == dict.fromkeys(
        (*checks, "check_batch_size", "to_plain", "optimizer_config", "make_schedule", "make_vocabulary"), 1
    ), calls
    assert spec.model.vocab_size == 2176 and ready.mesh == {"data": 8, "fsdp": 1, "model": 1}
    assert spec.trainer.checkpoint is spec.checkpoint and spec.trainer.num_train_steps == config.num_train_steps
    assert spec.reader.sequence_length == {"inputs": 64, "targets": 16} and spec.decode.max_decode_length == 16
    assert spec.lora is None and spec.reader.start_id == 0
    assert dict(spec.stored) == config_io.stored_form(config)  # config.json's content, as before
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.keys.data.batch_size = 1  # type: ignore[misc]
    assert not (tmp_path / "run").exists()


def test_a_value_its_library_dataclass_refuses_names_the_key():
    """A section's keys build the library dataclass (`validation.library_config`): its own refusal
    is a `ConfigError` naming the key (a negative clip norm was a traceback before)."""
    from cairn.launchers import optimizer_setup, run_spec

    config = config_base.base_config()
    config.optimizer.clip_grad_norm = -1.0
    with pytest.raises(ConfigError, match=r"'optimizer.clip_grad_norm': OptimizerConfig.clip_grad_norm must be > 0"):
        optimizer_setup.optimizer_config(run_spec.checked_keys(config)[1])
    config.optimizer.clip_grad_norm = 1.0
    config.model.lora.rank, config.init.checkpoint = 4, "/base"
    config.model.lora.alpha = 0.0
    with pytest.raises(ConfigError, match=r"'model.lora.alpha': LoraConfig.alpha must be a number > 0"):
        validation.check_lora(run_spec.checked_keys(config)[1])
    config.model.lora.alpha = 8.0
    lora = validation.check_lora(run_spec.checked_keys(config)[1])
    assert (lora.rank, lora.alpha, lora.targets) == (4, 8.0, tuple(config.model.lora.targets))


def test_a_decoding_value_out_of_range_names_its_key():
    """The decoding keys feed `DecodeOptions` (`run_spec.decode_options`, run when the spec
    loads), which checks them: a `ConfigError` naming the key."""
    from types import SimpleNamespace

    from cairn.launchers import run_spec

    reader = SimpleNamespace(sequence_length={"targets": 8})
    for key, value, message in [
        ("top_p", 0.0, "top_p must be in (0, 1]"),
        ("num_decodes", 2, "num_decodes > 1 needs method 'sample' or 'beam'"),
    ]:
        config = config_base.base_config()
        config.post_training[key] = value
        keys = run_spec.checked_keys(config)[1]
        with pytest.raises(ConfigError, match=rf"'post_training.{key}': .*{re.escape(message)}"):
            run_spec.decode_options(keys, reader)
    config = config_base.base_config()
    config.post_training.temperature = -1.0
    with pytest.raises(ConfigError, match="'post_training.temperature': must be >= 0"):
        run_spec.checked_keys(config)
