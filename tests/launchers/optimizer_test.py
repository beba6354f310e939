"""optimizer.* controls through the train entry point: a frozen group stays as it started while the
rest trains (Adafactor factored by logical axes, a group at half the learning rate); a pattern
that matches no parameter, or a bad group entry, exits 2 with one line naming it. Plus the
config -> OptimizerConfig mapping in-process. LoRA (`model.lora.*`) likewise: a run trains only
adapters of its base, eval reads them merged, and a bad LoRA config exits 2 naming the key; prompt
tuning (`model.prompt_tuning.*`) the same way.

The child processes run on 2 CPU devices (`launch_util.devices`): the optimizer groups need
no mesh of 8, and a training child on 2 devices costs about half the CPU of one on 8. They are
forked from one interpreter that imported the train program and the libraries it trains with
(`launch_util.ForkServer`), and read the standard runs' texts and task cache; the frozen run
starts from the standard runs' checkpointed run (tests/fixtures/standard_runs.py)."""

import json
import os

import launch_util
import numpy as np
import pytest
import standard_runs

devices = launch_util.devices_fixture(2)


@pytest.fixture(scope="module")
def standard(tmp_path_factory):
    """The standard runs, with the checkpoints of `standard_runs.CHECKPOINTED`."""
    return standard_runs.unpack(tmp_path_factory.mktemp("standard"), checkpoints=True)


@pytest.fixture(scope="module")
def texts(standard):
    return standard.texts


@pytest.fixture(scope="module")
def cache_dir(standard):
    return str(standard.cache)


@pytest.fixture(scope="module")
def train(devices):
    """`train(args, env)`: the train program, forked (the module's `devices` in its environment)."""
    with launch_util.ForkServer("cairn.launchers.train_main", preload=("cairn.models", "cairn.trainer")) as server:
        yield server.run


def small(model_dir, cache_dir, *extra):
    return [
        f"--config={launch_util.T5_CONFIG}",
        f"--config.model_dir={model_dir}",
        f"--config.data.cache_dir={cache_dir}",
        "--config.num_train_steps=2",
        "--config.data.batch_size=8",
        "--config.trainer.eval_every=0",
        "--config.post_training.final_eval=false",
        "--config.post_training.num_samples=0",
        "--config.fingerprint_every=0",
        *extra,
    ]


def checkpoint_params(model_dir, step):
    """{path: array} of a checkpoint's params, read as NumPy (no model needed)."""
    import jax
    import orbax.checkpoint as ocp

    from cairn.trainer.param_groups import param_paths

    state = os.path.join(model_dir, "checkpoints", str(step), "state")
    with ocp.PyTreeCheckpointer() as ckptr:
        item = {"params": dict(ckptr.metadata(state).item_metadata)["params"]}
        args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
        params = ckptr.restore(state, args=ocp.args.PyTreeRestore(item=item, restore_args=args, partial_restore=True))
    params = params["params"]
    return dict(zip(param_paths(params), jax.tree.leaves(params)))


def test_a_frozen_group_keeps_its_params_while_the_rest_trains(train, tmp_path, standard, texts, cache_dir):
    """From the standard checkpointed run's last checkpoint (a trained T5, not a fresh init), two
    steps with the encoder and the token embedder frozen."""
    env = {"CAIRN_SHAKESPEARE_DIR": texts}
    start, frozen = standard.run(standard_runs.CHECKPOINTED), tmp_path / "frozen"
    proc = train(
        small(
            frozen,
            cache_dir,
            f"--config.init.checkpoint={start}",
            "--config.optimizer.freeze=('^encoder/', 'token_embedder')",
            "--config.optimizer.groups=('logits=0.5',)",
            "--config.optimizer.factoring=logical",
            "--config.optimizer.weight_decay=0.001",
        ),
        env=env,
    )
    assert proc.returncode == 0, launch_util.tail(proc)
    assert "trained to step 2" in proc.stdout
    before = checkpoint_params(start, standard_runs.CHECKPOINTED_STEPS)
    after = checkpoint_params(frozen, 2)
    assert sorted(before) == sorted(after)
    encoder = [p for p in before if p.startswith("encoder/")]
    assert len(encoder) > 5
    for path in encoder + ["token_embedder/embedding"]:
        assert np.array_equal(before[path], after[path]), path
    for path in before:
        if path.startswith("decoder/") and path != "decoder/relpos_bias/rel_embedding":
            assert not np.array_equal(before[path], after[path]), path


