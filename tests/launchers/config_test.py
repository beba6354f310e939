"""Experiment files load and validate; overrides, path resolution, config.json, the hash input."""

import json
import os

import launch_util
import pytest

from cairn.launchers import config_base, config_io, run_setup, run_spec, validation
from cairn.launchers.validation import ConfigError
from cairn.models.transformer_config import PRESET_LOSS_CHUNK_SIZE

SIZED = {
    "t5_1_1_pretrain.py": ("tiny", "small", "base", "large", "xl", "xxl", "xl_bf16", "xxl_bf16"),
    "t5_1_1_finetune.py": ("tiny", "small", "base", "large", "xl", "xxl"),
    "mt5_pretrain.py": ("small", "base", "large", "xl", "xxl"),
    "byt5_pretrain.py": ("small", "base", "large", "xl", "xxl"),
    "lm_pretrain.py": ("125m", "350m", "1b", "3b", "8b"),
}
SHAKESPEARE_SPM = str(launch_util.REPO / "launchers" / "data" / "shakespeare.model")


def load(name, arg=None):
    spec = str(launch_util.CONFIGS / name) + (f":{arg}" if arg else "")
    return config_io.resolve_paths(config_io.load_config_file(spec))


def test_every_experiment_file_is_listed_here():
    files = {p.name for p in launch_util.CONFIGS.glob("*.py")}
    assert files == set(SIZED) | {
        "shakespeare_t5_tiny.py",
        "shakespeare_lm_tiny.py",
        "shakespeare_llama_tiny.py",  # tests/launchers/llama_launch_test.py
        "llama_1b_pretrain.py",  # tests/launchers/llama_launch_test.py
        "shakespeare_moe_tiny.py",  # tests/launchers/moe_launch_test.py
        "moe_1b_pretrain.py",  # tests/launchers/moe_launch_test.py
        "shakespeare_t5_lora.py",  # below
        "shakespeare_t5_prompt_tuning.py",  # below
        "parquet_qa_tiny.py",  # tests/launchers/train_test.py
    }


@pytest.mark.parametrize("name,size", [(n, s) for n, sizes in SIZED.items() for s in sizes])
def test_sized_configs_validate(name, size):
    from cairn.models import count_params

    config = load(name, size)
    if config.vocabulary.kind == "sentencepiece":  # the user gives the real one
        config.vocabulary.path = SHAKESPEARE_SPM
    spec = launch_util.spec(config)
    net = spec.model
    assert config.model.preset.endswith(size.removesuffix("_bf16"))
    # The preset's loss and attention: chunked for the full-size large vocabularies, the kernel
    # where the accelerator has one (None); no experiment forces whole logits or XLA attention.
    whole_logits = size == "tiny" or name == "byt5_pretrain.py"
    assert net.loss_chunk_size == (0 if whole_logits else PRESET_LOSS_CHUNK_SIZE), net.loss_chunk_size
    assert net.attention_implementation is None
    mesh = spec.mesh.resolve(64)
    assert mesh["data"] * mesh["fsdp"] * mesh["model"] == 64
    if size in ("tiny", "small", "125m"):
        n = count_params(net)
        assert n > 1_000_000, n


def test_published_sizes_are_what_the_configs_build():
    from cairn.models import count_params

    config = load("t5_1_1_pretrain.py", "small")
    config.vocabulary.path = SHAKESPEARE_SPM
    config.model.vocab_size = 32128
    assert abs(count_params(launch_util.spec(config).model) - 77.0e6) / 77.0e6 < 0.01


@pytest.mark.parametrize("name", ["llama_1b_pretrain.py", "moe_1b_pretrain.py"])
def test_pod_llama_configs_take_the_presets_chunked_loss_and_attention(name):
    net = validation.check_model(launch_util.typed(load(name)))
    assert net.loss_chunk_size == PRESET_LOSS_CHUNK_SIZE and net.attention_implementation is None


def test_a_size_that_does_not_exist_is_named():
    with pytest.raises(ValueError, match="tiny, small, base, large, xl, xxl, xl_bf16, xxl_bf16"):
        load("t5_1_1_pretrain.py", "huge")


