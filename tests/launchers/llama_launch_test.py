"""`model.kind = "llama"` through the launchers: the `model.*` keys map onto `LlamaConfig`,
`model.dtype` / `model.param_dtype` / `model.matmul_precision` for every family (bad values: one
line, exit 2), the shakespeare_llama_tiny experiment trained, continued, evaluated with
`--decode` and inferred from prompts, and the bf16 pod configs (llama_1b_pretrain,
t5_1_1_pretrain:xl_bf16 / xxl_bf16) checked by the JobSet renderer's and tpu.sh's dry runs; the
dtype keys on a Hugging Face Llama directory's config.

The child processes, and this one, run on 2 CPU devices (`launch_util.devices`): training,
`eval --decode` and infer of the tiny Llama need no mesh of 8, and cost about half the CPU on 2.
`eval --decode` runs in this process on the trained run's saved config; the train and infer
programs are processes forked from one interpreter (`launch_util.ForkServer`)."""

import json
import os
import pathlib
import re
import shlex
import subprocess
import types

import launch_util
import pytest
import yaml

import cairn
from cairn.launchers import builder, config_base, config_io, run_spec, validation
from cairn.launchers.validation import ConfigError

devices = launch_util.devices_fixture(2, this_process=True)
CONFIG = str(launch_util.CONFIGS / "shakespeare_llama_tiny.py")
LLAMA_1B = "launchers/configs/llama_1b_pretrain.py"
T5_XL = "launchers/configs/t5_1_1_pretrain.py:xl_bf16"
SHAKESPEARE_SPM = str(launch_util.REPO / "launchers" / "data" / "shakespeare.model")
PROMPT = "ROMEO. O, she doth teach"
POD_SETTINGS = [
    "--config.model.dtype=bfloat16",
    "--config.model.overrides.scan_layers=True",
    "--config.model.overrides.remat_policy=full",
]


def _config(kind="llama", preset="llama_tiny", **overrides):
    config = config_base.base_config()
    config.model.kind, config.model.preset = kind, preset
    config.model.overrides = overrides
    return config


def _checked(config):
    return validation.check_model(launch_util.typed(config))


@pytest.mark.parametrize(
    "kind,preset", [("encoder_decoder", "t5_1_1_tiny"), ("decoder_only", "decoder_only_tiny"), ("llama", "llama_tiny")]
)
def test_model_dtype_and_param_dtype_set_every_family(kind, preset):
    config = _config(kind, preset)
    assert _checked(config).dtype == "float32"  # "preset": the preset's
    config.model.dtype = "bfloat16"
    assert _checked(config).dtype == "bfloat16"
    config.model.param_dtype = "float32"  # what every family can store
    assert _checked(config).dtype == "bfloat16"
    config.model.param_dtype = "bfloat16"  # every family's config has param_dtype
    assert _checked(config).param_dtype == "bfloat16"
    config.model.dtype = "bf16"
    with pytest.raises(
        ConfigError,
        match=r"'model.dtype': unknown value 'bf16'; did you mean 'bfloat16'.*"
        r"allowed: bfloat16, float16, float32, preset",
    ):
        launch_util.typed(config)


@pytest.mark.parametrize(
    "kind,preset", [("encoder_decoder", "t5_1_1_tiny"), ("decoder_only", "decoder_only_tiny"), ("llama", "llama_tiny")]
)
def test_model_matmul_precision_sets_every_family(kind, preset):
    config = _config(kind, preset)
    assert _checked(config).matmul_precision == "default"  # "preset": the preset's
    config.model.matmul_precision = "fp8"
    assert _checked(config).matmul_precision == "fp8"
    config.model.matmul_precision = "fp4"
    with pytest.raises(
        ConfigError, match=r"'model.matmul_precision': unknown value 'fp4'.*allowed: default, fp8, preset"
    ):
        launch_util.typed(config)


def test_model_dtype_and_an_override_that_contradicts_it():
    config = _config(dtype="float16")
    config.model.dtype = "bfloat16"
    with pytest.raises(ConfigError, match=r"'model.dtype': 'bfloat16' contradicts model.overrides.dtype='float16'"):
        _checked(config)