def one_line_error(proc):
    assert proc.returncode == 2, launch_util.tail(proc)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, launch_util.tail(proc)
    return lines[0]


def test_a_pattern_matching_no_parameter_exits_2_naming_it(train, tmp_path, texts, cache_dir):
    env = {"CAIRN_SHAKESPEARE_DIR": texts}
    proc = train(small(tmp_path / "a", cache_dir, "--config.optimizer.freeze=('^encoder/', 'no_such')"), env=env)
    line = one_line_error(proc)
    assert "optimizer.freeze" in line and "'no_such' matches no parameter" in line
    assert not (tmp_path / "a").exists()  # refused before anything was written
    proc = train(small(tmp_path / "b", cache_dir, "--config.optimizer.groups=('logits',)"), env=env)
    assert "optimizer.groups" in one_line_error(proc) and "regex=learning_rate_scale" in proc.stderr


def test_config_keys_map_to_the_optimizer_config():
    from cairn.launchers import config_io, optimizer_setup, run_spec
    from cairn.launchers.validation import ConfigError
    from cairn.trainer import ParamGroup

    config = config_io.load_config_file(launch_util.T5_CONFIG)
    config.optimizer.factoring = "logical"
    config.optimizer.factor_rules = {"heads": "column"}
    config.optimizer.decay_rate = 0.5
    config.optimizer.clipping_threshold = None
    config.optimizer.groups = ("a=b=0.25", "^decoder/=2")
    opt = optimizer_setup.optimizer_config(run_spec.checked_keys(config)[1])
    assert opt.factoring == "logical" and opt.factor_rules == {"heads": "column"}
    assert opt.decay_rate == 0.5 and opt.clipping_threshold is None and opt.min_dim_size_to_factor == 128
    assert opt.groups == (ParamGroup("a=b", 0.25), ParamGroup("^decoder/", 2.0))
    optimizer_setup.check_patterns(opt, ["a=b/x", "decoder/y"])
    with pytest.raises(ConfigError, match="optimizer.groups.*'zzz' matches no parameter"):
        config.optimizer.groups = ("zzz=1",)
        optimizer_setup.check_patterns(optimizer_setup.optimizer_config(run_spec.checked_keys(config)[1]), ["a/b"])
    config.optimizer.groups = ()
    config.optimizer.factor_rules = {"heads": "sideways"}
    with pytest.raises(ConfigError, match="optimizer.factor_rules.*sideways"):
        optimizer_setup.optimizer_config(run_spec.checked_keys(config)[1])
    config.optimizer.factor_rules = {}
    config.optimizer.freeze = ("(",)
    with pytest.raises(ConfigError, match="optimizer.freeze.*invalid parameter pattern"):
        optimizer_setup.optimizer_config(run_spec.checked_keys(config)[1])
    config.optimizer.freeze = ("",)
    with pytest.raises(ConfigError, match="freezes every parameter"):
        optimizer_setup.check_patterns(optimizer_setup.optimizer_config(run_spec.checked_keys(config)[1]), ["a/b"])


