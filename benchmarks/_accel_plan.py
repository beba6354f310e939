"""The pure parts of `accel_bench.py` (standard library only, tested on CPU by
tests/accel_bench_test.py): the rows and their targets, the MFU and decode-roofline
arithmetic, the search for the largest batch that fits, the choice among a row's variants,
which config overrides a dataclass accepts, and the table and JSON of the results.

Nothing here imports JAX: the supervising process of `accel_bench.py` uses this module alone,
so only its worker process opens the accelerator.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import pathlib
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

#: Published HBM bandwidth per chip, GB/s (1e9 bytes/s), matched against `device.device_kind`
#: as cairn.trainer.mfu matches its peaks (first match wins: "TPU v5 lite" before "TPU v5").
HBM_GBPS = (
    ("TPU v5p", 2765.0),
    ("TPU v5 lite", 819.0),
    ("TPU v5e", 819.0),
    ("TPU v6 lite", 1640.0),
    ("TPU v6e", 1640.0),
    ("TPU v4", 1228.0),
    ("H200", 4800.0),
    ("H100", 3350.0),
    ("A100", 2039.0),
)


def published_hbm_bandwidth(device_kind: str) -> float | None:
    """Bytes/s of one chip of this kind (`HBM_GBPS`), or None if the kind is not listed."""
    for name, gbps in HBM_GBPS:
        if name.lower() in device_kind.lower():
            return gbps * 1e9
    return None


# -- the rows ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TrainRow:
    """A training row: `preset` trained through `cairn.trainer.Trainer` on seeded synthetic
    tokens of `lengths` (`{"targets": L}`, or `{"inputs": Li, "targets": Lt}` for T5).

    `overrides` apply to the model config (only the fields it has: `split_overrides`);
    `variants` are alternatives tried in order on top of them (e.g. remat policies), the first
    whose largest fitting batch reaches `min_batch` winning (`choose_variant`).
    `trainer_overrides` apply to `TrainerConfig` the same way. `batch` > 0 fixes the batch
    (no search); otherwise the search starts from `probes` and stops at `max_batch`.
    `batch_from`: a row whose batch this one takes when that row ran in the same invocation
    (`inherited_batches`; else its own search). `speedup_over` with `target_speedup`: the
    row's score is how many times faster its step is than that row's (`with_speedup`), not MFU.
    `period` > 0: each sequence repeats a random motif of that many tokens (a copy task a model
    learns, `LossRow`); 0: uniform random tokens.
    """

    name: str
    title: str
    preset: str
    lengths: Mapping[str, int]
    optimizer: str = "adafactor"
    learning_rate: float = 1e-3
    optimizer_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    variants: tuple[Mapping[str, Any], ...] = ({},)
    trainer_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    batch: int = 0
    probes: tuple[int, ...] = (4, 8)
    min_batch: int = 1
    max_batch: int = 256
    steps: int = 6
    target_mfu: float | None = None
    target_note: str = ""
    batch_from: str = ""
    speedup_over: str = ""
    target_speedup: float | None = None
    period: int = 0

    kind = "train"


@dataclasses.dataclass(frozen=True)
class DecodeRow:
    """A decoding row: greedy `predict_batch` of `batch` prompts of `prompt` random tokens,
    `new` generated tokens (no EOS), with the key-value cache; the decode steps are timed
    apart from the prefill. `target_roofline`: the fraction of the HBM roofline to reach."""

    name: str
    title: str
    preset: str
    batch: int
    prompt: int = 128
    new: int = 128
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    target_roofline: float | None = None
    repeats: int = 5

    kind = "decode"


@dataclasses.dataclass(frozen=True)
class LossRow:
    """A loss comparison: `preset` (with `overrides`) trained twice from the same initialisation
    (the trainer's seed) on the same seeded batches of `batch` x `lengths` for `steps` steps,
    once as it is and once with `compare` on top; each run's loss is the mean of its last
    `last` steps, and the score is the relative gap (`relative_gap`), to stay <= `target_gap`.
    The batches repeat a random motif of `period` tokens (a copy task the model learns, so the
    loss falls and the comparison is not of two flat curves at log(vocab))."""

    name: str
    title: str
    preset: str
    lengths: Mapping[str, int]
    batch: int
    steps: int = 200
    last: int = 10
    period: int = 128
    optimizer: str = "adafactor"
    learning_rate: float = 1e-3
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    compare: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    variants: tuple[Mapping[str, Any], ...] = ({},)
    target_gap: float | None = None

    kind = "loss"

    def legs(self) -> tuple[TrainRow, TrainRow]:
        """The two training runs: `(reference, compared)`, fixed batch, this row's steps."""
        base = TrainRow(
            f"{self.name}:reference",
            self.title,
            self.preset,
            self.lengths,
            optimizer=self.optimizer,
            learning_rate=self.learning_rate,
            overrides=self.overrides,
            variants=self.variants,
            batch=self.batch,
            steps=self.steps,
            period=self.period,
        )
        return base, dataclasses.replace(
            base, name=f"{self.name}:compared", overrides={**self.overrides, **self.compare}
        )


Row = TrainRow | DecodeRow | LossRow

_LLAMA = {"dtype": "bfloat16", "scan_layers": True, "loss_chunk_size": 4096}  # chunked loss: 128k vocabulary
# T5: t5x's default attention numerics (`float32_attention_logits=False`: bf16 logits and softmax)
_T5 = {"dtype": "bfloat16", "scan_layers": True, "float32_attention_logits": False}
# remat policies tried, in order of preference (the first reaching the row's minimum batch runs)
_REMATS = ({"remat_policy": "dots"}, {"remat_policy": "dots_except_mlp_wi"}, {"remat_policy": "full"})
_DECODE = {"dtype": "bfloat16", "param_dtype": "bfloat16", "scan_layers": False}
# llama_1b on one v5e (2026-12-07): the splash kernel's residuals kept fits batch 8 (55.7 % MFU);
# `full` fits 12 (54.4 %)
_LLAMA_REMATS = ({"remat_policy": "attention_kernel"}, {"remat_policy": "full"})
# T5.1.1-large (v5e, 2026-12-08): bf16 params with the MLP's input products kept (`mlp_wi`) at
# batch 32 (12.4 GiB, 48.2 %) beats float32 params under `full` (43.5 % at 32-48; `mlp_wi` with
# float32 params needs 17.4 GiB) and bf16 `dots_except_mlp_wi` (14.6 GiB, 43.9 %)
_T5_REMATS = ({"param_dtype": "bfloat16", "remat_policy": "mlp_wi"}, {"remat_policy": "full"})


def _remat_policies() -> tuple[str, ...]:
    """`cairn.models`' `REMAT_POLICIES`, read from its source (this module imports no JAX)."""
    path = pathlib.Path(__file__).resolve().parents[1] / "models/cairn/models/transformer_config.py"
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "REMAT_POLICIES" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise RuntimeError(f"no REMAT_POLICIES in {path}")


#: `--remat` policies (`cairn.models` remat_policy values).
REMAT_POLICIES = _remat_policies()
#: Ways a decode step can keep its key-value cache (`_accel_rows.DECODE_SETTINGS`): the model's
#: own ("model": on TPU the flat one, attended up to its written prefix), a flat cache
#: `[b, len, kv_heads * head_dim]` on every platform, attended whole ("flat"; on TPU row-major)
#: or only up to its written prefix ("flat_written"), the four-dimensional cache ("model_4d": on
#: TPU pinned head-major, its 64-wide heads padded to 128 lanes), and on the
#: four-dimensional cache: `dynamic_update_slice` alone ("slice"), a select over the whole cache
#: ("select"), and the slice with the cache's layout pinned for XLA: row-major ("row_major": b,
#: position, head, dim), head-major ("head_major": b, head, position, dim) or position-major
#: ("position_major": position, b, head, dim).
DECODE_VARIANTS = (
    "model",
    "flat",
    "model_4d",
    "flat_written",
    "slice",
    "select",
    "row_major",
    "head_major",
    "position_major",
)

#: The rows of issue 39 on one TPU v5e chip, in the order they run.
ROWS: tuple[Row, ...] = (
    TrainRow(
        "llama_bf16",
        "llama_1b, bf16 params, Adafactor, 2048 tokens, largest batch",
        "llama_1b",
        {"targets": 2048},
        overrides={**_LLAMA, "param_dtype": "bfloat16"},
        variants=_LLAMA_REMATS,
        probes=(4, 8, 12),
        min_batch=8,
        max_batch=64,
        target_mfu=0.55,
        target_note="batch >= 8",
    ),
    TrainRow(
        "t5_large",
        "T5.1.1-large, Adafactor, inputs 512 / targets 114 (bf16 params, else float32 under full remat)",
        "t5_1_1_large",
        {"inputs": 512, "targets": 114},
        overrides=_T5,
        variants=_T5_REMATS,
        probes=(16, 32, 48),
        min_batch=16,
        max_batch=512,
        target_mfu=0.50,
    ),
    DecodeRow("decode_b1", "llama_1b decode, batch 1", "llama_1b", 1, overrides=_DECODE, target_roofline=0.90),
    DecodeRow("decode_b32", "llama_1b decode, batch 32", "llama_1b", 32, overrides=_DECODE, target_roofline=0.80),
    TrainRow(
        "llama_f32",
        "llama_1b, float32 params, AdamW (optimizer state offloaded)",
        "llama_1b",
        {"targets": 2048},
        optimizer="adamw",
        learning_rate=3e-4,
        optimizer_kwargs={"weight_decay": 0.1, "clip_grad_norm": 1.0},
        # layers unrolled: the update moves 64 MiB leaves, not 1 GiB stacks (2026-12-07: 15.4 GiB
        # of temporaries at 32 x 4 rows against 17.8 stacked). Loss chunks of 1024 tokens and
        # XLA:TPU's scheduler held to half the chip (`compiler_options`): its default counts the
        # temporaries against the whole 15.75 GiB, not what the 2.8 GiB of arguments leave, and
        # fills it with early host transfers of the update (18.2 GiB at any batch). Compiled for
        # a described v5e on a CPU host (2026-12-07, `--topology v5e:1x1`): 12.7 GiB at 32 x 4
        # rows, 14.6 GiB at 32 x 8 (either change alone: 16.4 and 18.2 GiB).
        overrides={**_LLAMA, "param_dtype": "float32", "scan_layers": False, "loss_chunk_size": 1024},
        variants=_LLAMA_REMATS,
        # The kernels' float32 masters and the AdamW moments live in host memory, the kernels'
        # bfloat16 copy on the device (`offload_params`); float32 gradients accumulate over 32
        # microbatches, so the ~30 GB of host transfers per step are paid once per 32 microbatches.
        trainer_overrides={
            "offload_optimizer_state": True,
            "offload_params": True,
            "offload_group_bytes": 256 * 2**20,
            "num_microbatches": 32,
            "compiler_options": {"xla_tpu_scheduler_percent_shared_memory_limit": 50},  # on TPU only
        },
        probes=(128, 256),
        min_batch=64,
        max_batch=256,
        steps=3,
        target_mfu=0.45,
    ),
    TrainRow(
        "t5_xl",
        "T5.1.1-XL, Adafactor, 512/114 (bf16 params if float32 does not fit)",
        "t5_1_1_xl",
        {"inputs": 512, "targets": 114},
        overrides=_T5,
        variants=tuple({"param_dtype": p, **r} for p in ("float32", "bfloat16") for r in _REMATS),
        probes=(4, 8, 16),
        min_batch=8,
        max_batch=256,
        target_note="trains; MFU reported",
    ),
)


# -- the GPU rows (issue 58): one NVIDIA H200 (989 TFLOP/s dense bf16, 4.8 TB/s, 141 GB) --------

# The flags of the bf16 rows: bf16 params, scanned layers, the chunked loss; attention left to the
# config (None: cuDNN's fused attention on a GPU, `cairn.models.gpu_attention`).
_LLAMA_GPU = {**_LLAMA, "param_dtype": "bfloat16"}
_FP8 = {"matmul_precision": "fp8"}
# T5.1.1-XL as t5x trains it: float32 params (2.85B: 23 GB with their gradients, room to spare
# on 141 GB), bf16 activations and logits.
_T5_GPU = {**_T5, "param_dtype": "float32"}
# The fp8 loss comparison at llama_7b, one sequence of 4096 tokens a step (the llama7b rows'
# length): 4096 x ~4.7e10 FLOP a token (6 x 6.74e9 params + attention) = 1.9e14 FLOP a step,
# ~0.4 s at 50 % of 989 TFLOP/s (fp8 less), so 200 steps of each run take ~80 + ~60 s, two
# compiles ~1 min more: ~2.5 of the 6 minutes. A larger batch would not change what is compared.
_LOSS_BATCH = 1

#: The rows of issue 58 on one H200, in the order they run (the fp8 rows after the bf16 row
#: whose batch and step they use; the loss comparison, the longest, last).
GPU_ROWS: tuple[Row, ...] = (
    TrainRow(
        "llama7b_bf16",
        "llama_7b (Llama 2 7B), bf16 params, Adafactor, 4096 tokens, largest batch",
        "llama_7b",
        {"targets": 4096},
        overrides=_LLAMA_GPU,
        variants=_LLAMA_REMATS,
        # 8 x 4096 tokens make every matmul [32768, 4096] or larger: a larger batch adds step time,
        # not MFU, so the search stops at 16 (and the budget's steps stay ~3-6 s)
        probes=(8, 16),
        min_batch=4,
        max_batch=16,
        steps=4,
        target_mfu=0.55,
        target_note="MaxText: ~50-54 % on H100",
    ),
    TrainRow(
        "llama7b_fp8",
        "llama7b_bf16 with fp8 matmuls (delayed scaling), at its batch",
        "llama_7b",
        {"targets": 4096},
        overrides={**_LLAMA_GPU, **_FP8},
        variants=_LLAMA_REMATS,
        probes=(8, 16),
        min_batch=4,
        max_batch=16,
        steps=4,
        batch_from="llama7b_bf16",
        speedup_over="llama7b_bf16",
        target_speedup=1.4,
    ),
    TrainRow(
        "llama1b_bf16",
        "llama_1b, bf16 params, Adafactor, 2048 tokens, largest batch",
        "llama_1b",
        {"targets": 2048},
        overrides=_LLAMA_GPU,
        variants=_LLAMA_REMATS,
        probes=(16, 32),
        min_batch=8,
        max_batch=32,  # 64k tokens a step: as for llama7b, more batch adds no MFU
        target_mfu=0.55,
    ),
    TrainRow(
        "t5_xl_gpu",
        "T5.1.1-XL, float32 params, Adafactor, inputs 512 / targets 114",
        "t5_1_1_xl",
        {"inputs": 512, "targets": 114},
        overrides=_T5_GPU,
        variants=_LLAMA_REMATS,  # the cuDNN kernel's residuals kept, else `full`
        probes=(64, 128),
        min_batch=32,
        max_batch=256,
        target_mfu=0.50,
    ),
    DecodeRow("decode7b_b1", "llama_7b decode, batch 1", "llama_7b", 1, overrides=_DECODE, target_roofline=0.85),
    DecodeRow("decode7b_b32", "llama_7b decode, batch 32", "llama_7b", 32, overrides=_DECODE, target_roofline=0.75),
    LossRow(
        "fp8_loss",
        f"llama_7b bf16 vs fp8 matmuls: loss after 200 steps, {_LOSS_BATCH} x 4096, same init and data",
        "llama_7b",
        {"targets": 4096},
        batch=_LOSS_BATCH,
        overrides=_LLAMA_GPU,
        compare=_FP8,
        variants=_LLAMA_REMATS[:1],
        target_gap=0.01,
    ),
)

#: `--suite`: the rows of each accelerator.
SUITES: dict[str, tuple[Row, ...]] = {"tpu": ROWS, "gpu": GPU_ROWS}


def resolve_suite(requested: str, on_gpu: bool, topology: str | None = None) -> str:
    """The suite to run: `requested` unless "auto", then "gpu" when the worker will run on a GPU
    (and no TPU `topology` is described), else "tpu"."""
    if requested != "auto":
        if requested not in SUITES:
            raise ValueError(f"--suite: expected auto or one of {', '.join(SUITES)}, got {requested!r}")
        return requested
    return "gpu" if on_gpu and not topology else "tpu"


#: `--tiny`: each row's preset -> the tiny one of its family.
TINY_PRESETS = {
    "llama_1b": "llama_tiny",
    "llama_7b": "llama_tiny",
    "t5_1_1_large": "t5_1_1_tiny",
    "t5_1_1_xl": "t5_1_1_tiny",
}


def tiny_rows(rows: Sequence[Row] = ROWS) -> tuple[Row, ...]:
    """The same rows on tiny presets and shapes (the CPU smoke run, `--tiny`): fixed batches,
    three training steps (20 for a loss comparison), short prompts (5 timed calls: the
    decode steps' time is a difference of medians), float32 activations
    (XLA:CPU compiles and runs bf16 slowly), a 512-token vocabulary for training; the
    variants, other overrides and targets unchanged."""
    out: list[Row] = []
    for row in rows:
        preset = TINY_PRESETS.get(row.preset, row.preset)
        if isinstance(row, DecodeRow):
            overrides = {**row.overrides, "dtype": "float32"}
            out.append(
                dataclasses.replace(
                    row, preset=preset, overrides=overrides, batch=min(row.batch, 4), prompt=8, new=8, repeats=5
                )
            )
            continue
        lengths = {k: 32 if k == "inputs" else 16 for k in row.lengths}
        overrides = {**row.overrides, "dtype": "float32", "vocab_size": 512}
        if "loss_chunk_size" in overrides:
            overrides["loss_chunk_size"] = 16  # several chunks of the tiny batch
        if isinstance(row, LossRow):
            out.append(
                dataclasses.replace(
                    row, preset=preset, lengths=lengths, overrides=overrides, batch=2, steps=20, period=4
                )
            )
            continue
        trainer = dict(row.trainer_overrides)
        if "num_microbatches" in trainer:
            trainer["num_microbatches"] = 2  # two microbatches of one row
        out.append(
            dataclasses.replace(
                row,
                preset=preset,
                lengths=lengths,
                overrides=overrides,
                trainer_overrides=trainer,
                batch=2,
                steps=3,
                max_batch=16,
            )
        )
    return tuple(out)


def select_rows(names: str | None, rows: Sequence[Row]) -> list[Row]:
    """The rows named in the comma-separated `names` (None or "all": every row), in table order."""
    if not names or names == "all":
        return list(rows)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {r.name for r in rows}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f"unknown rows {unknown}; known rows: {', '.join(r.name for r in rows)}")
    return [r for r in rows if r.name in wanted]