def test_llama_fields_map_onto_the_llama_config():
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    net = _checked(
        _config(
            num_kv_heads=1,
            rope_theta=500000.0,
            rope_scaling=scaling,
            tie_word_embeddings=False,
            scan_layers=True,
            remat_policy="dots",
        )
    )
    assert (net.num_kv_heads, net.rope_theta, net.tie_word_embeddings) == (1, 500000.0, False)
    assert (net.scan_layers, net.remat_policy) == (True, "dots")
    assert net.rope_scaling_dict == {"rope_type": "llama3", **scaling}
    # A preset with llama3 scaling: a mapping replaces its pairs; a bad one is named.
    assert _checked(_config(preset="llama_1b", rope_scaling=scaling)).rope_scaling_dict["factor"] == 8.0
    with pytest.raises(ConfigError, match=r"'model.overrides': LlamaConfig.rope_scaling needs exactly the keys"):
        _checked(_config(rope_scaling={"factor": 8.0}))


def test_heads_not_divisible_by_kv_heads_name_both():
    with pytest.raises(ConfigError, match=r"num_heads \(4\) must be a multiple of num_kv_heads \(3\)"):
        _checked(_config(num_kv_heads=3))


def test_param_dtype_reaches_the_parameters():
    import jax

    config = _config()
    config.vocabulary.path = SHAKESPEARE_SPM
    config.model.dtype = config.model.param_dtype = "bfloat16"
    params = builder.load_model(launch_util.spec(config)).init(jax.random.key(0))
    dtypes = {str(p.dtype) for p in jax.tree.leaves(params)}
    assert dtypes == {"bfloat16"}, dtypes


def test_bad_dtypes_and_heads_from_the_command_line_are_one_line_exit_2(programs, tmp_path):
    """The train program on each bad value, each run in its own process forked from one
    interpreter that imported it (`launch_util.ForkServer`)."""
    bad = ["--config.model.dtype=bf16", "--config.model.param_dtype=int8", "--config.model.overrides.num_kv_heads=3"]
    lines = []
    for i, flag in enumerate(bad):
        proc = programs.run([f"--config={CONFIG}", f"--config.model_dir={tmp_path / f'run{i}'}", flag], timeout=180)
        assert proc.returncode == 2, launch_util.tail(proc)
        assert "Traceback" not in proc.stderr and not (tmp_path / f"run{i}").exists(), launch_util.tail(proc)
        lines.append(proc.stderr.strip().splitlines()[-1])
    assert lines[0].startswith("error: config key 'model.dtype': unknown value 'bf16'; did you mean 'bfloat16'"), lines
    assert lines[1].startswith("error: config key 'model.param_dtype': unknown value 'int8'"), lines
    assert "num_heads (4) must be a multiple of num_kv_heads (3)" in lines[2], lines


@pytest.fixture(scope="module")
def programs(devices):
    """The launchers' programs in processes forked from one interpreter that imported the train
    program and the libraries it trains with (`launch_util.ForkServer`)."""
    with launch_util.ForkServer("cairn.launchers.train_main", preload=("cairn.models", "cairn.trainer")) as server:
        yield server


@pytest.fixture(scope="module")
def trained(programs, tmp_path_factory):
    """shakespeare_llama_tiny, 4 steps on two short plays, with llama_1b_pretrain's model settings
    from the command line (bfloat16 compute, scanned layers, full remat)."""
    tmp = tmp_path_factory.mktemp("llama")
    env = {"CAIRN_SHAKESPEARE_DIR": launch_util.small_texts(tmp)}
    common = [
        f"--config={CONFIG}",
        f"--config.model_dir={tmp / 'run'}",
        f"--config.data.cache_dir={tmp / 'cache'}",
        "--config.num_train_steps=4",
        "--config.data.batch_size=8",
        "--config.eval.num_examples=4",
        "--config.eval.batch_size=4",
        "--config.post_training.max_decode_length=8",
    ]
    common += POD_SETTINGS
    proc = programs.run(common, env=env, timeout=600)
    assert proc.returncode == 0, launch_util.tail(proc)
    return tmp, common, env, proc


def test_training_ends_by_continuing_the_prompts(trained):
    tmp, _, _, proc = trained
    line = next(l for l in proc.stdout.splitlines() if l.startswith("generated 0:"))
    assert line.startswith(f"generated 0: {PROMPT}") and len(line) > len(f"generated 0: {PROMPT}") + 3, line
    assert "generated 1: To be, or not to be" in proc.stdout
    assert "final evaluation at step 4: shakespeare_lm (validation)" in proc.stdout
    saved = json.loads((tmp / "run" / "config.json").read_text())
    assert saved["model"]["kind"] == "llama" and saved["model"]["dtype"] == "bfloat16"
    assert saved["model"]["overrides"]["scan_layers"] is True