def test_a_lora_run_trains_only_adapters_of_its_base(train, tmp_path, standard, texts, cache_dir):
    """LoRA (`model.lora.rank`) on the standard checkpointed run's T5: its checkpoint holds the
    adapters alone (B trained away from zero) and its config names the base checkpoint; eval reads
    the adapters folded into that base (`checkpoint_params.params_layout`), which differ from it."""
    env = {"CAIRN_SHAKESPEARE_DIR": texts}
    start, run = standard.run(standard_runs.CHECKPOINTED), tmp_path / "lora"
    lora = ("--config.model.lora.rank=4", "--config.optimizer.learning_rate=0.1")
    proc = train(small(run, cache_dir, f"--config.init.checkpoint={start}", *lora), env=env)
    assert proc.returncode == 0, launch_util.tail(proc)
    assert "trained to step 2" in proc.stdout and "LoRA rank 4 adapters of" in proc.stdout
    adapters = checkpoint_params(run, 2)
    assert adapters and all(p.endswith(("/lora_a", "/lora_b")) for p in adapters)
    assert "encoder/layers_0/attention/query/lora_b" in adapters and "decoder/layers_0/mlp/wo/lora_a" in adapters
    assert all(np.abs(v).max() > 0 for p, v in adapters.items() if p.endswith("lora_b"))
    saved = json.loads((run / "config.json").read_text())
    assert saved["init"]["checkpoint"] == str(start) and saved["model"]["lora"]["rank"] == 4

    import jax

    from cairn.launchers import builder, config_io, run_spec
    from cairn.launchers import checkpoint_params as ckpt_params
    from cairn.trainer.param_groups import param_paths

    spec = launch_util.spec(config_io.load_saved_config(str(run / "config.json")))
    assert spec.lora is not None and spec.lora.rank == 4
    bound = run_spec.bind(spec, jax.devices(), train=False)
    model = builder.load_model(spec)
    layout = ckpt_params.params_layout(spec, model, bound.partitioner)
    step, merged = ckpt_params.load_params(layout, str(run))
    base = checkpoint_params(start, standard_runs.CHECKPOINTED_STEPS)
    flat = dict(zip(param_paths(merged), jax.tree.leaves(merged)))
    assert step == 2 and sorted(flat) == sorted(base)
    assert np.array_equal(flat["token_embedder/embedding"], base["token_embedder/embedding"])  # not adapted
    assert not np.allclose(flat["encoder/layers_0/attention/query"], base["encoder/layers_0/attention/query"])

    # //launchers:export_peft: the adapters as a PEFT adapter, the base as a transformers checkpoint
    # (peft loading such a pair: tests/models/peft_test.py)
    from cairn.launchers.peft_export_main import export
    from cairn.models import import_hf
    from cairn.models.peft_interchange import import_peft

    base_dir, adapter_dir = export(spec, str(tmp_path / "peft"), str(run), out=lambda line: None)
    lora, imported = import_peft(adapter_dir, spec.model)
    round_trip = dict(zip(param_paths(imported), jax.tree.leaves(imported)))
    assert (lora.rank, lora.scale) == (4, spec.lora.scale) and sorted(round_trip) == sorted(adapters)
    assert all(np.array_equal(round_trip[p], adapters[p]) for p in adapters)
    _, exported = import_hf(base_dir)
    assert all(np.array_equal(v, base[p]) for p, v in zip(param_paths(exported), jax.tree.leaves(exported)))
    import dataclasses

    from cairn.launchers.validation import ConfigError

    with pytest.raises(ConfigError, match="'model.lora.rank': None: export_peft writes a LoRA run's adapters"):
        export(dataclasses.replace(spec, lora=None), str(tmp_path / "none"), str(run))


def test_bad_lora_configs_exit_2_naming_the_key(train, tmp_path, standard, texts, cache_dir):
    env = {"CAIRN_SHAKESPEARE_DIR": texts}
    start = standard.run(standard_runs.CHECKPOINTED)
    based = ("--config.model.lora.rank=4", f"--config.init.checkpoint={start}")
    cases = [
        (("--config.model.lora.rank=0", based[1]), "model.lora.rank", ">= 1"),
        (("--config.model.lora.rank=4",), "model.lora.rank", "LoRA adapts a base model; set one of init.checkpoint"),
        (
            (*based, "--config.model.lora.targets=('wo', 'nowhere')"),
            "model.lora.targets",
            "LoRA target 'nowhere' matches no parameter",
        ),
        ((*based, "--config.trainer.offload_params=true"), "trainer.offload_params", "not supported with LoRA"),
    ]
    for i, (extra, key, message) in enumerate(cases):
        proc = train(small(tmp_path / str(i), cache_dir, *extra), env=env)
        line = one_line_error(proc)
        assert key in line and message in line, line
        assert not (tmp_path / str(i)).exists()


