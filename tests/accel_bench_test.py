"""benchmarks/accel_bench.py's pure parts (benchmarks/_accel_plan.py): MFU and decode-roofline
arithmetic, the search for the largest batch that fits (against a fake memory function), the
choice among variants, the overrides a config accepts, the table and the JSON; the GPU suite
(issue 58: its rows and targets, the suite's choice, the fp8 speedup and loss-gap verdicts, the
tiny presets, the attention check's cases and tolerance); and that the supervising process
imports no JAX. The device runs themselves are measured by hand
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
    for suite, rows in (("tpu", "llama_bf16,decode_b1"), ("gpu", "llama7b_bf16,fp8_loss")):
        code = (
            f"import sys; sys.argv = ['accel_bench.py', '--rows', '{rows}', '--tiny', '--suite', 'auto']; "
            "import accel_bench; accel_bench.runs_on_gpu = lambda: " + str(suite == "gpu") + "; "
            "args = accel_bench.parse_args(sys.argv[1:]); "
            "print([r.name for r in args.selected], 'jax' in sys.modules, 'tensorflow' in sys.modules)"
        )
        out = subprocess.run([sys.executable, "-c", code], cwd=BENCH, capture_output=True, text=True, check=True)
        first, second = rows.split(",")
        assert out.stdout.split() == [f"['{first}',", f"'{second}']", "False", "False"]
    # the real look-up (a CUDA plugin installed?) imports no JAX either
    code = "import accel_bench, sys; accel_bench.runs_on_gpu(); print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=BENCH, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]
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


# -- the GPU suite (issue 58) -------------------------------------------------------------------


def test_gpu_rows_and_targets():
    rows = {r.name: r for r in plan.GPU_ROWS}
    assert list(rows) == [
        "llama7b_bf16",
        "llama7b_fp8",
        "llama1b_bf16",
        "t5_xl_gpu",
        "decode7b_b1",
        "decode7b_b32",
        "fp8_loss",
    ]
    bf16, fp8 = rows["llama7b_bf16"], rows["llama7b_fp8"]
    assert (bf16.preset, bf16.lengths, bf16.optimizer, bf16.target_mfu) == (
        "llama_7b",
        {"targets": 4096},
        "adafactor",
        0.55,
    )
    assert bf16.overrides["param_dtype"] == "bfloat16" and bf16.overrides["loss_chunk_size"] > 0
    assert [v["remat_policy"] for v in bf16.variants] == ["attention_kernel", "full"]
    assert bf16.batch == 0  # the largest batch that fits: searched
    assert fp8.overrides == {**bf16.overrides, "matmul_precision": "fp8"}
    assert (fp8.batch_from, fp8.speedup_over, fp8.target_speedup) == ("llama7b_bf16", "llama7b_bf16", 1.4)
    assert (rows["llama1b_bf16"].preset, rows["llama1b_bf16"].lengths["targets"]) == ("llama_1b", 2048)
    assert rows["llama1b_bf16"].target_mfu == 0.55
    t5 = rows["t5_xl_gpu"]
    assert (t5.preset, t5.lengths, t5.target_mfu) == ("t5_1_1_xl", {"inputs": 512, "targets": 114}, 0.50)
    b1, b32 = rows["decode7b_b1"], rows["decode7b_b32"]
    assert (b1.preset, b1.batch, b1.prompt, b1.new, b1.target_roofline) == ("llama_7b", 1, 128, 128, 0.85)
    assert (b32.batch, b32.target_roofline) == (32, 0.75)
    loss = rows["fp8_loss"]
    assert (loss.kind, loss.preset, loss.steps, loss.last, loss.target_gap) == ("loss", "llama_7b", 200, 10, 0.01)
    assert loss.batch * loss.lengths["targets"] == 4096  # one sequence of 4096 a step (the budget)
    reference, compared = loss.legs()
    assert reference.overrides == bf16.overrides and compared.overrides == fp8.overrides
    assert reference.batch == compared.batch == loss.batch and reference.steps == 200 and reference.period > 0
    # the same TPU v5e-calibrated helpers: the HBM figure of the H200
    assert plan.published_hbm_bandwidth("NVIDIA H200") == 4800e9


def test_suite_selection(monkeypatch):
    assert plan.resolve_suite("auto", on_gpu=True) == "gpu"
    assert plan.resolve_suite("auto", on_gpu=False) == "tpu"
    assert plan.resolve_suite("auto", on_gpu=True, topology="v5e:1x1") == "tpu"  # compiling for a TPU
    assert plan.resolve_suite("gpu", on_gpu=False) == "gpu"
    with pytest.raises(ValueError, match="--suite"):
        plan.resolve_suite("cuda", on_gpu=True)
    import accel_bench

    monkeypatch.setattr(accel_bench, "runs_on_gpu", lambda: True)
    args = accel_bench.parse_args(["--tiny"])
    assert args.suite_name == "gpu" and [r.name for r in args.selected] == [r.name for r in plan.GPU_ROWS]
    assert args.attention_check
    args = accel_bench.parse_args(["--suite", "tpu", "--rows", "llama_bf16"])
    assert args.suite_name == "tpu" and not args.attention_check
    args = accel_bench.parse_args(["--suite", "gpu", "--no_attention_check", "--batches", "llama7b_fp8=8"])
    assert not args.attention_check and args.batch_of == {"llama7b_fp8": 8}
    with pytest.raises(SystemExit):  # a TPU row is not in the gpu suite
        accel_bench.parse_args(["--suite", "gpu", "--rows", "llama_bf16"])
    monkeypatch.setattr(accel_bench, "runs_on_gpu", lambda: False)
    assert accel_bench.parse_args([]).suite_name == "tpu"
    # auto chose gpu before JAX started, but JAX found no GPU: the rows do not run
    args = accel_bench.parse_args(["--suite", "gpu"])
    args.suite = "auto"
    assert "pass --suite" in accel_bench.suite_mismatch(args, "cpu")
    assert accel_bench.suite_mismatch(args, "gpu") is None


def test_fp8_speedup_verdict():
    assert plan.speedup(2.0, 3.0) == pytest.approx(1.5)
    assert plan.speedup(None, 3.0) is None
    with pytest.raises(ValueError, match="positive"):
        plan.speedup(0.0, 1.0)
    bf16 = {"row": "llama7b_bf16", "kind": "train", "status": "ok", "batch": 8, "step_s": 3.0, "mfu": 0.5}
    fp8 = {"row": "llama7b_fp8", "kind": "train", "status": "ok", "batch": 8, "step_s": 2.0, "mfu": 0.5}
    fp8.update(speedup_over="llama7b_bf16", target_speedup=1.4, target=None)
    scored = plan.with_speedup(fp8, {"llama7b_bf16": bf16})
    assert scored["speedup"] == pytest.approx(1.5)
    assert plan.format_table([scored]).splitlines()[-1].endswith("| speedup 1.50x | >= 1.40x | holds |  |")
    slow = plan.with_speedup({**fp8, "step_s": 2.5}, {"llama7b_bf16": bf16})
    assert "| speedup 1.20x | >= 1.40x | MISSED |" in plan.format_table([slow])
    # no bf16 row in this run (or it failed): no ratio, and the note says why
    alone = plan.with_speedup(fp8, {"llama7b_bf16": {**bf16, "status": "error"}})
    assert alone["speedup"] is None and "no llama7b_bf16 step" in alone["note"]
    assert "| speedup -x | >= 1.40x | MISSED |" in plan.format_table([alone])
    other_batch = plan.with_speedup({**fp8, "batch": 4}, {"llama7b_bf16": bf16})
    assert "batch 4 vs llama7b_bf16's 8" in other_batch["note"]
    assert plan.with_speedup(bf16, {}) == bf16  # a row compared with none is unchanged
    # the fp8 row takes the batch the bf16 row found, when it ran
    assert plan.inherited_batches(plan.GPU_ROWS, {"llama7b_bf16": bf16}) == {"llama7b_fp8": 8}
    assert plan.inherited_batches(plan.GPU_ROWS, {"llama7b_bf16": {**bf16, "status": "error"}}) == {}


def test_loss_gap_and_its_verdict():
    assert plan.tail_mean([9.0, 1.0, 2.0, 3.0], 3) == pytest.approx(2.0)
    assert plan.tail_mean([4.0], 10) == 4.0
    assert plan.relative_gap(2.02, 2.0) == pytest.approx(0.01)
    assert plan.relative_gap(1.98, 2.0) == pytest.approx(0.01)
    with pytest.raises(ValueError):
        plan.tail_mean([], 10)
    result = {"row": "fp8_loss", "kind": "loss", "status": "ok", "batch": 1, "relative_gap": 0.004, "target": 0.01}
    assert "| gap 0.40 % | <= 1.0 % | holds |" in plan.format_table([result])
    assert "| gap 1.50 % | <= 1.0 % | MISSED |" in plan.format_table([{**result, "relative_gap": 0.015}])
    assert plan.verdict(0.02, 0.01, lower_is_better=True) == "MISSED"


def test_tiny_gpu_rows():
    tiny = {r.name: r for r in plan.tiny_rows(plan.GPU_ROWS)}
    assert list(tiny) == [r.name for r in plan.GPU_ROWS]
    assert {r.preset for r in tiny.values()} == {"llama_tiny", "t5_1_1_tiny"}
    assert plan.TINY_PRESETS["llama_7b"] == "llama_tiny"
    assert all(r.batch > 0 for r in tiny.values())
    assert tiny["fp8_loss"].steps == 20 and tiny["fp8_loss"].steps >= tiny["fp8_loss"].last
    assert tiny["llama7b_fp8"].overrides["matmul_precision"] == "fp8"
    assert tiny["decode7b_b32"].batch == 4 and tiny["decode7b_b32"].target_roofline == 0.75


def test_attention_cases_and_errors():
    cases = plan.attention_cases(plan.GPU_ROWS)
    assert [c.name for c in cases] == [
        "llama_7b causal 4096",
        "llama_1b causal 2048",
        "t5_1_1_xl encoder 512",
        "t5_1_1_xl decoder 114",
        "t5_1_1_xl cross 114x512",
    ]
    assert all(c.batch == plan.ATTENTION_CHECK_BATCH for c in cases)
    encoder, decoder, cross = cases[2:]
    assert (encoder.bias, encoder.padding, encoder.causal) == (True, True, False)
    assert (decoder.bias, decoder.causal) == (True, True) and (cross.bias, cross.kv_len) == (False, 512)
    judged = plan.judge_errors({"out": (0.01, 1.0), "dq": (0.04, 1.0), "dk": (0.1, 1.0), "dv": (float("nan"), 1.0)})
    assert [judged[k]["ok"] for k in ("out", "dq", "dk", "dv")] == [True, True, False, False]
    assert judged["out"]["tolerance"] == 0.02 and judged["dq"]["rel"] == pytest.approx(0.04)
    assert plan.judge_errors({"dbias": (0.0, 0.0)})["dbias"]["ok"]
    check = {
        "comparison": "cudnn vs xla",
        "ok": False,
        "cases": [
            {"case": "llama_7b causal 4096", "q_len": 4096, "kv_len": 4096, "errors": judged, "ok": False},
            {"case": "t5 cross", "q_len": 114, "kv_len": 512, "ok": False, "error": "ValueError: no | cuDNN"},
        ],
    }
    text = plan.format_attention_check(check).splitlines()
    assert text[0] == "attention check: cudnn vs xla" and text[-1] == "attention check FAILED"
    assert "| 1.00e-02 (1.00 %) |" in text[3] and text[3].endswith("| - | FAIL |")
    assert text[4].endswith("| FAIL: ValueError: no / cuDNN |")
