"""benchmarks/accel_bench.py's pure parts (benchmarks/_accel_plan.py): MFU and decode-roofline
arithmetic, the search for the largest batch that fits (against a fake memory function), the
choice among variants, the overrides a config accepts, the table and the JSON; and that the
supervising process imports no JAX. The device runs themselves are measured by hand
(benchmarks/README.md, `accel_bench.py`); `--tiny` is their CPU smoke run."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

# Under Bazel this file is a runfiles link to the checkout: its real path finds the repository.
ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
sys.path.insert(0, BENCH)

import _accel_plan as plan  # noqa: E402

GIB = 2**30


def test_mfu_and_roofline_arithmetic():
    # llama_1b-like: 134 TFLOP a step in 1.24 s on 197 TFLOP/s is 54.9 %.
    assert plan.mfu(134e12, 1.24, 197e12) == pytest.approx(134 / 1.24 / 197)
    # Weights 2.4 GB; 32 KB of cache per row and position; batch 32; prefill wrote 129
    # positions; steps 1..127 read 129 + i positions: 129 + 64 on average.
    per_step = plan.decode_bytes_per_step(2.4e9, 32768, 32, 129, 127)
    assert per_step == pytest.approx(2.4e9 + 32768 * 32 * (129 + 64))
    assert plan.decode_bytes_per_step(1e9, 10, 1, 5, 1) == 1e9 + 10 * 6  # one step: 5 + 1 positions
    assert plan.roofline_fraction(per_step, 819e9, per_step / 819e9 / 0.8) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="positive step time"):
        plan.mfu(1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="steps >= 1"):
        plan.decode_bytes_per_step(1.0, 1.0, 1, 1, 0)


def test_published_hbm_bandwidth_matches_device_kinds():
    assert plan.published_hbm_bandwidth("TPU v5 lite") == 819e9
    assert plan.published_hbm_bandwidth("NVIDIA H100 80GB HBM3") == 3350e9
    assert plan.published_hbm_bandwidth("cpu") is None


class FakeMemory:
    """Bytes of a step at batch b: fixed + per_row * b; XLA refuses (None) above `refuse_above`
    bytes, as the TPU compiler does; records every batch compiled and the rounds."""

    def __init__(self, fixed, per_row, refuse_above=None, wobble=0):
        self.fixed, self.per_row, self.refuse_above, self.wobble = fixed, per_row, refuse_above, wobble
        self.compiled, self.rounds = [], 0

    def __call__(self, batches):
        self.rounds += 1
        out = {}
        for b in batches:
            assert b not in self.compiled, f"batch {b} compiled twice"
            self.compiled.append(b)
            size = self.fixed + self.per_row * b + (0 if b % 2 else self.wobble)
            out[b] = None if self.refuse_above is not None and size > self.refuse_above else size
        return out


@pytest.mark.parametrize(
    "fixed, per_row, probes, expected",
    [
        (5.5 * GIB, 1.2 * GIB, (4, 8, 12), 8),  # llama-like: state 5.5 GiB, 1.2 GiB a row
        (5.5 * GIB, 0.13 * GIB, (4, 8, 12), 75),  # full remat: far above the probes
        (1 * GIB, 0.3 * GIB, (8, 16, 32), 47),  # T5-like
        (14 * GIB, 2 * GIB, (4, 8), 0),  # nothing fits, not even batch 1
    ],
)
def test_search_finds_the_largest_fitting_batch(fixed, per_row, probes, expected):
    limit = 15.25 * GIB
    fake = FakeMemory(fixed, per_row)
    best, known = plan.search_batch(fake, limit, probes, unit=1, max_batch=512)
    truth = max((b for b in range(1, 513) if fixed + per_row * b <= limit), default=0)
    assert truth == expected
    assert best == expected
    assert fake.rounds <= 4
    assert len(fake.compiled) <= len(probes) + 9  # a few candidates a round, never a scan


def test_search_with_compile_time_refusals_and_nonlinear_memory():
    limit = 15.25 * GIB
    # XLA refuses every program over the limit without saying its size: only None comes back.
    fake = FakeMemory(5.5 * GIB, 1.2 * GIB, refuse_above=limit)
    best, known = plan.search_batch(fake, limit, (4, 8, 12), unit=1, max_batch=64)
    assert best == 8 and known[9] is None and known[8] is not None
    # Even batches cost 0.5 GiB more: 8 (15.6 GiB) does not fit, 7 (13.9 GiB) does, 9 not.
    fake = FakeMemory(5.5 * GIB, 1.2 * GIB, wobble=0.5 * GIB)
    best, _ = plan.search_batch(fake, limit, (4, 8, 12), unit=1, max_batch=64)
    assert best == 7
    # Multiples of the device count only; max_batch caps the answer.
    fake = FakeMemory(1 * GIB, 0.01 * GIB)
    best, known = plan.search_batch(fake, limit, (8, 16), unit=8, max_batch=64)
    assert best == 64 and all(b % 8 == 0 and b <= 64 for b in known)
    with pytest.raises(ValueError, match="unit"):
        plan.search_batch(fake, limit, (8,), unit=0)


def test_next_candidates_stop_when_the_boundary_is_known():
    assert plan.next_candidates({7: 10, 8: 20}, 15, 1, 64) == []
    assert plan.next_candidates({64: 10}, 15, 1, 64) == []  # max_batch fits
    assert plan.next_candidates({4: None, 8: None}, 15, 1, 64) == [1, 2, 3]  # bisect below the first refusal


def test_choose_variant_prefers_the_first_reaching_the_minimum():
    assert plan.choose_variant([6, 20], min_batch=8) == 1  # dots reaches 6, full 20: full
    assert plan.choose_variant([9, 20], min_batch=8) == 0  # dots reaches 8: dots
    assert plan.choose_variant([3, 5], min_batch=8) == 1  # neither: the larger
    assert plan.choose_variant([0, 0], min_batch=8) is None


def test_split_overrides_keeps_the_fields_a_config_has():
    @dataclasses.dataclass(frozen=True)
    class OldConfig:
        dtype: str = "float32"
        remat_policy: str = "none"

    names = [f.name for f in dataclasses.fields(OldConfig)]
    applied, ignored = plan.split_overrides(names, {"dtype": "bfloat16", "loss_chunk_size": 2048})
    assert applied == {"dtype": "bfloat16"} and ignored == {"loss_chunk_size": 2048}


def test_oom_messages_give_the_bytes():
    message = (
        "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
        "Used 17.53G of 15.48G hbm. Exceeded hbm capacity by 2.05G."
    )
    assert plan.bytes_from_oom_message(message) == int(17.53 * GIB)
    assert plan.bytes_from_oom_message("Used 900.5M of 15.48G hbm") == int(900.5 * 2**20)
    assert plan.bytes_from_oom_message("some other failure") is None


def test_rows_select_and_tiny():
    names = [r.name for r in plan.ROWS]
    # the rows, the optional ones (float32 llama, T5-XL) last: a run cut short keeps the rest
    assert names == ["llama_bf16", "t5_large", "decode_b1", "decode_b32", "llama_f32", "t5_xl"]
    assert [r.name for r in plan.select_rows("decode_b32,llama_bf16", plan.ROWS)] == ["llama_bf16", "decode_b32"]
    with pytest.raises(ValueError, match="unknown rows"):
        plan.select_rows("llama_bf16,nope", plan.ROWS)
    tiny = plan.tiny_rows()
    assert [r.name for r in tiny] == names
    assert {r.preset for r in tiny} == {"llama_tiny", "t5_1_1_tiny"}
    assert all(r.batch > 0 for r in tiny)
    llama = plan.ROWS[0]
    assert llama.min_batch == 8 and llama.target_mfu == 0.55 and llama.lengths == {"targets": 2048}
    assert plan.ROWS[1].lengths == {"inputs": 512, "targets": 114}
    f32 = plan.ROWS[names.index("llama_f32")]  # what makes it fit a v5e (planned on a described chip)
    assert f32.overrides["loss_chunk_size"] == 1024
    assert f32.trainer_overrides["compiler_options"] == {"xla_tpu_scheduler_percent_shared_memory_limit": 50}


def test_table_and_json(tmp_path):
    results = [
        {
            "row": "llama_bf16",
            "kind": "train",
            "status": "ok",
            "batch": 8,
            "compile_s": 41.0,
            "step_s": 1.2,
            "tokens_per_s": 13653.0,
            "mfu": 0.567,
            "target": 0.55,
            "note": "remat_policy=full",
        },
        {
            "row": "decode_b1",
            "kind": "decode",
            "status": "ok",
            "batch": 1,
            "step_s": 0.0034,
            "tokens_per_s": 294.0,
            "roofline_fraction": 0.88,
            "target": 0.9,
        },
        {"row": "t5_xl", "kind": "train", "status": "error", "error": "DoesNotFit: no | variant", "target": None},
        {  # --topology: compiled for a described chip, nothing timed
            "row": "llama_f32",
            "kind": "train",
            "status": "planned",
            "batch": 128,
            "compile_s": 118.0,
            "program_bytes": int(12.67 * 2**30),
            "target": 0.45,
            "note": "remat_policy=full",
        },
        {"row": "decode_b32", "kind": "decode", "status": "skipped", "target": 0.8, "note": "compiles only"},
    ]
    table = plan.format_table(results).splitlines()
    assert table[0].startswith("| row | status | batch")
    assert (
        table[2]
        == "| llama_bf16 | ok | 8 | 41.0 | 1200.00 | 13,653 | MFU 56.7 % | >= 55 % | holds | remat_policy=full |"
    )
    assert "| roofline 88.0 % | >= 90 % | MISSED |" in table[3]
    assert table[4].endswith("| ERROR | DoesNotFit: no / variant |")
    assert (
        table[5]
        == "| llama_f32 | planned | 128 | 118.0 | - | - | peak 12.67 GiB | >= 45 % | fits | remat_policy=full |"
    )
    assert table[6] == "| decode_b32 | skipped | - | - | - | - | - | >= 80 % | - | compiles only |"
    path = tmp_path / "out.json"
    plan.write_json(str(path), {"device_kind": "TPU v5 lite"}, {"rows": "all"}, results)
    data = json.loads(path.read_text())
    assert data["env"]["device_kind"] == "TPU v5 lite" and [r["row"] for r in data["rows"]] == [
        "llama_bf16",
        "decode_b1",
        "t5_xl",
        "llama_f32",
        "decode_b32",
    ]


def test_the_supervisor_imports_no_jax():
    code = (
        "import sys; sys.argv = ['accel_bench.py', '--rows', 'llama_bf16,decode_b1', '--tiny']; "
        "import accel_bench; args = accel_bench.parse_args(sys.argv[1:]); "
        "print([r.name for r in args.selected], 'jax' in sys.modules, 'tensorflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=BENCH, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["['llama_bf16',", "'decode_b1']", "False", "False"]
    bad = subprocess.run(
        [sys.executable, os.path.join(BENCH, "accel_bench.py"), "--rows", "nope"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unknown rows" in bad.stderr


def test_remat_and_decode_variant_options():
    import accel_bench

    names = [r.name for r in plan.ROWS]
    assert accel_bench.parse_remat("full", names) == {"*": ("full",)}
    assert accel_bench.parse_remat("t5_xl=full, llama_bf16=dots", names) == {
        "t5_xl": ("full",),
        "llama_bf16": ("dots",),
    }
    assert accel_bench.parse_remat("llama_bf16=attention_kernel|full", names) == {
        "llama_bf16": ("attention_kernel", "full")
    }
    for bad in ("nope", "t5_xl=nope", "nope=full", "llama_bf16=full|nope"):
        with pytest.raises(ValueError, match="--remat"):
            accel_bench.parse_remat(bad, names)
    assert accel_bench.parse_decode_variants("slice,row_major") == ["slice", "row_major"]
    assert plan.DECODE_VARIANTS[0] == "model" and set(plan.DECODE_VARIANTS) >= {"slice", "select"}
    for bad in ("", "slice,nope"):
        with pytest.raises(ValueError, match="--decode_variants"):
            accel_bench.parse_decode_variants(bad)
