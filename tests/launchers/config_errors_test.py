"""Bad configs fail before anything is compiled or written: exit status 2, a message naming
the key and the allowed values, and a file already in model_dir left as it was (docs/design.md §5).

Each refused run is a process forked from one interpreter that imported the train program
(`launch_util.ForkServer`): its own exit status and output, without a new interpreter each."""

import pathlib

import launch_util
import pytest

SENTINEL = '{"written": "before the run"}\n'


@pytest.fixture(scope="module")
def train():
    with launch_util.ForkServer("cairn.launchers.train_main") as server:
        yield server.run


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.json").write_text(SENTINEL)
    return d


def fails(train, model_dir: pathlib.Path, tmp_path, *overrides, config=launch_util.T5_CONFIG, prelude=""):
    proc = train(
        [
            f"--config={config}",
            f"--config.model_dir={model_dir}",
            f"--config.data.cache_dir={tmp_path / 'cache'}",
            *overrides,
        ],
        timeout=180,
        prelude=prelude,
    )
    assert proc.returncode == 2, launch_util.tail(proc)
    assert (model_dir / "config.json").read_text() == SENTINEL, "model_dir was written"
    assert sorted(p.name for p in model_dir.iterdir()) == ["config.json"]
    assert "Traceback" not in proc.stderr, launch_util.tail(proc)
    assert not (tmp_path / "cache").exists(), "data was cached before validation"
    return proc.stderr


def test_unknown_key_in_an_override(train, model_dir, tmp_path):
    err = fails(train, model_dir, tmp_path, "--config.trainer.log_evry=3")
    assert "'trainer.log_evry'" in err and "unknown key" in err
    assert "did you mean 'trainer.log_every'" in err
    assert "trainer.checkpoint_every" in err  # the allowed keys of the section


def test_unknown_key_in_a_config_file(train, model_dir, tmp_path):
    cfg = tmp_path / "exp.py"
    cfg.write_text(
        "from cairn.launchers import config_base\n"
        f"import importlib.util as u\n"
        f"s = u.spec_from_file_location('base_exp', {launch_util.T5_CONFIG!r}); m = u.module_from_spec(s)\n"
        "s.loader.exec_module(m)\n"
        "def get_config():\n"
        "    c = m.get_config()\n"
        "    c.optimizer.learning_rat = 0.1\n"
        "    return c\n"
    )
    err = fails(train, model_dir, tmp_path, config=str(cfg))
    assert "'optimizer.learning_rat'" in err and "unknown key in section 'optimizer'" in err
    assert "did you mean 'optimizer.learning_rate'" in err


def test_wrong_type(train, model_dir, tmp_path):
    err = fails(train, model_dir, tmp_path, "--config.num_train_steps=ten")
    assert "'num_train_steps'" in err and "int" in err and "'ten'" in err


def test_unknown_task(train, model_dir, tmp_path):
    err = fails(train, model_dir, tmp_path, "--config.data.task=shakespeare_span_corruptoin")
    assert "'data.task'" in err and "unknown task or mixture 'shakespeare_span_corruptoin'" in err
    assert "did you mean 'shakespeare_span_corruption'" in err


def test_targets_too_short_for_span_corruption(train, model_dir, tmp_path):
    err = fails(train, model_dir, tmp_path, "--config.data.sequence_length.targets=8")
    assert "data.sequence_length" in err and "targets >= 14" in err and "inputs length 64" in err


def test_length_that_cannot_hold_a_token(train, model_dir, tmp_path):
    err = fails(train, model_dir, tmp_path, "--config.data.sequence_length.inputs=1")
    assert "'data.sequence_length.inputs'" in err and "1 cannot hold one token and EOS" in err
    assert "must be >= 2" in err


def test_unknown_preset(train, model_dir, tmp_path):
    err = fails(train, model_dir, tmp_path, "--config.model.preset=t5_1_1_tinny")
    assert "'model.preset'" in err and "unknown preset 't5_1_1_tinny'" in err
    assert "did you mean 't5_1_1_tiny'" in err


def test_mesh_that_does_not_fit_the_devices(train, model_dir, tmp_path):
    err = fails(train, model_dir, tmp_path, "--config.partitioning.mesh.data=3", "--config.partitioning.mesh.model=2")
    assert "'partitioning.mesh'" in err
    assert "has 6 devices but 8 devices were given (1 process(es) x 8 device(s))" in err
    assert "a mesh that fits: {'data': 4, 'fsdp': 1, 'model': 2}" in err  # the model axis kept


def test_batch_that_does_not_divide_over_the_data_shards(train, model_dir, tmp_path):
    err = fails(train, model_dir, tmp_path, "--config.data.batch_size=12", "--config.partitioning.mesh.model=1")
    assert (
        "'data.batch_size': 12 does not divide over the 8 data-parallel shards of mesh "
        "{'data': 8, 'fsdp': 1, 'model': 1} on 1 process(es); use a multiple of 8"
    ) in err


def test_a_missing_tokenizer_json_is_named(train, model_dir, tmp_path):
    missing = tmp_path / "absent" / "tokenizer.json"
    err = fails(
        train, model_dir, tmp_path, "--config.vocabulary.kind=tokenizer_json", f"--config.vocabulary.path={missing}"
    )
    assert "'vocabulary.path'" in err and str(missing) in err
    assert len(err.strip().splitlines()) == 1, err


def test_a_split_slice_that_does_not_parse_is_named(train, model_dir, tmp_path):
    # A task module registering a TFDS task whose split spec cannot be parsed.
    (tmp_path / "sliced_tasks.py").write_text(
        "import cairn.datatasks as dt\n"
        "def register_tasks(vocabulary):\n"
        "    dt.TfdsDataSource('toy', '/nowhere', splits=['train[:9O%]'])\n"
    )
    err = fails(
        train,
        model_dir,
        tmp_path,
        "--config.data.task_modules=('sliced_tasks',)",
        prelude=f"import sys; sys.path.insert(0, {str(tmp_path)!r})",
    )
    assert "split 'train[:9O%]': cannot parse the slice boundary '9O%'" in err
    assert len(err.strip().splitlines()) == 1, err