def test_a_prompt_tuning_run_trains_only_a_prompt_for_its_base(train, tmp_path, standard, texts, cache_dir):
    """Prompt tuning (`model.prompt_tuning.length`) on the standard checkpointed run's T5, its
    prompt started from a text's tokens: the checkpoint holds the prompt alone (trained away from
    those tokens' embeddings) and its config names the base; eval reads the base with the prompt
    beside its embedding table (`checkpoint_params.params_layout`), the base's weights unchanged."""
    env = {"CAIRN_SHAKESPEARE_DIR": texts}
    start, run = standard.run(standard_runs.CHECKPOINTED), tmp_path / "prompt"
    prompt = (
        "--config.model.prompt_tuning.length=6",
        "--config.model.prompt_tuning.init=tokens",
        "--config.model.prompt_tuning.text=Hamlet, Prince of Denmark",
        "--config.optimizer.learning_rate=0.3",
    )
    proc = train(small(run, cache_dir, f"--config.init.checkpoint={start}", *prompt), env=env)
    assert proc.returncode == 0, launch_util.tail(proc)
    assert "trained to step 2" in proc.stdout and "a 6-embedding prompt (tokens) for" in proc.stdout
    stored = checkpoint_params(run, 2)
    assert list(stored) == ["token_embedder/prompt"] and stored["token_embedder/prompt"].shape[0] == 6
    saved = json.loads((run / "config.json").read_text())
    assert saved["init"]["checkpoint"] == str(start) and saved["model"]["prompt_tuning"]["length"] == 6

    import jax

    from cairn.launchers import builder, config_io, run_spec
    from cairn.launchers import checkpoint_params as ckpt_params
    from cairn.trainer.param_groups import param_paths

    spec = launch_util.spec(config_io.load_saved_config(str(run / "config.json")))
    assert spec.prompt_tuning is not None and spec.prompt_tuning.init == "tokens"
    ids = spec.vocabulary.encode("Hamlet, Prince of Denmark")
    bound = run_spec.bind(spec, jax.devices(), train=False)
    layout = ckpt_params.params_layout(spec, builder.load_model(spec), bound.partitioner)
    step, merged = ckpt_params.load_params(layout, str(run))
    base = checkpoint_params(start, standard_runs.CHECKPOINTED_STEPS)
    flat = dict(zip(param_paths(merged), jax.tree.leaves(merged)))
    assert step == 2 and sorted(flat) == sorted([*base, "token_embedder/prompt"])
    assert all(np.array_equal(flat[p], base[p]) for p in base)  # the base is as it was
    table = base["token_embedder/embedding"]
    started = table[list(ids)[:6]]  # the prompt started as the text's embeddings, then trained
    assert not np.allclose(flat["token_embedder/prompt"][: len(started)], started)


def test_bad_prompt_tuning_configs_exit_2_naming_the_key(train, tmp_path, standard, texts, cache_dir):
    env = {"CAIRN_SHAKESPEARE_DIR": texts}
    base = f"--config.init.checkpoint={standard.run(standard_runs.CHECKPOINTED)}"
    length = "--config.model.prompt_tuning.length=4"
    cases = [
        (("--config.model.prompt_tuning.length=0", base), "model.prompt_tuning.length", ">= 1"),
        ((length, base, "--config.model.prompt_tuning.init=labels"), "model.prompt_tuning.init", "unknown value"),
        ((length,), "model.prompt_tuning.length", "prompt tuning adapts a base model; set one of init.checkpoint"),
        ((length, base, "--config.model.lora.rank=4"), "model.prompt_tuning.length", "cannot be combined with LoRA"),
        ((length, base, "--config.data.pack=true"), "data.pack", "not supported with prompt tuning"),
        ((length, base, "--config.model.prompt_tuning.init=tokens"), "model.prompt_tuning.tokens", "must hold token"),
        ((length, base, "--config.model.prompt_tuning.text=To be"), "model.prompt_tuning.text", "init='tokens' only"),
    ]
    for i, (extra, key, message) in enumerate(cases):
        proc = train(small(tmp_path / str(i), cache_dir, *extra), env=env)
        line = one_line_error(proc)
        assert key in line and message in line, line
        assert not (tmp_path / str(i)).exists()
