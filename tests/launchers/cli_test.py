"""The train program's command line before any training (child processes, as a user runs it):
`--help`, `--print_config`, a saved config.json given back as `--config`, overrides adding keys
under `model.overrides`, derived values following overrides, paths stored as given, and config
files that fail (exit 2, one line with file:line). Also `resume_check`'s comparison in-process.
The programs are processes forked from one interpreter that imported the train program
(`launch_util.ForkServer`): each its own exit status and output, without a new interpreter each."""

import json

import launch_util
import pytest

from cairn.launchers import config_io, resume_check, schema


@pytest.fixture(scope="module")
def train():
    """`train(tmp_path, *args)`: the train program with `tmp_path` as the user's directory
    (nothing is trained here)."""
    with launch_util.ForkServer("cairn.launchers.train_main", preload=("cairn.models",)) as server:
        yield lambda tmp_path, *args: server.run(
            list(args), env={"BUILD_WORKING_DIRECTORY": str(tmp_path)}, timeout=240
        )


def one_line_error(proc):
    assert proc.returncode == 2, launch_util.tail(proc)
    assert "Traceback" not in proc.stderr, launch_util.tail(proc)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, launch_util.tail(proc)
    return lines[0]


def test_help_exits_0_and_lists_the_config_flag_and_every_key(train, tmp_path):
    proc = train(tmp_path, "--help")
    assert proc.returncode == 0, launch_util.tail(proc)
    out = proc.stdout
    assert "--config=FILE.py[:ARG]" in out and "--print_config" in out and "--allow_changed" in out
    assert "  --config.model_dir  str (default '')" in out
    for path, type_name, default, _, help_text in schema.describe():
        assert f"  --config.{path}  {type_name} (default {default}" in out, path
        assert help_text in out, path
    assert "  --config.trainer.log_every  int (default 100; >= 0)" in out
    assert list(tmp_path.iterdir()) == []


def test_print_config_overrides_derived_values_free_form_keys_and_relative_paths(train, tmp_path):
    proc = train(
        tmp_path,
        f"--config={launch_util.T5_CONFIG}",
        "--config.optimizer.learning_rate=0.01",
        "--config.model.overrides.dropout_rate=0.0",
        "--config.model.overrides.scan_layers=true",
        f"--config.vocabulary.path={launch_util.REPO / 'launchers' / 'data' / 'shakespeare.model'}",
        "--config.data.cache_dir=cache/tasks",
        "--print_config",
    )
    assert proc.returncode == 0, launch_util.tail(proc)
    config = json.loads(proc.stdout)
    assert config["optimizer"]["learning_rate"] == 0.01
    assert config["optimizer"]["final_learning_rate"] == pytest.approx(0.001)  # follows learning_rate
    assert config["model"]["overrides"] == {"dropout_rate": 0.0, "scan_layers": True}
    assert config["model_dir"] == "runs/shakespeare_t5_tiny"  # the default, relative to the user's directory
    assert config["data"]["cache_dir"] == "cache/tasks"  # given relative, stored relative
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_relative_vocabulary_path_is_stored_relative(train, tmp_path):
    (tmp_path / "spm.model").write_bytes((launch_util.REPO / "launchers" / "data" / "shakespeare.model").read_bytes())
    proc = train(tmp_path, f"--config={launch_util.T5_CONFIG}", "--config.vocabulary.path=spm.model", "--print_config")
    assert proc.returncode == 0, launch_util.tail(proc)
    assert json.loads(proc.stdout)["vocabulary"]["path"] == "spm.model"


def test_a_saved_config_loads_as_config_and_prints_the_same(train, tmp_path):
    first = train(
        tmp_path, f"--config={launch_util.T5_CONFIG}", "--config.model.overrides.dropout_rate=0.0", "--print_config"
    )
    assert first.returncode == 0, launch_util.tail(first)
    (tmp_path / "config.json").write_text(first.stdout)
    again = train(tmp_path, "--config=config.json", "--print_config")
    assert again.returncode == 0, launch_util.tail(again)
    assert again.stdout == first.stdout
    changed = train(tmp_path, "--config=config.json", "--config.seed=3", "--print_config")
    assert changed.returncode == 0, launch_util.tail(changed)
    assert json.loads(changed.stdout)["seed"] == 3


def test_config_file_syntax_error_is_one_line_with_file_and_line(train, tmp_path):
    (tmp_path / "exp.py").write_text("from cairn.launchers import config_base\n\ndef get_config(:\n    pass\n")
    line = one_line_error(train(tmp_path, "--config=exp.py"))
    assert f"{tmp_path / 'exp.py'}:3: syntax error" in line


def test_bad_import_in_a_config_file_is_one_line(train, tmp_path):
    (tmp_path / "exp.py").write_text("import cairn.launchers.no_such_module\n\ndef get_config():\n    return None\n")
    line = one_line_error(train(tmp_path, "--config=exp.py"))
    assert f"{tmp_path / 'exp.py'}:1: ModuleNotFoundError" in line and "no_such_module" in line


def test_a_missing_config_file_is_one_line(train, tmp_path):
    line = one_line_error(train(tmp_path, "--config=missing.py"))
    assert "config file 'missing.py' does not exist" in line


def test_invalid_saved_config_names_file_and_line(train, tmp_path):
    (tmp_path / "config.json").write_text('{\n  "seed": 0,\n  "model": nope\n}\n')
    line = one_line_error(train(tmp_path, "--config=config.json"))
    assert f"{tmp_path / 'config.json'}:3: not valid JSON" in line