@pytest.mark.parametrize(
    "name", ["shakespeare_t5_tiny.py", "shakespeare_lm_tiny.py", "shakespeare_llama_tiny.py", "shakespeare_moe_tiny.py"]
)
def test_shakespeare_configs_validate_fully(name, tmp_path):
    config = load(name)
    config.model_dir = str(tmp_path / "run")
    spec = launch_util.spec(config)
    ready = run_setup.prepare(spec)
    assert spec.vocabulary.vocab_size == 2100
    assert ready.mesh == {"data": 8, "fsdp": 1, "model": 1}
    assert spec.model.vocab_size == 2176  # 2100 rounded up to 128
    assert spec.model.loss_chunk_size == 0 and spec.model.attention_implementation is None  # toy presets
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["shakespeare_t5_lora.py", "shakespeare_t5_prompt_tuning.py"])
def test_adaptation_configs_name_their_base_and_need_it(name, tmp_path):
    """The adaptation experiments read the default experiment's model_dir (runs/shakespeare_t5_tiny
    where the command runs) as their frozen base: missing, it is named; given, the spec adapts it
    on line completion (vocab_sample drawing below the sentinels)."""
    config = load(name)
    config.model_dir = str(tmp_path / "run")
    assert config.init.checkpoint.endswith("runs/shakespeare_t5_tiny")
    config.init.checkpoint = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match="init.checkpoint"):
        launch_util.spec(config)
    config.init.checkpoint = str(tmp_path)
    spec = launch_util.spec(config)
    assert spec.keys.data.task == "shakespeare_line_completion"
    if "lora" in name:
        assert spec.lora is not None and spec.lora.rank == 8 and spec.prompt_tuning is None
    else:
        assert spec.lora is None and spec.prompt_tuning is not None and spec.prompt_tuning.length == 20
        assert spec.prompt_tuning.sample_top == 2000  # 2100 ids, 100 of them sentinels


def test_relative_paths_resolve_against_build_working_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("BUILD_WORKING_DIRECTORY", str(tmp_path))
    (tmp_path / "exp.py").write_text(
        "from cairn.launchers import config_base\ndef get_config():\n    return config_base.base_config()\n"
    )
    assert config_io.resolve_argv(["prog", "--config=exp.py:x", "--config.model_dir=runs/a"]) == [
        "prog",
        f"--config={tmp_path / 'exp.py'}:x",
        "--config.model_dir=runs/a",
    ]
    assert config_io.resolve_argv(["prog", "--config", "missing.py"]) == ["prog", "--config", "missing.py"]
    config = config_base.base_config()
    config.model_dir = "runs/a"
    config.vocabulary.path = "~/spm.model"
    config.data.cache_dir = "gs://bucket/cache"
    resolved = config_io.resolve_paths(config)
    assert resolved.model_dir == str(tmp_path / "runs" / "a")
    assert resolved.vocabulary.path == os.path.expanduser("~/spm.model")
    assert resolved.data.cache_dir == "gs://bucket/cache"
    monkeypatch.delenv("BUILD_WORKING_DIRECTORY")
    assert config_io.resolve_path("x") == os.path.join(os.getcwd(), "x")


def test_defaults_fill_model_dir_where_the_command_runs_and_cache_dir(tmp_path, monkeypatch):
    """model_dir defaults to runs/<experiment> under the directory the command ran in (stored
    relative in config.json); the cache stays in ~/.cache/cairn/tasks."""
    monkeypatch.setenv("BUILD_WORKING_DIRECTORY", str(tmp_path))
    config = config_base.base_config()
    config.experiment = "exp1"
    resolved = config_io.resolve_paths(config)
    assert resolved.model_dir == str(tmp_path / "runs" / "exp1")
    assert resolved.data.cache_dir == os.path.expanduser("~/.cache/cairn/tasks")
    assert config_io.stored_form(resolved)["model_dir"] == os.path.join("runs", "exp1")


def test_overrides_follow_field_references():
    """`--config.num_train_steps=N` sets the field; warmup and checkpoint interval follow it
    (the command-line overrides themselves are exercised by train_test's runs)."""
    config = config_io.load_config_file(launch_util.T5_CONFIG)
    config.num_train_steps = 40
    resolved = config_io.resolve_paths(config)
    assert resolved.optimizer.warmup_steps == 2 and resolved.trainer.checkpoint_every == 21


