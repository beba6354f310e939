"""Run fingerprints and `//launchers:verify` on real short runs of `cairn.trainer.Trainer`:
same seed => identical (also after a resume), data changed at step k => step k named."""

import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cairn.launchers import fingerprint as fp
from cairn.launchers.entry import UsageError
from cairn.launchers.fingerprint import FingerprintError
from cairn.launchers.verify import compare_runs, verify_runs
from cairn.partitioning import Partitioner, create_mesh, standard_logical_axis_rules
from cairn.trainer import OptimizerConfig, Trainer, TrainerConfig

VOCAB, EMBED, LENGTH, STEPS, EVERY, PERTURB_AT = 32, 64, 8, 12, 2, 7


class _Net(nn.Module):
    @nn.compact
    def __call__(self, tokens, deterministic: bool):
        init = nn.initializers.normal(0.02)
        emb = self.param("embedding", nn.with_logical_partitioning(init, ("vocab", "embed")), (VOCAB, EMBED))
        wi = self.param("wi", nn.with_logical_partitioning(init, ("embed", "mlp")), (EMBED, 2 * EMBED))
        x = emb[tokens]
        h = nn.Dropout(0.1)(jax.nn.relu(x @ wi), deterministic=deterministic)
        return (x + h @ wi.T) @ emb.T


class TinyModel:
    """The trainer's model protocol (as tests/trainer/tiny_model.py): init(rng, batch), loss_fn."""

    def __init__(self):
        self.net = _Net()

    def init(self, rng, batch):
        return self.net.init(rng, jnp.asarray(batch["inputs"]), True)["params"]

    def loss_fn(self, params, batch, dropout_rng):
        logits = self.net.apply({"params": params}, batch["inputs"], False, rngs={"dropout": dropout_rng})
        loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]))
        return loss, {}


class Batches:
    """Deterministic batches with a checkpointable position; `perturb_step` changes one token of
    the batch that train step `perturb_step` consumes (position perturb_step - 1)."""

    def __init__(self, seed=0, perturb_step=None):
        self.seed, self.position, self.perturb_step = seed, 0, perturb_step

    def __iter__(self):
        return self

    def __next__(self):
        rng = np.random.default_rng([self.seed, self.position])
        inputs = rng.integers(0, VOCAB, size=(16, LENGTH), dtype=np.int32)
        if self.perturb_step is not None and self.position == self.perturb_step - 1:
            inputs[0, 0] = (inputs[0, 0] + 1) % VOCAB
        self.position += 1
        return {"inputs": inputs, "targets": (inputs * 7 + 3) % VOCAB}

    def get_state(self):
        return {"position": self.position}

    def set_state(self, state):
        self.position = int(state["position"])


def _train(model_dir, steps=STEPS, perturb_step=None, seed=0, config=None):
    config = config or {"model": "tiny", "steps": STEPS, "seed": seed}
    partitioner = Partitioner(create_mesh({"data": 4, "model": 2}), standard_logical_axis_rules())
    run_fp = fp.RunFingerprint(str(model_dir), checksum_every=EVERY)
    run_fp.write_header(
        config_hash=fp.config_hash(config),
        data_fingerprint=f"batches-seed{seed}",
        seed=seed,
        process_count=jax.process_count(),
        device_count=jax.device_count(),
        mesh=dict(partitioner.mesh.shape),
    )
    cfg = TrainerConfig(
        model_dir=str(model_dir), num_train_steps=steps, seed=seed, log_every=4, checkpoint_every=3, tensorboard=False
    )
    trainer = Trainer(
        TinyModel(),
        OptimizerConfig(name="adamw"),
        1e-2,
        partitioner,
        cfg,
        step_hooks=[run_fp.step_hook],
        batch_hooks=[run_fp.batch_hook],
    )
    return trainer.train(Batches(seed, perturb_step))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    assert jax.device_count() == 8, "run through tools/testing/pytest_main.py (8 CPU devices)"
    root = tmp_path_factory.mktemp("runs")
    _train(root / "a")
    _train(root / "b", steps=5)  # stopped, then resumed from its step-3 checkpoint... and its step 5 save
    _train(root / "b")
    _train(root / "perturbed", perturb_step=PERTURB_AT)
    return root