def test_eval_decode_and_infer_with_prompts(programs, trained):
    """`eval --decode` on the LM task with prediction metrics (decode_tasks.py): prompts (the first
    half of each example) continued; `infer --mode=predict` continues `--input_file`'s lines.
    The evaluation in this process, on the run's saved config (`eval_main.evaluate`, what the
    program runs once its flags are parsed; the eval program's own process is decode_test's,
    eval_infer_test's and eval_infer_multiprocess_test's); infer a forked child."""
    from unittest import mock

    from cairn.launchers import eval_main

    tmp, _, env, _ = trained
    with mock.patch.dict(os.environ, env):
        config = config_io.load_saved_config(str(tmp / "run" / "config.json"))
        modules = ("cairn.launchers.tasks.shakespeare", "decode_tasks")
        config.data.task_modules = type(config.data.task_modules)(modules)
        config.eval.task = "shakespeare_lm_decode"
        config = config_io.resolve_paths(config)
        printed = []
        spec = launch_util.spec(config)
        assert list(eval_main.evaluate(spec, config.model_dir, 4, decode=True, out=printed.append)) == [4], printed
    out_dir = tmp / "run" / "eval" / "validation"
    evaluated = [json.loads(l) for l in open(out_dir / "evaluated.jsonl")]
    metrics = evaluated[-1]["metrics"]["shakespeare_lm_decode"]
    assert evaluated[-1]["step"] == 4 and metrics["bleu"] >= 0 and metrics["perplexity"] > 1, evaluated
    examples = [json.loads(l) for l in open(out_dir / "examples" / "shakespeare_lm_decode-00000004.jsonl")]
    assert len(examples) == 4 and all(r["inputs"] and r["prediction"] for r in examples), examples
    prompts = tmp / "prompts.txt"
    prompts.write_text(f"{PROMPT}\nTo be, or not\n")
    out = tmp / "pred.jsonl"
    args = [f"--config={tmp / 'run' / 'config.json'}", f"--output={out}", "--mode=predict", f"--input_file={prompts}"]
    proc = programs.call("cairn.launchers.infer_main", args, env=env, timeout=600)
    assert proc.returncode == 0, launch_util.tail(proc)
    # Quiet without --verbose (issue 57): no absl-format INFO line but cairn's own (orbax logs
    # each checkpoint file it reads at INFO).
    ours = {p.name for root in cairn.__path__ for p in pathlib.Path(root).rglob("*.py")}
    info = [re.match(r"I\d{4} \S+ \d+ (\S+?):\d+\]", l) for l in proc.stderr.splitlines()]
    assert [m.group(0) for m in info if m and m.group(1) not in ours] == [], launch_util.tail(proc)
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    assert [(r["index"], r["input"]) for r in rows] == [(0, PROMPT), (1, "To be, or not")]
    assert all(0 < len(r["prediction_ids"]) <= 8 and r["prediction"] for r in rows), rows


def test_pod_configs_validate_with_bf16_scan_and_remat():
    for spec, family in ((LLAMA_1B, "LlamaConfig"), ("launchers/configs/t5_1_1_pretrain.py:xxl_bf16", "T5Config")):
        config = config_io.resolve_paths(config_io.load_config_file(str(launch_util.REPO / spec)))
        net = _checked(config)
        assert type(net).__name__ == family
        assert (net.dtype, net.scan_layers, net.remat_policy) == ("bfloat16", True, "full")
    assert (net.emb_dim, net.num_encoder_layers) == (4096, 24)  # xxl
    llama = config_io.resolve_paths(config_io.load_config_file(str(launch_util.REPO / LLAMA_1B)))
    assert validation.resolve_mesh(llama.partitioning.mesh, device_count=256) == {"data": 32, "fsdp": 8, "model": 1}
    assert llama.partitioning.fsdp_rules and llama.data.sequence_length.targets == 4096
    tokenizer = types.SimpleNamespace(vocab_size=128000)  # Llama 3's tokenizer.json: the preset's size stays
    keys = launch_util.typed(llama)
    assert run_spec.network_config(keys, validation.check_model(keys), tokenizer).vocab_size == 128256


def _jobset_args(out, spec, *extra):
    args = [f"--config={spec}", "--config.model_dir=gs://bucket/runs/x", "--image=registry.example/cairn:1"]
    return args + ["--accelerator=tpu-v5-lite-podslice", "--topology=8x8", f"--output={out}", *extra]