def test_config_json_and_the_hash_input(tmp_path):
    config = load("shakespeare_t5_tiny.py")
    config.model_dir = str(tmp_path / "run")
    config.multihost.coordinator_address = "127.0.0.1:1234"
    path = config_io.write_config_json(config_io.stored_form(config), config.model_dir)
    written = json.loads(open(path).read())
    assert written["model_dir"] == config.model_dir
    assert written["data"]["sequence_length"] == {"inputs": 64, "targets": 16}
    assert written["optimizer"]["warmup_steps"] == 90  # num_train_steps // 20 (1800 steps)
    hashed = config_io.hashable_config(config_io.stored_form(config))
    assert "model_dir" not in hashed and "multihost" not in hashed and "cache_dir" not in hashed["data"]
    other = load("shakespeare_t5_tiny.py")
    other.model_dir = "/elsewhere"
    other.data.cache_dir = "gs://bucket/cache"  # where the data lives is not what it is
    assert config_io.hashable_config(config_io.stored_form(other)) == hashed
    other.data.batch_size += 1
    assert config_io.hashable_config(config_io.stored_form(other)) != hashed


def test_the_hash_input_does_not_depend_on_where_the_checkout_is(tmp_path, monkeypatch):
    """Two checkouts (or Bazel's runfiles trees), each run from its root: the vocabulary resolves
    to two absolute paths, but the config hash covers the paths as config.json stores them."""
    import shutil

    hashes, vocabularies = [], []
    for name in ("checkout_a", "checkout_b"):
        root = tmp_path / name
        (root / "launchers" / "configs").mkdir(parents=True)
        (root / "launchers" / "data").mkdir()
        shutil.copy(launch_util.CONFIGS / "shakespeare_t5_tiny.py", root / "launchers" / "configs")
        shutil.copy(launch_util.REPO / "launchers" / "data" / "shakespeare.model", root / "launchers" / "data")
        monkeypatch.setenv("BUILD_WORKING_DIRECTORY", str(root))
        config = config_io.resolve_paths(
            config_io.load_config_file(str(root / "launchers/configs/shakespeare_t5_tiny.py"))
        )
        vocabularies.append(config.vocabulary.path)
        hashes.append(config_io.hashable_config(config_io.stored_form(config)))
    assert vocabularies[0] != vocabularies[1] and all(v.startswith(str(tmp_path)) for v in vocabularies)
    assert hashes[0] == hashes[1] and hashes[0]["vocabulary"]["path"] == "launchers/data/shakespeare.model"


def test_schema_checks_in_process():
    config = config_io.to_plain(config_base.base_config())  # a ConfigDict itself refuses a str here
    config["trainer"]["log_every"] = "5"
    with pytest.raises(ConfigError, match=r"'trainer.log_every': must be int, got str '5'"):
        validation.check_schema(config)
    config = config_base.base_config()
    config.model.overrides = {"emb_dimm": 64}
    with pytest.raises(ConfigError, match=r"model.overrides.emb_dimm.*did you mean 'emb_dim'"):
        validation.check_model(launch_util.typed(config))
    config = config_base.base_config()
    config.optimizer.name = "adam"
    with pytest.raises(ConfigError, match=r"'optimizer.name': unknown value 'adam'.*adafactor, adamw"):
        run_spec.checked_keys(config)
    config = config_base.base_config()
    config.model.preset = "decoder_only_125m"
    with pytest.raises(ConfigError, match="not a encoder_decoder preset"):
        validation.check_model(launch_util.typed(config))


def test_compiler_options_reach_the_trainer_and_may_change_on_resume():
    from cairn.launchers import resume_check

    config = config_base.base_config()
    config.trainer.compiler_options = {"xla_tpu_scheduler_percent_shared_memory_limit": 50, "xla_a_flag": False}
    trainer, _ = run_spec.trainer_config(launch_util.typed(config))
    assert trainer.compiler_options == {"xla_a_flag": False, "xla_tpu_scheduler_percent_shared_memory_limit": 50}
    assert list(trainer.compiler_options) == sorted(trainer.compiler_options)
    assert "trainer.compiler_options" in resume_check.ALLOWED_ON_RESUME


def test_mesh_shapes():
    assert validation.resolve_mesh({"data": -1, "model": 2}, 8) == {"data": 4, "fsdp": 1, "model": 2}
    with pytest.raises(
        ConfigError,
        match=r"need a multiple of 3 devices, but there are 8 devices \(2 process\(es\) "
        r"x 4 device\(s\)\); a mesh that fits: \{'data': 8, 'fsdp': 1, "
        r"'model': 1\}",
    ):
        validation.resolve_mesh({"data": -1, "model": 3}, 8, process_count=2)
    with pytest.raises(
        ConfigError, match=r"has 16 devices but 8.*a mesh that fits: \{'data': 1, 'fsdp': 2, 'model': 4\}"
    ):
        validation.resolve_mesh({"data": 2, "fsdp": 2, "model": 4}, 8)
    assert validation.suggest_mesh({"model": 8}, 12) == {"data": 3, "fsdp": 1, "model": 4}
    with pytest.raises(ConfigError, match="only one mesh axis may be -1"):
        validation.resolve_mesh({"data": -1, "model": -1}, 8)