def _verify(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("BUILD_WORKING_DIRECTORY", None)
    return subprocess.run(
        [sys.executable, "-m", "cairn.launchers.verify", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_fingerprint_files(runs):
    header = json.loads((runs / "a" / "fingerprint" / "header.json").read_text())
    assert header["config_hash"] == fp.config_hash({"seed": 0, "steps": STEPS, "model": "tiny"})
    assert header["mesh"] == {"data": 4, "model": 2} and header["device_count"] == 8
    lines = (runs / "a" / "fingerprint" / "checksums.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["step"] for r in rows] == list(range(EVERY, STEPS + 1, EVERY))
    assert set(rows[0]) == {"step", "param_sha256", "param_sum", "param_abs_sum"}
    assert len({r["param_sha256"] for r in rows}) == len(rows)  # the params change every step
    run = fp.load_run(runs / "a")
    assert list(run.losses) == list(range(1, STEPS + 1)) and list(run.checksums) == [r["step"] for r in rows]


def test_identical_seeds_are_identical_also_after_a_resume(runs):
    report = compare_runs(runs / "a", runs / "b")
    assert report.identical and report.exit_code == 0, report.text()
    assert report.losses_compared == STEPS and report.checksums_compared == STEPS // EVERY
    assert report.batches_compared == STEPS
    assert (
        f"identical through step {STEPS} ({STEPS} losses, {STEPS // EVERY} checksums, {STEPS} batch "
        f"fingerprints compared)"
    ) in report.text()
    result = _verify(f"--run_a={runs / 'a'}", f"--run_b={runs / 'b'}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"identical through step {STEPS}" in result.stdout


def test_data_perturbed_at_step_k_is_named(runs):
    report = compare_runs(runs / "a", runs / "perturbed")
    assert report.first_divergence is not None and report.exit_code == 1
    # The batch fingerprint names the step before any loss is compared at it.
    assert report.first_divergence.step == PERTURB_AT and report.first_divergence.quantity == "batch_sha256"
    assert report.losses_compared == PERTURB_AT - 1 and report.checksums_compared == (PERTURB_AT - 1) // EVERY
    result = _verify(f"--run_a={runs / 'a'}", f"--run_b={runs / 'perturbed'}")
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"first divergent step: {PERTURB_AT} (batch_sha256)" in result.stdout
    # Without batch fingerprints (older runs), the loss names the step.
    for name in ("a", "perturbed"):
        (runs / name / "fingerprint" / "batches.jsonl").rename(runs / name / "fingerprint" / "batches.off")
    try:
        by_loss = compare_runs(runs / "a", runs / "perturbed")
    finally:
        for name in ("a", "perturbed"):
            (runs / name / "fingerprint" / "batches.off").rename(runs / name / "fingerprint" / "batches.jsonl")
    assert by_loss.first_divergence.step == PERTURB_AT and by_loss.first_divergence.quantity == "loss"
    # A loose tolerance accepts the one-token change's tiny effect on the loss, not on the params.
    loose = compare_runs(runs / "a", runs / "perturbed", rtol=0.5, atol=0.0)
    assert loose.first_divergence is None or loose.first_divergence.step >= PERTURB_AT


def test_missing_dir_and_missing_fingerprint_exit_2(runs, tmp_path):
    result = _verify(f"--run_a={runs / 'a'}", f"--run_b={tmp_path / 'nope'}")
    assert result.returncode == 2 and str(tmp_path / "nope") in result.stderr
    (tmp_path / "bare" / "summaries").mkdir(parents=True)
    bare = _verify(f"--run_a={runs / 'a'}", f"--run_b={tmp_path / 'bare'}")
    assert bare.returncode == 2 and bare.stderr.startswith("verify: ") and len(bare.stderr.splitlines()) == 1
    with pytest.raises(FingerprintError):
        verify_runs(str(runs / "a"), str(tmp_path / "bare"))
    with pytest.raises(UsageError, match="must be >= 0"):
        verify_runs(str(runs / "a"), str(runs / "b"), rtol=-1.0)
    negative = _verify(f"--run_a={runs / 'a'}", f"--run_b={runs / 'b'}", "--rtol=-1")
    assert negative.returncode == 2 and "--rtol and --atol must be >= 0" in negative.stderr
    verbose = _verify(f"--run_a={runs / 'a'}", f"--run_b={tmp_path / 'bare'}", "--verbose")
    assert verbose.returncode == 2 and "Traceback" in verbose.stderr


def test_paths_resolve_against_build_working_directory(runs, monkeypatch, capsys):
    monkeypatch.setenv("BUILD_WORKING_DIRECTORY", str(runs))
    assert verify_runs("a", "b") == 0
    assert "identical through step" in capsys.readouterr().out


def _write_run(root, losses, checksums, config_hash="c", data="d", extra=""):
    (root / "fingerprint").mkdir(parents=True)
    (root / "summaries").mkdir()
    (root / "fingerprint" / "header.json").write_text(
        json.dumps({"config_hash": config_hash, "data_fingerprint": data, "seed": 0, "mesh": {"data": 8}})
    )
    with open(root / "summaries" / "metrics.jsonl", "w") as f:
        for step, value in losses:
            f.write(json.dumps({"task": "train", "step": step, "metric": "loss", "value": value}) + "\n")
            f.write(json.dumps({"task": "train", "step": step, "metric": "accuracy", "value": 0.5}) + "\n")
        f.write(extra)
    with open(root / "fingerprint" / "checksums.jsonl", "w") as f:
        for step, sha, total in checksums:
            f.write(
                json.dumps({"step": step, "param_sha256": sha, "param_sum": total, "param_abs_sum": abs(total)}) + "\n"
            )
        f.write('{"step": 99, "param_sha')  # a truncated last line: ignored


def test_synthetic_runs_last_row_wins_checksums_tolerance_and_headers(tmp_path):
    # Run A was resumed: steps 3-4 were logged twice (the first time before a crash); the last row wins.
    _write_run(
        tmp_path / "a",
        [(1, 2.0), (2, 1.5), (3, 9.0), (4, 9.0), (3, 1.25), (4, 1.125), (5, 1.0)],
        [(2, "x", 1.0), (4, "y", 2.0)],
        extra='{"task": "train", "step": 6, "met',
    )
    _write_run(tmp_path / "b", [(1, 2.0), (2, 1.5), (3, 1.25), (4, 1.125)], [(2, "x", 1.0), (4, "z", 2.0 + 1e-9)])
    report = compare_runs(tmp_path / "a", tmp_path / "b")
    d = report.first_divergence
    assert (d.step, d.quantity, d.value_a, d.value_b) == (4, "param_sha256", "y", "z")
    assert ("losses", (5,)) in report.only_in_a and "only in run A: losses at steps 5 (run B lacks" in report.text()
    # A step one run lacks (a row lost on a kill) fails, unless only the common steps are asked for.
    tolerant = compare_runs(tmp_path / "a", tmp_path / "b", rtol=1e-6)
    assert tolerant.first_divergence is None and not tolerant.identical and tolerant.exit_code == 1
    assert "FAILED: steps are missing from one run" in tolerant.text()
    tolerant = compare_runs(tmp_path / "a", tmp_path / "b", rtol=1e-6, common_steps_only=True)
    assert tolerant.identical and tolerant.checksums_compared == 2 and tolerant.last_step == 4
    assert tolerant.exit_code == 0 and "identical in the steps both runs have, through step 4" in tolerant.text()
    tight = compare_runs(tmp_path / "a", tmp_path / "b", atol=1e-12)
    assert tight.first_divergence.quantity == "param_sum"
    # A config difference fails unless allowed; a data difference is reported.
    _write_run(tmp_path / "c", [(1, 2.0), (2, 1.5)], [(2, "x", 1.0)], config_hash="other", data="other-data")
    report = compare_runs(tmp_path / "a", tmp_path / "c")
    assert report.first_divergence is None and report.exit_code == 1
    assert "config hash: DIFFERS: run A c, run B other" in report.text()
    assert "data fingerprint: DIFFERS" in report.text()
    assert compare_runs(tmp_path / "a", tmp_path / "c", allow_config_diff=True, common_steps_only=True).exit_code == 0
    # Bitwise: one ulp is a divergence.
    _write_run(tmp_path / "d", [(1, 2.0), (2, np.nextafter(1.5, 2.0))], [])
    d = compare_runs(tmp_path / "a", tmp_path / "d").first_divergence
    assert (d.step, d.quantity) == (2, "loss") and "0x1.8000000000001p+0" in d.describe()


def test_config_hash_is_canonical():
    class Opaque:
        pass

    a = {"b": 1, "a": {"y": [1, 2.5], "x": None}, "f": Opaque()}
    b = {"a": {"x": None, "y": (1, 2.5)}, "f": Opaque(), "b": 1}
    assert fp.config_hash(a) == fp.config_hash(b)
    assert len(fp.config_hash(a)) == 64 and " at 0x" not in fp.canonical_json(a)
    assert fp.config_hash({"b": 2}) != fp.config_hash({"b": 2.0}) != fp.config_hash({"b": "2"})


def test_checksum_does_not_depend_on_the_sharding():
    mesh = create_mesh({"data": 4, "model": 2})
    P, S = jax.sharding.PartitionSpec, jax.sharding.NamedSharding
    x = np.arange(64 * 16, dtype=np.float32).reshape(64, 16) / 7
    params = {"w": x, "b": {"v": np.ones(16, np.float32)}}
    one = fp.params_checksum(3, params)
    sharded = {
        "w": jax.device_put(x, S(mesh, P("data", "model"))),
        "b": {"v": jax.device_put(params["b"]["v"], S(mesh, P("model")))},
    }
    two = fp.params_checksum(3, sharded)
    assert one == two and one.param_sum == pytest.approx(float(x.astype(np.float64).sum()) + 16)
    x2 = x.copy()
    x2[5, 5] = np.nextafter(x2[5, 5], np.float32(1e9))
    assert fp.params_checksum(3, {"w": x2, "b": params["b"]}).param_sha256 != one.param_sha256


def test_step_hook_only_every_n_and_trims_a_truncated_line(tmp_path):
    class State:
        params = {"w": np.ones(3, np.float32)}

    run_fp = fp.RunFingerprint(str(tmp_path), checksum_every=3)
    (tmp_path / "fingerprint").mkdir()
    (tmp_path / "fingerprint" / "checksums.jsonl").write_text('{"step": 3, "param_sha256": "old"}\n{"step": 6, "pa')
    for step in range(1, 8):
        run_fp.step_hook(step, State())
    lines = (tmp_path / "fingerprint" / "checksums.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [3, 3, 6]
    with pytest.raises(ValueError, match="checksum_every"):
        fp.RunFingerprint(str(tmp_path), checksum_every=-1)