@pytest.fixture(scope="module")
def jobset_runs(tmp_path_factory):
    """The JobSet renderer on each pod config (and llama_1b_pretrain with too few devices for its
    fsdp axis), each run in its own process forked from one interpreter that imported it
    (`launch_util.run_forked`): `{name: (process, manifest path)}`."""
    tmp = tmp_path_factory.mktemp("jobset")
    llama = [f"--config.vocabulary.path={launch_util.tiny_tokenizer_json(tmp / 'tokenizer.json')}"]
    runs = {
        LLAMA_1B: (tmp / "llama.yaml", LLAMA_1B, *llama),
        "llama_fsdp_128": (tmp / "fsdp.yaml", LLAMA_1B, *llama, "--config.partitioning.mesh.fsdp=128"),
        T5_XL: (tmp / "t5.yaml", T5_XL, f"--config.vocabulary.path={SHAKESPEARE_SPM}"),
    }
    env = {"BUILD_WORKSPACE_DIRECTORY": "", "BUILD_WORKING_DIRECTORY": ""}
    procs = launch_util.run_forked(
        "cairn.launchers.jobset",
        [_jobset_args(*run) for run in runs.values()],
        env=env,
        timeout=240,
        preload=("cairn.models", "cairn.trainer"),
    )
    return {name: (proc, run[0]) for (name, run), proc in zip(runs.items(), procs)}


@pytest.mark.parametrize("spec", [LLAMA_1B, T5_XL])
def test_pod_configs_pass_the_jobset_dry_run(jobset_runs, spec):
    """The renderer validates the config for the slice (64 chips, 16 hosts) and writes no run."""
    proc, out = jobset_runs[spec]
    assert proc.returncode == 0, launch_util.tail(proc)
    manifest = yaml.safe_load(out.read_text())
    job = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["parallelism"] == 16
    args = job["template"]["spec"]["containers"][0]["args"]
    assert f"--config={spec}" in args
    # Too few devices for the fsdp axis: the renderer's one-line config error, exit 2.
    if spec == LLAMA_1B:
        proc, _ = jobset_runs["llama_fsdp_128"]
        assert proc.returncode == 2 and "partitioning.mesh" in proc.stderr.strip().splitlines()[-1], proc.stderr


def test_tpu_script_dry_run_carries_the_llama_config(tmp_path):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    script = launch_util.REPO / "launchers" / "pod" / "tpu.sh"
    args = ["--name=p", "--zone=z", "--accelerator_type=v5litepod-64", f"--config={LLAMA_1B}", "--dry_run"]
    proc = subprocess.run(
        ["bash", str(script), *args, "--", "--config.model.dtype=bfloat16"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=launch_util.REPO,
    )
    assert proc.returncode == 0, proc.stderr
    train = [line[2:] for line in proc.stdout.splitlines() if line.startswith("+ ")][-1]
    remote = shlex.split(train)[-1]
    trainer_args = remote.split("bazel-bin/launchers/supervise bazel-bin/launchers/train ", 1)[1]
    assert shlex.split(trainer_args) == [f"--config={LLAMA_1B}", "--config.model.dtype=bfloat16"]


def test_model_dtypes_apply_to_a_hugging_face_llama_config(tmp_path):
    import jax

    from cairn.models import PRESETS, DecoderOnlyModel
    from cairn.models.llama import hf

    net = PRESETS["llama_tiny"].replace(prompt_start_id=5)  # written as bos_token_id
    hf.export_hf(DecoderOnlyModel(net).init(jax.random.key(0)), net, str(tmp_path / "hf"))
    config = _config()
    config.init.hf_checkpoint = str(tmp_path / "hf")
    config.model.dtype = config.model.param_dtype = "bfloat16"
    keys = launch_util.typed(config)
    got = run_spec.network_config(keys, validation.check_model(keys), types.SimpleNamespace(vocab_size=1))
    assert (got.dtype, got.param_dtype, got.num_kv_heads, got.vocab_size) == ("bfloat16", "bfloat16", 2, 256)
    assert got.prompt_start_id == 5  # the checkpoint's start token decodes infer's and training's prompts
    from cairn.launchers import data

    reader = run_spec.ReaderSpec.of(keys, got)
    assert reader.start_id == 5 and data.feature_converter(reader).bos_id == 5  # and starts its training rows
    config.model.overrides = {"prompt_start_id": None}  # prompts that hold their own BOS
    keys = launch_util.typed(config)
    got = run_spec.network_config(keys, validation.check_model(keys), types.SimpleNamespace(vocab_size=1))
    reader = run_spec.ReaderSpec.of(keys, got)
    assert got.prompt_start_id is None and data.feature_converter(reader).bos_id == 0
    config.init.hf_checkpoint = ""  # a preset takes the override too (`int | None`: None passes the type check)
    assert validation.check_model(launch_util.typed(config)).prompt_start_id is None