def test_multihost_from_config_and_environment(monkeypatch):
    from cairn.launchers import multihost

    config = config_base.base_config()
    env = {"CAIRN_COORDINATOR_ADDRESS": "127.0.0.1:4321", "CAIRN_NUM_PROCESSES": "2", "CAIRN_PROCESS_ID": "1"}
    assert multihost.multihost_args(config, env) == {
        "coordinator_address": "127.0.0.1:4321",
        "coordinator_bind_address": "127.0.0.1:4321",
        "num_processes": 2,
        "process_id": 1,
    }
    config.multihost.process_id = 0
    config.multihost.coordinator_address = "10.0.0.1:99"
    args = multihost.multihost_args(config, env)
    assert args["process_id"] == 0 and args["coordinator_address"] == "10.0.0.1:99"
    assert args["coordinator_bind_address"] is None
    with pytest.raises(ConfigError, match="multihost.num_processes"):
        multihost.multihost_args(config_base.base_config(), {"CAIRN_NUM_PROCESSES": "two"})
    assert multihost.multihost_args(config_base.base_config(), {}) == {
        "coordinator_address": None,
        "coordinator_bind_address": None,
        "num_processes": None,
        "process_id": None,
    }


def test_a_task_from_data_source_alone(tmp_path):
    """`data.source` registers `data.task` with no module (a `datasets` folder, sliced; a TSV
    file), after checking every file's schema; a config that cannot define it names its key."""
    import pyarrow as pa

    from cairn.datatasks import DEFAULT_REGISTRY, DataTasksError
    from cairn.launchers import data as data_lib
    from cairn.tokenizers import ByteVocabulary

    (tmp_path / "hf" / "train").mkdir(parents=True)
    (tmp_path / "hf" / "dataset_dict.json").write_text('{"splits": ["train"]}')
    (tmp_path / "hf" / "train" / "state.json").write_text('{"_data_files": [{"filename": "data.arrow"}]}')
    table = pa.table({"text": [f"line {i}" for i in range(10)], "label": list(range(10))})
    with pa.ipc.new_stream(str(tmp_path / "hf" / "train" / "data.arrow"), table.schema) as w:
        w.write_table(table)
    (tmp_path / "qa.tsv").write_text("question\tanswer\nq0\ta0\nq1\ta1\n")

    def register(**source):
        config = load("parquet_qa_tiny.py", str(tmp_path / "qa.parquet"))
        config.data.source.splits = {}
        for key, value in source.items():
            config.data.source[key] = value
        data_lib.register_tasks(launch_util.typed(config), ByteVocabulary())
        return DEFAULT_REGISTRY.get_task(config.data.task)

    try:
        splits = {"train": "train[:80%]", "validation": "train[80%:]"}
        task = register(format="hf", files={"train": str(tmp_path / "hf")}, splits=splits, columns={"targets": "text"},
                        recipe="lm")  # fmt: skip
        assert task.source.num_input_examples("validation") == 2 and list(task.output_features) == ["targets"]
        task = register(format="tsv", files={"train": str(tmp_path / "qa.tsv")})
        assert task.source.splits == ("train",) and task.source.read_options["format"] == "tsv"
        task = register(format="tsv", files={"train": str(tmp_path / "qa.tsv")}, columns={"targets": "question"},
                        recipe="prefix_lm")  # fmt: skip
        assert sorted(task.output_features) == ["inputs", "targets"]
        assert task.source.read_options["columns"] == {"targets": "question"}
        with pytest.raises(ConfigError, match=r"data.source.columns.*recipe lm maps targets to columns"):
            register(format="tsv", files={"train": str(tmp_path / "qa.tsv")}, recipe="lm")
        with pytest.raises(DataTasksError, match=r"qa.tsv has no column 'question'; its columns: text$"):
            (tmp_path / "qa.tsv").write_text("text\nq0\n")
            register(format="tsv", files={"train": str(tmp_path / "qa.tsv")})
    finally:
        DEFAULT_REGISTRY.remove("parquet_qa")
