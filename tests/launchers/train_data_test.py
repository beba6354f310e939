"""The train entry point's data path for both default experiments (shakespeare_t5_tiny: span
corruption, EncDec packed; shakespeare_lm_tiny: a random crop, LM), once their caches exist: a
fresh process that opens the reader as `train` does (`run_setup.prepare`, then
`data.make_train_data`) and reads batches never imports TensorFlow; its batches are those of the
TensorFlow record stage; and the batch signature the trainer is set up from
(`data.batch_signature`, from the reader's spec) is the real batches', computed without reading
one."""

import json
import subprocess
import sys

import launch_util
import numpy as np
import pytest

CONFIGS = {"t5": launch_util.T5_CONFIG, "lm": launch_util.LM_CONFIG}
STEPS = 3

# argv: JSON {name: [config, cache_dir, model_dir]}, the steps to read. Prints JSON {name: {signature, batches,
# digests}, "computed_before_first_read", "tensorflow"}.
CHILD = """
import hashlib, json, sys
from cairn.launchers import config_io, run_setup, run_spec
from cairn.launchers import data as data_lib

def shapes(batch):
    return {k: [list(v.shape), str(v.dtype)] for k, v in sorted(batch.items())}

def digests(batch):
    return {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in sorted(batch.items())}

out, computed = {}, 0
for name, (path, cache_dir, model_dir) in json.loads(sys.argv[1]).items():
    config = config_io.resolve_paths(config_io.load_config_file(path))
    config.data.cache_dir, config.model_dir = cache_dir, model_dir
    spec = run_spec.load(config)
    ready = run_setup.prepare(spec)
    reader = data_lib.make_train_data(spec.reader, ready.partitioner, ready.tasks)
    signature = data_lib.batch_signature(reader)
    computed += len(reader._ahead) + (reader._last is not None)  # passes computed: none yet
    batches = [next(reader) for _ in range(int(sys.argv[2]))]
    reader.close()
    out[name] = {"signature": shapes(signature), "batches": [shapes(b) for b in batches],
                 "digests": [digests(b) for b in batches]}
out["computed_before_first_read"] = computed
out["tensorflow"] = "tensorflow" in sys.modules
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    """Both experiments' tasks cached (in this process, with TensorFlow) on two short plays."""
    from cairn.launchers import cache_main, config_io

    tmp = tmp_path_factory.mktemp("train_data")
    texts = launch_util.small_texts(tmp)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CAIRN_SHAKESPEARE_DIR", texts)
        specs = {}
        for name, path in CONFIGS.items():
            config = config_io.resolve_paths(config_io.load_config_file(path))
            config.data.cache_dir = str(tmp / "cache")
            config.model_dir = str(tmp / f"run_{name}")
            specs[name] = launch_util.spec(config)
            cache_main.cache(specs[name])
        yield texts, tmp, specs


def test_default_experiments_read_without_tensorflow(cached):
    import hashlib

    from cairn.launchers import data as data_lib

    texts, tmp, specs = cached
    runs = {name: [path, str(tmp / "cache"), str(tmp / f"run_{name}")] for name, path in CONFIGS.items()}
    env = launch_util.child_env({"CAIRN_SHAKESPEARE_DIR": texts})
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(runs), str(STEPS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, launch_util.tail(proc)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["tensorflow"] is False
    assert got["computed_before_first_read"] == 0
    for name, spec in specs.items():
        run = got[name]
        # The signature from the spec is every batch's (shapes and dtypes of the same features).
        assert run["batches"] == [run["signature"]] * STEPS, name
        # The same batches through TensorFlow's record stage (this process imported it).
        tasks = data_lib.get_tasks(spec.keys, "data.task")
        reader = data_lib.make_train_data(spec.reader, _Partitioner(), tasks)
        stage_kinds = [s.numpy_stage is not None for s in reader.streams]
        for s in reader.streams:
            s.numpy_stage = None
        try:
            tf_batches = reader.batches_at(0, STEPS)
        finally:
            reader.close()
        assert stage_kinds == [True] * len(stage_kinds), name
        assert reader.streams[0].tf_stage.per_record, name  # seeded: each record by its own key
        for i, batch in enumerate(tf_batches):
            digests = {k: hashlib.sha256(np.asarray(v).tobytes()).hexdigest() for k, v in sorted(batch.items())}
            assert run["digests"][i] == digests, f"{name} step {i}"


class _Layout:
    shard_id, num_shards = 0, 1


class _Partitioner:
    """One host's rows (what the child's single process reads)."""

    @staticmethod
    def data_layout():
        return _Layout()