def test_an_override_that_does_not_parse_names_the_value_without_a_stray_colon(train, tmp_path):
    line = one_line_error(train(tmp_path, f"--config={launch_util.T5_CONFIG}", "--config.trainer.log_every=abc"))
    assert "'trainer.log_every': cannot parse the override 'abc' as int" in line
    assert "'abc:'" not in line


def test_a_free_form_override_of_an_unknown_preset_field_is_named(train, tmp_path):
    line = one_line_error(
        train(tmp_path, f"--config={launch_util.T5_CONFIG}", "--config.model.overrides.dropout_rat=0.0")
    )
    assert "model.overrides.dropout_rat" in line and "dropout_rate" in line


def test_derived_final_learning_rate_follows_learning_rate_in_process():
    config = config_io.load_config_file(launch_util.T5_CONFIG)
    assert config.optimizer.final_learning_rate == pytest.approx(3e-4)
    config.optimizer.learning_rate = 0.02
    assert config_io.resolve_paths(config).optimizer.final_learning_rate == pytest.approx(0.002)


def test_resume_differences_leave_out_the_keys_allowed_to_change():
    old = {"num_train_steps": 6, "seed": 0, "trainer": {"log_every": 2}, "model": {"overrides": {}}}
    new = {"num_train_steps": 9, "seed": 1, "trainer": {"log_every": 5}, "model": {"overrides": {"dropout_rate": 0.0}}}
    assert resume_check.differences(old, new) == [
        ("model.overrides.dropout_rate", "(absent)", 0.0),
        ("seed", 0, 1),
    ]
    assert resume_check.differences(old, new, allowed=["seed", "model.overrides"]) == []
    assert resume_check.differences(old, old) == []
    # The layout may change (elastic resume onto another mesh or number of slices).
    remeshed = {**old, "partitioning": {"mesh": {"data": 4, "model": 2}, "num_slices": 2}}
    assert resume_check.differences({**old, "partitioning": {"mesh": {"data": 8, "model": 1}}}, remeshed) == []


def _forms(config):
    """`(stored, plain)` of a loaded config: what `resume_check.check` compares (`RunSpec.stored`, `.plain`)."""
    return config_io.stored_form(config), config_io.to_plain(config)


def _write_config_json(config):
    config_io.write_config_json(config_io.stored_form(config), config.model_dir)


def test_resume_check_follows_derived_values_of_allowed_keys(tmp_path):
    """The tiny runs' warmup follows num_train_steps: more steps resume; a changed learning rate
    (and its derived final learning rate) is refused, each key listed old -> new."""
    from cairn.launchers.validation import ConfigError

    raw = config_io.load_config_file(launch_util.T5_CONFIG)
    raw.model_dir = str(tmp_path / "run")
    _write_config_json(config_io.resolve_paths(raw))
    raw.num_train_steps = 3600  # warmup_steps 90 -> 180 follows
    resume_check.check(*_forms(config_io.resolve_paths(raw)), allowed=[], raw=raw)
    with pytest.raises(ConfigError, match="optimizer.warmup_steps: 90 -> 180"):
        resume_check.check(*_forms(config_io.resolve_paths(raw)), allowed=[])  # without the references
    raw.optimizer.learning_rate = 0.01
    with pytest.raises(ConfigError) as e:
        resume_check.check(*_forms(config_io.resolve_paths(raw)), allowed=[], raw=raw)
    assert "optimizer.final_learning_rate: 0.00030000000000000003 -> 0.001" in str(e.value)
    assert "optimizer.learning_rate: 0.003 -> 0.01" in str(e.value) and "warmup" not in str(e.value)
    resume_check.check(*_forms(config_io.resolve_paths(raw)), allowed=["optimizer"], raw=raw)
    with pytest.raises(ConfigError, match="unknown config key 'optimizer.learning_rat'"):
        resume_check.check(*_forms(config_io.resolve_paths(raw)), allowed=["optimizer.learning_rat"], raw=raw)


def test_resume_check_compares_paths_by_the_file_they_name(tmp_path, monkeypatch):
    from cairn.launchers.validation import ConfigError

    monkeypatch.setenv("BUILD_WORKING_DIRECTORY", str(tmp_path))
    (tmp_path / "spm.model").write_bytes(b"x")
    (tmp_path / "other.model").write_bytes(b"x")
    raw = config_io.load_config_file(launch_util.T5_CONFIG)
    raw.model_dir = "run"
    raw.vocabulary.path = "spm.model"
    _write_config_json(config_io.resolve_paths(raw))
    assert json.loads((tmp_path / "run" / "config.json").read_text())["vocabulary"]["path"] == "spm.model"
    raw.vocabulary.path = str(tmp_path / "spm.model")  # the same file, given absolute
    resume_check.check(*_forms(config_io.resolve_paths(raw)), allowed=[], raw=raw)
    raw.vocabulary.path = "other.model"
    with pytest.raises(ConfigError, match='vocabulary.path: "spm.model" -> "other.model"'):
        resume_check.check(*_forms(config_io.resolve_paths(raw)), allowed=[], raw=raw)


def test_the_default_experiments_vocabulary_is_stored_relative_to_the_users_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("BUILD_WORKING_DIRECTORY", str(launch_util.REPO))
    config = config_io.resolve_paths(config_io.load_config_file(launch_util.T5_CONFIG))
    assert config.vocabulary.path == str(launch_util.REPO / "launchers" / "data" / "shakespeare.model")
    assert config_io.stored_form(config)["vocabulary"]["path"] == "launchers/data/shakespeare.model"
    monkeypatch.setenv("BUILD_WORKING_DIRECTORY", str(tmp_path))  # the repository is elsewhere: absolute
    config = config_io.resolve_paths(config_io.load_config_file(launch_util.T5_CONFIG))
    assert config_io.stored_form(config)["vocabulary"]["path"] == config.vocabulary.path