def split_overrides(fields: Iterable[str], overrides: Mapping[str, Any]) -> tuple[dict, dict]:
    """`(applied, ignored)`: the overrides whose name is one of `fields` (a dataclass's field
    names), and the rest (a config on an older main lacks them; the row says which)."""
    names = set(fields)
    applied = {k: v for k, v in overrides.items() if k in names}
    ignored = {k: v for k, v in overrides.items() if k not in names}
    return applied, ignored


# -- MFU and the decode roofline -------------------------------------------------------------


def mfu(flops_per_step: float, step_s: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: `flops_per_step / step_s / peak_flops`."""
    if step_s <= 0 or peak_flops <= 0:
        raise ValueError(f"mfu needs a positive step time and peak, got {step_s} s and {peak_flops} FLOP/s")
    return flops_per_step / step_s / peak_flops


def decode_bytes_per_step(
    weight_bytes: float, kv_bytes_per_position: float, batch: int, prompt_positions: int, steps: int
) -> float:
    """Bytes a decode step must read at least, averaged over `steps` model steps: every weight
    once, plus the key-value cache written so far. Step `i` (1-based) attends over the
    `prompt_positions` the prefill wrote and the `i` tokens fed since (its own included)."""
    if steps < 1:
        raise ValueError(f"decode_bytes_per_step needs steps >= 1, got {steps}")
    mean_positions = prompt_positions + (steps + 1) / 2
    return weight_bytes + kv_bytes_per_position * batch * mean_positions


def roofline_fraction(bytes_per_step: float, bandwidth: float, step_s: float) -> float:
    """The HBM roofline's step time (`bytes_per_step / bandwidth`) over the measured one."""
    if step_s <= 0 or bandwidth <= 0:
        raise ValueError(f"roofline_fraction needs a positive step time and bandwidth, got {step_s}, {bandwidth}")
    return bytes_per_step / bandwidth / step_s


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no values")
    return statistics.median(values)


def speedup(step_s: float | None, base_step_s: float | None) -> float | None:
    """How many times faster a step of `step_s` is than one of `base_step_s` (None when either
    is missing)."""
    if step_s is None or base_step_s is None:
        return None
    if step_s <= 0 or base_step_s <= 0:
        raise ValueError(f"speedup needs positive step times, got {step_s} and {base_step_s}")
    return base_step_s / step_s


def with_speedup(result: Mapping[str, Any], results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """`result` with its `speedup` over the row named by its `speedup_over`, from that row's
    result in `results` (row name -> result, the same invocation's): None, with a note, when that
    row did not run or failed. A result without `speedup_over` is returned as it is."""
    out = dict(result)
    base_name = out.get("speedup_over")
    if not base_name:
        return out
    base = results.get(base_name, {})
    base_ok = base.get("status") == "ok" and base.get("step_s")
    out["speedup"] = speedup(out.get("step_s"), base["step_s"]) if base_ok and out.get("step_s") else None
    if not base_ok:
        why = f"no {base_name} step in this run to compare with"
        out["note"] = "; ".join(x for x in (out.get("note"), why) if x)
    elif base.get("batch") != out.get("batch"):
        why = f"batch {out.get('batch')} vs {base_name}'s {base.get('batch')}"
        out["note"] = "; ".join(x for x in (out.get("note"), why) if x)
    return out


def inherited_batches(rows: Sequence[Row], results: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """`{row: batch}` for the training rows whose `batch_from` row finished ok in `results`."""
    out = {}
    for row in rows:
        source = results.get(getattr(row, "batch_from", ""), {})
        if source.get("status") == "ok" and source.get("batch"):
            out[row.name] = int(source["batch"])
    return out


def tail_mean(values: Sequence[float], last: int) -> float:
    """The mean of the last `last` values (all of them when there are fewer)."""
    if not values or last < 1:
        raise ValueError(f"tail_mean needs values and last >= 1, got {len(values)} values, last {last}")
    return statistics.fmean(values[-last:])


def relative_gap(value: float, reference: float) -> float:
    """`|value - reference| / |reference|`: how far a loss is from the reference's."""
    if reference == 0:
        raise ValueError("relative_gap of a zero reference")
    return abs(value - reference) / abs(reference)


# -- the largest batch that fits ---------------------------------------------------------------

_OOM = re.compile(r"Used\s+([\d.]+)([KMGT]?)i?B?\s+of\s+([\d.]+)([KMGT]?)i?B?\s+hbm", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def bytes_from_oom_message(message: str) -> int | None:
    """The bytes a program needed, from XLA's compile-time out-of-memory error ("Used 17.53G of
    15.48G hbm"), or None when the message does not say."""
    m = _OOM.search(message)
    if not m:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _fit_line(points: Sequence[tuple[int, int]], limit: float) -> float | None:
    """The batch at which a line through the two points nearest `limit` reaches it (None when
    flat or falling: memory does not grow with the batch, so no estimate)."""
    near = sorted(points, key=lambda p: abs(p[1] - limit))[:2]
    (b1, m1), (b2, m2) = sorted(near)
    if b2 == b1 or m2 <= m1:
        return None
    slope = (m2 - m1) / (b2 - b1)
    return b1 + (limit - m1) / slope


def next_candidates(known: Mapping[int, int | None], limit: float, unit: int, max_batch: int) -> list[int]:
    """The batches to compile next, or [] when the largest fitting one is known.

    `known` maps each batch compiled so far to its bytes (None: it did not fit and XLA said
    nothing more). A batch fits when its bytes are at most `limit`. Candidates are multiples of
    `unit` strictly between the largest fitting batch and the smallest one that does not fit
    (`max_batch` caps them): the line through the measured points nearest the limit predicts
    the last batch that fits, and that batch and its neighbours are tried."""
    fits = [b for b, m in known.items() if m is not None and m <= limit]
    lo = max(fits, default=0)
    over = [b for b, m in known.items() if (m is None or m > limit) and b > lo]
    hi = min(over, default=(max_batch // unit + 1) * unit)
    if hi - lo <= unit:
        return []
    measured = [(b, m) for b, m in known.items() if m is not None]
    estimate: float | None = None
    if len(measured) >= 2:
        estimate = _fit_line(measured, limit)
    elif len(measured) == 1:
        b1, m1 = measured[0]
        estimate = b1 * limit / m1 if m1 > 0 else None  # through the origin: an underestimate
    if estimate is None:
        estimate = hi - unit if over == [] and fits else (lo + hi) / 2
    best = int(math.floor(estimate / unit)) * unit
    best = min(max(best, lo + unit), hi - unit)
    out = {b for b in (best - unit, best, best + unit) if lo < b < hi and b not in known}
    return sorted(out)


def search_batch(
    measure_many: Callable[[list[int]], Mapping[int, int | None]],
    limit: float,
    probes: Sequence[int],
    unit: int = 1,
    max_batch: int = 256,
    max_rounds: int = 4,
) -> tuple[int, dict[int, int | None]]:
    """`(largest fitting batch or 0, every batch measured -> bytes)`. `measure_many(batches)`
    compiles those batches (concurrently, say) and returns their bytes (None: did not fit).
    Round one measures `probes` (rounded to multiples of `unit`, capped at `max_batch`); each
    later round the `next_candidates`."""
    if unit < 1 or max_batch < unit:
        raise ValueError(f"search_batch needs 1 <= unit <= max_batch, got unit {unit}, max_batch {max_batch}")
    first = sorted({min(max(unit, (p // unit) * unit), (max_batch // unit) * unit) for p in probes})
    known: dict[int, int | None] = dict(measure_many(first))
    for _ in range(max_rounds - 1):
        todo = next_candidates(known, limit, unit, max_batch)
        if not todo:
            break
        known.update(measure_many(todo))
    best = max((b for b, m in known.items() if m is not None and m <= limit), default=0)
    return best, known


def choose_variant(best_batches: Sequence[int], min_batch: int) -> int | None:
    """The index of the variant to run: the first whose largest batch reaches `min_batch`, else
    the one with the largest batch (the earliest on a tie); None when none fits at all."""
    for i, b in enumerate(best_batches):
        if b >= min_batch:
            return i
    top = max(best_batches, default=0)
    return best_batches.index(top) if top > 0 else None


# -- the attention check (the GPU suite) -----------------------------------------------------

#: The check's bf16 tolerance: max |candidate - reference| over max |reference|, per tensor (the
#: forward output; the gradients of q, k, v and of T5's position bias). bf16 keeps 8 significant
#: bits (2**-8: 0.4 % of a value): the output may differ by a few such steps at its largest
#: values; the gradients, sums over thousands of positions with cuDNN's backward recomputing
#: the probabilities in its own order, by more.
ATTENTION_TOLERANCE = {"out": 2e-2, "grad": 5e-2}
ATTENTION_CHECK_BATCH = 2  # small: the reference materialises [b, heads, q, k] float32 logits


@dataclasses.dataclass(frozen=True)
class AttentionCase:
    """One attention call of a row's model, compared before any row is timed: `q_len` queries
    over `kv_len` keys of `preset`'s heads (grouped-query as its config says), causal or not,
    with a T5 position bias `[1, heads, q, kv]` or none, and with padding (the batch's last
    row's last quarter of queries and keys) or none."""

    name: str
    preset: str
    q_len: int
    kv_len: int
    causal: bool
    bias: bool = False
    padding: bool = False
    batch: int = ATTENTION_CHECK_BATCH


def attention_cases(rows: Sequence[Row]) -> tuple[AttentionCase, ...]:
    """The attention calls of the training rows' models, once per distinct shape: a decoder-only
    row's causal self-attention; a T5 row's encoder self-attention (bias, padding), decoder
    self-attention (bias, causal, padding) and cross-attention (padding). Decoding rows attend
    through XLA (their steps read the cache), so they add none."""
    out: dict[str, AttentionCase] = {}
    for row in rows:
        if isinstance(row, DecodeRow):
            continue
        p, lengths = row.preset, row.lengths
        if "inputs" in lengths:
            li, lt = lengths["inputs"], lengths["targets"]
            cases = [
                AttentionCase(f"{p} encoder {li}", p, li, li, causal=False, bias=True, padding=True),
                AttentionCase(f"{p} decoder {lt}", p, lt, lt, causal=True, bias=True, padding=True),
                AttentionCase(f"{p} cross {lt}x{li}", p, lt, li, causal=False, padding=True),
            ]
        else:
            n = lengths["targets"]
            cases = [AttentionCase(f"{p} causal {n}", p, n, n, causal=True)]
        for case in cases:
            out.setdefault(case.name, case)
    return tuple(out.values())


def judge_errors(errors: Mapping[str, tuple[float, float]]) -> dict[str, dict[str, Any]]:
    """`{tensor: {"max_abs", "ref_max", "rel", "tolerance", "ok"}}` from `{tensor: (max |candidate
    - reference|, max |reference|)}`; "out" is held to the forward tolerance, the rest to the
    gradients' (`ATTENTION_TOLERANCE`). A non-finite error fails."""
    out = {}
    for name, (max_abs, ref_max) in errors.items():
        rel = max_abs / ref_max if ref_max > 0 else (0.0 if max_abs == 0 else math.inf)
        tol = ATTENTION_TOLERANCE["out" if name == "out" else "grad"]
        ok = math.isfinite(max_abs) and rel <= tol
        out[name] = {"max_abs": max_abs, "ref_max": ref_max, "rel": rel, "tolerance": tol, "ok": ok}
    return out


ATTENTION_TENSORS = ("out", "dq", "dk", "dv", "dbias")


def format_attention_check(check: Mapping[str, Any]) -> str:
    """The check as a Markdown table: per case, each tensor's max abs error and its share of the
    reference's largest value, and the verdict."""
    lines = [f"attention check: {check.get('comparison', '?')}"]
    if check.get("error"):
        lines.append(f"FAILED: {check['error']}")
    header = ["case", "q x kv", *ATTENTION_TENSORS, "verdict"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for case in check.get("cases", []):
        errors = case.get("errors", {})
        cells = [case["case"], f"{case.get('q_len', '?')} x {case.get('kv_len', '?')}"]
        for name in ATTENTION_TENSORS:
            e = errors.get(name)
            cells.append("-" if e is None else f"{e['max_abs']:.2e} ({100 * e['rel']:.2f} %)")
        verdict = "pass" if case.get("ok") else "FAIL" + (f": {case['error']}" if case.get("error") else "")
        cells.append(verdict.replace("|", "/").replace("\n", " ")[:160])
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(f"attention check {'passed' if check.get('ok') else 'FAILED'}")
    return "\n".join(lines)


# -- the table and the JSON --------------------------------------------------------------------


def verdict(value: float | None, target: float | None, lower_is_better: bool = False) -> str:
    """`holds` when `value` reaches `target` (at most it, with `lower_is_better`), `MISSED` when
    not or when there is no value, `-` without a target."""
    if target is None:
        return "-"
    if value is None:
        return "MISSED"
    return "holds" if (value <= target if lower_is_better else value >= target) else "MISSED"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _score(r: Mapping[str, Any]) -> tuple[str, str, str]:
    """`(score shown, target shown, verdict)` of a finished result of any kind."""
    kind, target = r.get("kind"), r.get("target")
    if kind == "loss":
        gap = r.get("relative_gap")
        shown = "gap " + ("-" if gap is None else f"{100 * gap:.2f} %")
        return shown, "-" if target is None else f"<= {100 * target:.1f} %", verdict(gap, target, lower_is_better=True)
    if r.get("speedup_over"):
        x, target = r.get("speedup"), r.get("target_speedup")
        shown = f"speedup {_num(x, '.2f')}x"
        return shown, "-" if target is None else f">= {target:.2f}x", verdict(x, target)
    score = r.get("roofline_fraction") if kind == "decode" else r.get("mfu")
    shown = ("roofline " if kind == "decode" else "MFU ") + _pct(score)
    return shown, "-" if target is None else f">= {100 * target:.0f} %", verdict(score, target)


def table_rows(results: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """One list of cells per result (`TABLE_HEADER`'s columns)."""
    out = []
    for r in results:
        status = r.get("status", "?")
        note = r.get("error") if status == "error" else r.get("note", "")
        shown, target, judged = _score(r)
        if status == "error":
            judged = "ERROR"
        if status in ("planned", "skipped"):  # --topology: compiled for a described chip, nothing timed
            gib = r.get("program_bytes")
            shown = "-" if gib is None else f"peak {gib / 2**30:.2f} GiB"
            judged = "fits" if status == "planned" else "-"
        out.append(
            [
                r["row"],
                status,
                _num(r.get("batch"), "d"),
                _num(r.get("compile_s"), ".1f"),
                _num(None if r.get("step_s") is None else 1e3 * r["step_s"], ".2f"),
                _num(r.get("tokens_per_s"), ",.0f"),
                shown,
                target,
                judged,
                (note or "").replace("|", "/").replace("\n", " ")[:160],
            ]
        )
    return out


TABLE_HEADER = ["row", "status", "batch", "compile s", "step ms", "tokens/s", "score", "target", "verdict", "note"]


def format_table(results: Sequence[Mapping[str, Any]]) -> str:
    """A Markdown table of the results (decode rows: the step is one decode step, tokens/s the
    decode tokens, the score the fraction of the HBM roofline; training rows: MFU)."""
    lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(results)]
    return "\n".join(lines)


def format_profile(result: Mapping[str, Any], top: int = 8) -> str:
    """A row's device time per op class and per tagged tensor kind (ms per step, share), from
    its `profile` (`--profile`)."""
    prof = result["profile"]
    total = prof.get("device_ms_per_step") or 1.0
    lines = [f"{result['row']}: device time per step {total:.2f} ms", "| op class | ms / step | share |"]
    lines.append("|---|---|---|")
    for name, ms in list(prof["classes_ms_per_step"].items())[:top]:
        lines.append(f"| {name} | {ms:.2f} | {100 * ms / total:.1f} % |")
    for name, ms in prof.get("tags_ms_per_step", {}).items():
        lines.append(f"| tensors: {name} | {ms:.2f} | {100 * ms / total:.1f} % |")
    return "\n".join(lines) + "\n"


def write_json(
    path: str,
    env: Mapping[str, Any],
    args: Mapping[str, Any],
    results: Sequence[Mapping[str, Any]],
    extra: Mapping[str, Any] | None = None,
) -> None:
    """`{"env", "args", "rows", **extra}` to `path` (every value JSON-able; others as strings)."""
    data = {"env": dict(env), "args": dict(args), "rows": list(results), **dict(extra or {})}
    with open(path, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.write("\n")
