"""The JAX side of `accel_bench.py`: runs one training or decoding row on this process's
devices and returns its result (a JSON-able dict). `gpu_mfu.py` runs its one training row here.

Training rows go through `cairn.trainer.Trainer` (its set-up step, state and loop) on seeded
synthetic tokens; the batch is the largest that fits, found by compiling the step for
candidate batches and reading `compiled.memory_analysis()` against the device's
`bytes_limit` (`_accel_plan.search_batch`), the compiles running concurrently. Decoding rows
time `predict_batch` with and without the decode steps.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import gc
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for _lib in ("storage", "tokenizers", "datatasks", "partitioning", "models", "evaluation", "trainer"):
    if os.path.join(REPO, _lib) not in sys.path:
        sys.path.insert(0, os.path.join(REPO, _lib))
from cairn.partitioning import gpu_flags  # noqa: E402

gpu_flags.set_gpu_xla_flags()  # on a GPU: XLA's training flags, before a backend starts
if gpu_flags.runs_on_gpu():
    # JAX takes 75 % of a GPU's memory by default: the batch search measures against what it took
    # (`bytes_limit`), so take 90 % (the rest for cuDNN's and cuBLAS's workspaces), unless set.
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.90")

import _op_profile  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _accel_plan import (  # noqa: E402
    AttentionCase,
    DecodeRow,
    LossRow,
    TrainRow,
    attention_cases,
    bytes_from_oom_message,
    choose_variant,
    decode_bytes_per_step,
    judge_errors,
    mfu,
    published_hbm_bandwidth,
    relative_gap,
    roofline_fraction,
    search_batch,
    split_overrides,
    tail_mean,
)
from jax.experimental.layout import Layout, with_layout_constraint  # noqa: E402

from cairn.models import (  # noqa: E402
    DecodeOptions,
    DecoderOnlyModel,
    EncoderDecoderModel,
    T5Config,
    count_params,
    get_preset,
    gpu_attention,
    training_flops_per_step,
)
from cairn.models import attention as t5_attention  # noqa: E402
from cairn.models.llama import attention as llama_attention  # noqa: E402
from cairn.partitioning import Partitioner, create_mesh, standard_logical_axis_rules, topology  # noqa: E402
from cairn.trainer import (  # noqa: E402
    CheckpointConfig,
    OptimizerConfig,
    Trainer,
    TrainerConfig,
    cpu_matmul_peak_flops,
    published_peak_flops,
)

GIB = 2**30
_TRACE_LOCK = threading.Lock()  # tracing and lowering one at a time; compiles run concurrently
HOST_MEMORY_KINDS = ("pinned_host", "unpinned_host")


class DoesNotFit(RuntimeError):
    """No batch of the row fits the device's memory (a result, not a crash)."""


@dataclasses.dataclass
class Options:
    """What the command line sets for every row (None: the row's own choice)."""

    peak_flops: float | None = None  # per device
    hbm_bandwidth: float | None = None  # bytes/s per device
    attention: str | None = None  # "auto" (None in the config), "xla", "pallas", "cudnn"
    loss_chunk_size: int | None = None
    remat: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # row (or "*") -> policies to try
    decode_variants: tuple[str, ...] = ("model",)  # decode caches compared (DECODE_SETTINGS)
    batch: int = 0
    batches: dict[str, int] = dataclasses.field(default_factory=dict)  # row name -> fixed batch
    steps: int = 0
    memory_limit: float | None = None  # bytes per device
    memory_margin: float = 0.03
    compile_threads: int = 6
    verbose: bool = True
    profile: bool = False  # trace extra steps (decode: one more call) and report device time per op class
    topology: str | None = None  # compile only, for this described TPU slice (cairn.partitioning.topology)


def log(row: str, message: str) -> None:
    print(f"[{row}] {message}", flush=True)


# -- the device ----------------------------------------------------------------------------------


def cpu_copy_bandwidth(megabytes: int = 64, repeats: int = 5) -> float:
    """Bytes/s a jitted `x + 1` over `megabytes` of float32 reads and writes on this host (the
    roofline's bandwidth on CPU, where no published figure applies)."""
    x = jnp.ones((megabytes * 2**20 // 4,), jnp.float32)
    f = jax.jit(lambda a: a + 1.0)
    f(x).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        f(x).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * x.nbytes / best


def run_devices(opts: Options) -> list[Any]:
    """The devices the rows run on: this host's, or the described TPU slice of `--topology`."""
    return topology.topology_devices(opts.topology) if opts.topology else jax.devices()


def environment(opts: Options) -> dict[str, Any]:
    """The devices, their peak FLOP/s and HBM bandwidth (per device), the memory limit, versions."""
    devices = run_devices(opts)
    first = devices[0]
    kind, platform = first.device_kind, first.platform
    if opts.peak_flops:
        peak, peak_source = opts.peak_flops, "--peak_tflops"
    elif platform == "cpu":
        peak, peak_source = cpu_matmul_peak_flops() / len(devices), "float32 matmul probe"
    else:
        peak, peak_source = published_peak_flops(kind), "published dense bf16"
    if opts.hbm_bandwidth:
        hbm, hbm_source = opts.hbm_bandwidth, "--hbm_gbps"
    elif platform == "cpu":
        hbm, hbm_source = cpu_copy_bandwidth(), "copy probe"
    else:
        hbm, hbm_source = published_hbm_bandwidth(kind), "published"
    stats = {"bytes_limit": topology.hbm_bytes(first)} if opts.topology else (first.memory_stats() or {})
    versions = {"jax": jax.__version__, "jaxlib": getattr(jax.lib, "__version__", None)}
    for name in ("flax", "optax", "orbax.checkpoint"):
        module = sys.modules.get(name)
        versions[name] = getattr(module, "__version__", None)
    return {
        "platform": platform,
        "device_kind": kind,
        "devices": len(devices),
        "peak_flops_per_device": peak,
        "peak_source": peak_source,
        "hbm_bytes_per_s": hbm,
        "hbm_source": hbm_source,
        "bytes_limit": stats.get("bytes_limit"),
        "versions": versions,
    }


def memory_limit(env: Mapping[str, Any], opts: Options) -> float | None:
    """Bytes per device a program may use: `--memory_limit_gb`, else the device's limit less the
    margin and what is in use now; None where the device reports none (CPU)."""
    if opts.memory_limit:
        return opts.memory_limit
    if not env.get("bytes_limit"):
        return None
    in_use = 0 if opts.topology else (jax.devices()[0].memory_stats() or {}).get("bytes_in_use", 0)
    return env["bytes_limit"] * (1 - opts.memory_margin) - in_use


def program_bytes(compiled: Any) -> int | None:
    """Device bytes a compiled program needs: arguments + outputs - aliased + temporaries + code."""
    ma = compiled.memory_analysis()
    if ma is None:
        return None
    return int(
        ma.argument_size_in_bytes
        + ma.output_size_in_bytes
        - ma.alias_size_in_bytes
        + ma.temp_size_in_bytes
        + ma.generated_code_size_in_bytes
    )


def free_device_memory() -> None:
    gc.collect()
    jax.clear_caches()
    gc.collect()


def build_config(preset: str, overrides: Mapping[str, Any]) -> tuple[Any, dict, dict]:
    """`(config, applied, ignored)`: the preset with the overrides its dataclass has."""
    base = get_preset(preset)
    applied, ignored = split_overrides((f.name for f in dataclasses.fields(base)), overrides)
    return base.replace(**applied), applied, ignored


def cli_model_overrides(opts: Options, train: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if opts.attention is not None:
        out["attention_implementation"] = None if opts.attention == "auto" else opts.attention
    if train and opts.loss_chunk_size is not None:
        out["loss_chunk_size"] = opts.loss_chunk_size
    return out


# -- training rows ---------------------------------------------------------------------------


class SyntheticBatches:
    """Seeded random token batches: decoder-only (`{"targets": L}`) or encoder-decoder
    (`{"inputs": Li, "targets": Lt}`), every position a real token. `period` > 0 (decoder-only):
    each sequence repeats a random motif of that many tokens (a copy task a model learns)."""

    def __init__(self, vocab: int, batch: int, lengths: Mapping[str, int], seed: int = 7, period: int = 0):
        self.vocab, self.batch, self.lengths, self.seed, self.position = vocab, batch, dict(lengths), seed, 0
        self.period = period

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, self.position])
        self.position += 1
        b, lt = self.batch, self.lengths["targets"]
        weights = np.ones((b, lt), np.float32)
        if "inputs" not in self.lengths:
            rows = rng.integers(2, self.vocab, size=(b, self.period or lt + 1), dtype=np.int32)
            rows = np.tile(rows, (1, -(-(lt + 1) // rows.shape[1])))[:, : lt + 1]
            return {
                "decoder_input_tokens": rows[:, :-1],
                "decoder_target_tokens": rows[:, 1:],
                "decoder_loss_weights": weights,
            }
        inputs = rng.integers(2, self.vocab, size=(b, self.lengths["inputs"]), dtype=np.int32)
        targets = rng.integers(2, self.vocab, size=(b, lt), dtype=np.int32)
        shifted = np.concatenate([np.zeros((b, 1), np.int32), targets[:, :-1]], axis=1)  # BOS 0 first
        return {
            "encoder_input_tokens": inputs,
            "decoder_input_tokens": shifted,
            "decoder_target_tokens": targets,
            "decoder_loss_weights": weights,
        }

    def get_state(self) -> dict[str, int]:
        return {"position": self.position}

    def set_state(self, state: Mapping[str, int]) -> None:
        self.position = int(state["position"])


class _Finished(Exception):
    """Raised by `_StopHook` after the last step: the loop ends without its final checkpoint."""


class _StopHook:
    """A step hook: records when each step's hook ran and ends the loop after `steps`. With
    `profile_steps`, those steps run after the timed ones under `jax.profiler` (their times are
    left out of the median) and `trace_file` names the trace written."""

    def __init__(self, steps: int, profile_steps: int = 0):
        self.steps, self.times = steps, []
        self.profile_steps, self.trace_file = profile_steps, None
        self.trace_dir = tempfile.mkdtemp(prefix="accel_bench_trace_") if profile_steps else None

    def __call__(self, step: int, state: Any) -> None:
        self.times.append(time.perf_counter())
        if self.profile_steps and step == self.steps:
            jax.block_until_ready(state)
            jax.profiler.start_trace(self.trace_dir)
        if step >= self.steps + self.profile_steps:
            if self.profile_steps:
                jax.block_until_ready(state)
                jax.profiler.stop_trace()
                self.trace_file = _op_profile.latest_trace(self.trace_dir)
            raise _Finished()


@dataclasses.dataclass
class _Candidate:
    trainer: Trainer
    hook: _StopHook
    batch: int
    compiled: Any = None
    bytes: int | None = None
    compile_s: float = 0.0
    error: str = ""


def _label(variant: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(variant.items())) or "step"


def _state_device_bytes(abstract_state: Any) -> tuple[int, int]:
    """`(bytes of the state kept in device memory, bytes of its params)`."""
    on_device = 0
    for leaf in jax.tree.leaves(abstract_state):
        sharding = getattr(leaf, "sharding", None)
        if getattr(sharding, "memory_kind", None) in HOST_MEMORY_KINDS:
            continue
        on_device += int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
    params = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(abstract_state.params))
    return on_device, params


class _TrainRowRunner:
    def __init__(self, row: TrainRow, env: Mapping[str, Any], opts: Options):
        self.row, self.env, self.opts = row, env, opts
        self.steps = opts.steps or row.steps
        devices = run_devices(opts)
        self.partitioner = Partitioner(
            create_mesh({"data": -1, "model": 1}, devices=devices), standard_logical_axis_rules()
        )
        self.model_root = tempfile.mkdtemp(prefix=f"accel_bench_{row.name}_")
        fields = {f.name for f in dataclasses.fields(TrainerConfig)}
        overrides = dict(row.trainer_overrides)
        if devices[0].platform != "tpu":  # the rows' compiler options are XLA:TPU flags
            overrides.pop("compiler_options", None)
        self.trainer_applied, self.trainer_ignored = split_overrides(fields, overrides)
        # the batch moves in whole microbatches on every device
        self.unit = len(devices) * int(self.trainer_applied.get("num_microbatches", 1))
        self.peak = env["peak_flops_per_device"] * env["devices"] if env.get("peak_flops_per_device") else None
        self.made = 0

    # the trainer of one candidate (a fresh one each: `setup` fixes the batch shapes)
    def make(self, config: Any, batch: int) -> _Candidate:
        self.made += 1
        model_dir = os.path.join(self.model_root, f"run{self.made}")
        model_cls = EncoderDecoderModel if isinstance(config, T5Config) else DecoderOnlyModel
        model = model_cls(config, z_loss=1e-4, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
        cfg = TrainerConfig(
            model_dir=model_dir,
            num_train_steps=self.steps + PROFILE_STEPS + 1,  # the hook ends the loop first: no final save
            log_every=1,
            checkpoint_every=0,
            tensorboard=False,
            progress=False,
            handle_sigterm=False,
            donate_state=True,
            peak_flops=self.peak,
            checkpoint=CheckpointConfig(keep=1, asynchronous=False),
            **self.trainer_applied,
        )
        hook = _StopHook(self.steps, PROFILE_STEPS if self.opts.profile else 0)
        optimizer = OptimizerConfig(name=self.row.optimizer, **dict(self.row.optimizer_kwargs))
        trainer = Trainer(model, optimizer, self.row.learning_rate, self.partitioner, cfg, step_hooks=[hook])
        with _TRACE_LOCK:
            trainer.setup(self.batches(config, batch).__next__())
        return _Candidate(trainer, hook, batch)

    def batches(self, config: Any, batch: int) -> SyntheticBatches:
        return SyntheticBatches(config.vocab_size, batch, self.row.lengths, period=self.row.period)

    def lower(self, cand: _Candidate, config: Any) -> Any:
        sample = self.batches(config, cand.batch).__next__()
        shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in sample.items()}
        with _TRACE_LOCK:
            return cand.trainer.train_step.lower(cand.trainer.abstract_state, shapes)

    @staticmethod
    def compile(cand: _Candidate, lowered: Any) -> _Candidate:
        start = time.perf_counter()
        try:
            cand.compiled = lowered.compile()
            cand.bytes = program_bytes(cand.compiled)
        except Exception as e:  # XLA refuses a program larger than the device's memory
            text = str(e)
            if "RESOURCE_EXHAUSTED" not in text and "out of memory" not in text.lower():
                raise
            cand.bytes, cand.error = bytes_from_oom_message(text), text.splitlines()[0][:200]
        cand.compile_s = time.perf_counter() - start
        return cand

    def measure_many(
        self, pool, config: Any, batches: list[int], found: dict[int, _Candidate], label: str, limit: float | None
    ) -> dict[int, int | None]:
        """Compiles `batches` concurrently; `{batch: bytes}`, None for a batch XLA refused to
        compile (or one whose refusal named fewer bytes than `limit`: it does not fit either)."""
        lowered = []
        for b in batches:
            cand = self.make(config, b)
            lowered.append((cand, self.lower(cand, config)))
        for cand in [f.result() for f in [pool.submit(self.compile, c, lo) for c, lo in lowered]]:
            found[cand.batch] = cand
            gib = "?" if cand.bytes is None else f"{cand.bytes / GIB:.3g} GiB"
            refused = f"; refused: {cand.error}" if cand.compiled is None and cand.error else ""
            log(self.row.name, f"{label} batch {cand.batch}: {gib} (compile {cand.compile_s:.1f} s){refused}")
        out: dict[int, int | None] = {}
        for b in batches:
            cand = found[b]
            refused_size = cand.bytes if cand.bytes is not None and limit is not None and cand.bytes > limit else None
            out[b] = cand.bytes if cand.compiled is not None else refused_size
        return out

    def search(self, pool, config: Any, limit: float, label: str) -> tuple[int, dict[int, _Candidate]]:
        found: dict[int, _Candidate] = {}
        row = self.row
        best, _ = search_batch(
            lambda bs: self.measure_many(pool, config, bs, found, label, limit),
            limit,
            row.probes,
            unit=self.unit,
            max_batch=max(self.unit, row.max_batch),
            max_rounds=3,
        )
        for b, cand in list(found.items()):  # keep the executable of the best batch only
            if b != best:
                cand.compiled = None
        return best, found

    def run(self) -> dict[str, Any]:
        row, opts = self.row, self.opts
        start = time.perf_counter()
        overrides = {**row.overrides, **cli_model_overrides(opts, train=True)}
        variants = [dict(v) for v in row.variants] or [{}]
        policies = opts.remat.get(row.name, opts.remat.get("*"))
        if policies:
            variants = [{**v, "remat_policy": p} for p in policies for v in variants]
        configs, seen = [], set()
        for v in variants:
            config, applied, ignored = build_config(row.preset, {**overrides, **v})
            if config not in seen:  # a variant whose only change was ignored is the one before
                seen.add(config)
                configs.append((v, config, applied, ignored))
        limit = memory_limit(self.env, opts)
        # A fixed batch: --batches/--batch, else the row's own (--tiny) unless --memory_limit_gb asks
        # for the search, else the first probe where the device reports no limit (CPU).
        fixed = opts.batches.get(row.name) or opts.batch or (row.batch if opts.memory_limit is None else 0)
        if not fixed and limit is None:
            fixed = max(self.unit, row.probes[0])
        result: dict[str, Any] = {"memory_limit_bytes": limit, "search": []}
        search_start = time.perf_counter()
        chosen = self.choose(configs, limit, fixed, result)
        result["search_s"] = time.perf_counter() - search_start
        v, config, applied, ignored, cand = chosen
        if opts.topology:  # compile only: the plan, nothing timed
            cand.compiled = None
            result.update(
                status="planned",
                batch=cand.batch,
                lengths=dict(row.lengths),
                target=row.target_mfu,
                planned=opts.topology,
            )
        else:
            result.update(self.train(cand, config))
        result.update(
            variant=v,
            config_overrides=applied,
            ignored_overrides=sorted(set(ignored) | set(self.trainer_ignored)),
            trainer_overrides=self.trainer_applied,
            params=count_params(config),
            wall_s=time.perf_counter() - start,
        )
        if row.speedup_over:  # scored by `_accel_plan.with_speedup` against that row's step
            result.update(speedup_over=row.speedup_over, target_speedup=row.target_speedup)
        notes = [", ".join(f"{k}={v[k]}" for k in sorted(v))] if v else []
        if result["ignored_overrides"]:
            notes.append("ignored: " + ", ".join(result["ignored_overrides"]))
        result["note"] = "; ".join(notes)
        return result

    def choose(self, configs, limit, fixed: int, result: dict) -> tuple:
        """The variant and batch to run, with its compiled step."""
        row, opts = self.row, self.opts
        survivors = []
        for v, config, applied, ignored in configs:
            cand = self.make(config, self.unit)
            state_bytes, param_bytes = _state_device_bytes(cand.trainer.abstract_state)
            floor = state_bytes + param_bytes  # the state and the gradients, before any activation
            if limit is not None and floor > limit:
                log(row.name, f"{v}: state + gradients {floor / GIB:.3g} GiB > limit {limit / GIB:.3g} GiB, skipped")
                result["search"].append({"variant": v, "skipped": f"state + gradients {floor / GIB:.3g} GiB"})
                continue
            survivors.append((v, config, applied, ignored))
        if not survivors:
            raise DoesNotFit(f"no variant fits: state + gradients exceed {limit / GIB:.3g} GiB ({result['search']})")
        workers = max(1, opts.compile_threads)
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            if fixed:  # the first variant (in order) that fits the fixed batch
                refused = []
                for v, config, applied, ignored in survivors:
                    found: dict[int, _Candidate] = {}
                    self.measure_many(pool, config, [fixed], found, _label(v), limit)
                    cand = found[fixed]
                    if cand.compiled is None or (limit is not None and cand.bytes is not None and cand.bytes > limit):
                        why = cand.error or f"{cand.bytes / GIB:.3g} GiB"
                        refused.append(f"{_label(v)}: {why}")
                        result["search"].append({"variant": v, "batch": fixed, "does_not_fit": why})
                        continue
                    result["compile_s"] = cand.compile_s
                    result["program_bytes"] = cand.bytes
                    return v, config, applied, ignored, cand
                raise DoesNotFit(f"batch {fixed} does not fit: " + "; ".join(refused))
            with concurrent.futures.ThreadPoolExecutor(len(survivors)) as outer:
                futures = [outer.submit(self.search, pool, c[1], limit, _label(c[0])) for c in survivors]
                searched = [f.result() for f in futures]
        for (v, *_), (best, found) in zip(survivors, searched):
            entry = {"variant": v, "best": best, "bytes": {b: c.bytes for b, c in sorted(found.items())}}
            refused = {b: c.error for b, c in sorted(found.items()) if c.compiled is None and c.error}
            result["search"].append({**entry, "refused": refused} if refused else entry)
        pick = choose_variant([best for best, _ in searched], row.min_batch)
        if pick is None:
            raise DoesNotFit(f"no batch fits {limit / GIB:.3g} GiB: {result['search']}")
        best, found = searched[pick]
        cand = found[best]
        result["compile_s"] = cand.compile_s
        result["program_bytes"] = cand.bytes
        return (*survivors[pick], cand)

    def train(self, cand: _Candidate, config: Any) -> dict[str, Any]:
        row, trainer = self.row, cand.trainer
        compiled, jitted = cand.compiled, trainer.train_step

        def step(state, batch):  # the executable compiled while searching; the jitted step if it refuses
            try:
                return compiled(state, batch)
            except (TypeError, ValueError):
                return jitted(state, batch)

        trainer.train_step = step
        log(row.name, f"training batch {cand.batch} for {self.steps} steps")
        start = time.perf_counter()
        try:
            trainer.train(self.batches(config, cand.batch))
        except _Finished:
            pass
        finally:
            cand.compiled = None
        wall = time.perf_counter() - start
        metrics = os.path.join(trainer.config.model_dir, "summaries", "metrics.jsonl")
        with open(metrics) as f:
            rows = [json.loads(line) for line in f]
        timed = [r for r in rows if r.get("step", 0) <= self.steps]  # not the profiled steps
        step_times = [r["value"] for r in timed if r["metric"] == "step_time_s"]
        losses = [r["value"] for r in timed if r["metric"] == "loss"]
        if not step_times:
            raise RuntimeError(f"no step times in {metrics}: too few steps ({self.steps})")
        step_s = statistics.median(step_times)
        flops = training_flops_per_step(config, cand.batch, row.lengths)
        target_tokens = cand.batch * row.lengths["targets"]
        first_step = cand.hook.times[0] - start if cand.hook.times else None
        stats = jax.devices()[0].memory_stats() or {}
        return {
            "batch": cand.batch,
            "lengths": dict(row.lengths),
            "steps_timed": len(step_times),
            "step_s": step_s,
            "tokens_per_s": target_tokens / step_s,
            "input_tokens_per_s": cand.batch * row.lengths.get("inputs", 0) / step_s,
            "model_tflops_per_step": flops / 1e12,
            "mfu": mfu(flops, step_s, self.peak) if self.peak else None,
            "target": row.target_mfu,
            "first_step_s": first_step,
            "train_wall_s": wall,
            "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None,
            "losses": losses,
            "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
            **_profile_result(cand.hook.trace_file, cand.hook.profile_steps, _tags(config, row.lengths)),
        }


PROFILE_STEPS = 2  # steps traced after the timed ones when `Options.profile`


def _tags(config: Any, lengths: Mapping[str, int]) -> dict[str, str]:
    """Regular expressions over an op's HLO text: ops on the vocabulary's tensors, and on
    attention-shaped ones (`[..., L, L]` for a sequence length L)."""
    tags = {"vocabulary (logits, loss)": rf"\b{config.vocab_size}\b"}
    sizes = sorted({int(v) for v in lengths.values()})
    tags["attention [..., L, L]"] = "|".join(rf",{a},{b}\]" for a in sizes for b in sizes)
    return tags


def _profile_result(trace_file: str | None, steps: int, tags: Mapping[str, str]) -> dict[str, Any]:
    """`{"profile": {"classes", "tags", "ops", "ms_per_step"...}}` of a trace, or {} without one."""
    if not trace_file:
        return {}
    try:
        prof = _op_profile.op_classes(trace_file, top_ops=40, tags=dict(tags))
    except Exception as e:  # a profile is a bonus: never fail the row for it
        return {"profile": {"error": f"{type(e).__name__}: {e}"}}
    per_step = lambda d: {k: v / steps for k, v in d.items()}
    return {
        "profile": {
            "steps": steps,
            "device_ms_per_step": prof["total_ms"] / steps,
            "classes_ms_per_step": per_step(prof["classes"]),
            "tags_ms_per_step": per_step(prof["tags"]),
            "top_ops_ms_per_step": {k[:300]: v for k, v in per_step(prof["ops"]).items()},
        }
    }


def run_train_row(row: TrainRow, env: Mapping[str, Any], opts: Options) -> dict[str, Any]:
    """Trains `row` (the largest batch that fits, or its fixed batch) and measures it."""
    _PARAMS.clear()  # a decode row's weights would hold device memory the search counts as taken
    free_device_memory()
    return _TrainRowRunner(row, env, opts).run()


# -- the loss comparison ---------------------------------------------------------------------


def run_loss_row(row: LossRow, env: Mapping[str, Any], opts: Options) -> dict[str, Any]:
    """Trains `row`'s two legs one after the other (the reference, then with `row.compare`):
    the same trainer seed (the same initial params) and the same seeded batches, `row.steps`
    steps each at `row.batch`; the score is the relative gap of their last-`row.last`-step mean
    losses. The command line's batch, steps and profile options do not apply."""
    leg_opts = dataclasses.replace(opts, batch=0, batches={}, steps=0, memory_limit=None, profile=False, remat={})
    legs = {}
    for leg, name in zip(row.legs(), ("reference", "compared")):
        log(row.name, f"{name}: {leg.steps} steps at batch {leg.batch} ({_label(dict(leg.overrides))})")
        legs[name] = run_train_row(leg, env, leg_opts)
    ref, cmp = legs["reference"], legs["compared"]
    if len(ref["losses"]) < row.steps or len(cmp["losses"]) < row.steps:
        raise RuntimeError(f"losses of {len(ref['losses'])} and {len(cmp['losses'])} steps, not {row.steps}")
    ref_loss, cmp_loss = tail_mean(ref["losses"], row.last), tail_mean(cmp["losses"], row.last)
    gap = relative_gap(cmp_loss, ref_loss)
    keep = ("step_s", "mfu", "compile_s", "first_loss", "last_loss", "train_wall_s", "config_overrides", "variant")
    compared = ", ".join(f"{k}={v}" for k, v in sorted(row.compare.items()))
    return {
        "batch": row.batch,
        "lengths": dict(row.lengths),
        "steps": row.steps,
        "compile_s": ref["compile_s"] + cmp["compile_s"],
        "step_s": cmp["step_s"],
        "reference_loss": ref_loss,
        "compared_loss": cmp_loss,
        "relative_gap": gap,
        "target": row.target_gap,
        "reference": {k: ref.get(k) for k in keep} | {"losses": ref["losses"]},
        "compared": {k: cmp.get(k) for k in keep} | {"losses": cmp["losses"]},
        "note": (
            f"loss (mean of last {row.last}) {ref_loss:.4f} -> {compared} {cmp_loss:.4f}; "
            f"step {1e3 * ref['step_s']:.1f} -> {1e3 * cmp['step_s']:.1f} ms"
        ),
    }


# -- the attention check ----------------------------------------------------------------------


def _case_inputs(case: AttentionCase, dtype) -> dict[str, Any]:
    """Seeded q, k, v `[b, len, heads, d]` of the case's preset (its kv heads for k and v), the
    T5 position bias `[1, heads, q, kv]`, the segment ids (the last row's last quarter padded)
    and the output's cotangent (zero at padded queries, as the loss weights make it)."""
    cfg = get_preset(case.preset)
    heads, d = cfg.num_heads, cfg.head_dim
    kv_heads = getattr(cfg, "num_kv_heads", heads)
    b, lq, lk = case.batch, case.q_len, case.kv_len
    keys = jax.random.split(jax.random.PRNGKey(len(case.name)), 5)
    out = {
        "q": jax.random.normal(keys[0], (b, lq, heads, d), jnp.float32).astype(dtype),
        "k": jax.random.normal(keys[1], (b, lk, kv_heads, d), jnp.float32).astype(dtype),
        "v": jax.random.normal(keys[2], (b, lk, kv_heads, d), jnp.float32).astype(dtype),
        "bias": jax.random.normal(keys[3], (1, heads, lq, lk), jnp.float32).astype(dtype) if case.bias else None,
    }
    q_seg, k_seg = np.ones((b, lq), np.int32), np.ones((b, lk), np.int32)
    if case.padding:
        q_seg[-1, lq - lq // 4 :], k_seg[-1, lk - lk // 4 :] = 0, 0
    out["segments"] = (jnp.asarray(q_seg), jnp.asarray(k_seg)) if case.padding else None
    out["real_queries"] = jnp.asarray(q_seg)[:, :, None, None]  # where the output is compared
    ct = jax.random.normal(keys[4], (b, lq, heads, d), jnp.float32) * out["real_queries"]
    out["cotangent"] = ct.astype(dtype)
    out["scale"] = 1.0 if isinstance(cfg, T5Config) else d**-0.5  # T5 folds the scale into its queries
    return out


def _case_attention(case: AttentionCase, x: Mapping[str, Any], implementation: str | None) -> Callable:
    """`f(q, k, v, bias) -> out` of the case: the cuDNN branch as the models call it
    (`gpu_attention.attention`, through T5's `fused_attention`) with `implementation`, or with
    None the models' plain XLA attention (`jax.nn.dot_product_attention`, "xla"; T5's mask and
    bias as the parts its XLA path adds, `attention.parts_bias`)."""
    segments, scale = x["segments"], x["scale"]

    def t5_bias(bias):
        dense = jnp.zeros((1, 1, case.q_len, case.kv_len), jnp.float32)
        q_seg, k_seg = segments if segments is not None else (None, None)
        return t5_attention.AttentionBias(dense, bias, q_seg, k_seg, case.causal)

    def f(q, k, v, bias):
        is_t5 = scale == 1.0
        if implementation is not None and is_t5:
            return t5_attention.fused_attention(q, k, v, t5_bias(bias), implementation)
        if implementation is not None:
            return gpu_attention.attention(q, k, v, is_causal=case.causal, scale=scale, implementation=implementation)
        if is_t5:
            added = sum(p.astype(jnp.float32) for p in t5_attention.parts_bias(t5_bias(bias)))
            added = None if isinstance(added, int) else added.astype(q.dtype)
            return jax.nn.dot_product_attention(q, k, v, bias=added, scale=1.0, implementation="xla")
        return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=case.causal, implementation="xla")

    return f


def _forward_and_grads(case: AttentionCase, x: Mapping[str, Any], implementation: str | None) -> dict[str, Any]:
    """`{"out", "dq", "dk", "dv"[, "dbias"]}` of the case's attention, as float32 arrays; the
    output at real queries only (a padded query attends no key: what each path averages there
    differs, and no loss reads it)."""
    f = _case_attention(case, x, implementation)

    @jax.jit
    def run(q, k, v, bias, ct):
        if bias is None:
            out, pull = jax.vjp(lambda q, k, v: f(q, k, v, None), q, k, v)
            grads = pull(ct)
        else:
            out, pull = jax.vjp(f, q, k, v, bias)
            grads = pull(ct)
        return (out * x["real_queries"].astype(out.dtype), *grads)

    values = run(x["q"], x["k"], x["v"], x["bias"], x["cotangent"])
    names = ("out", "dq", "dk", "dv", "dbias")[: len(values)]
    return {n: np.asarray(jax.device_get(v), np.float32) for n, v in zip(names, values)}


def attention_check(rows: Sequence[TrainRow | DecodeRow | LossRow]) -> dict[str, Any]:
    """cuDNN's attention against XLA's on the rows' attention shapes (`attention_cases`), in
    bfloat16, forward and gradients: on a GPU `gpu_attention.attention(implementation="cudnn")`,
    elsewhere the same branch with "xla" (the smoke run: the code path, not the kernel), each
    against the models' plain XLA attention; per tensor the max abs error and its share of the
    reference's largest value, judged by `_accel_plan.judge_errors`. A case that raises fails
    with its error; nothing here stops the rows."""
    platform = jax.devices()[0].platform
    implementation = gpu_attention.KERNEL if platform == "gpu" else "xla"
    comparison = (
        f'gpu_attention.attention(implementation="{implementation}") vs XLA\'s attention '
        f'(jax.nn.dot_product_attention, "xla"), bfloat16, on {platform}'
        + ("" if platform == "gpu" else ": the cuDNN branch's code path with XLA underneath, not cuDNN")
    )
    start = time.perf_counter()
    cases = []
    for case in attention_cases(rows):
        entry: dict[str, Any] = {**dataclasses.asdict(case), "case": case.name}
        try:
            x = _case_inputs(case, jnp.bfloat16)
            got, want = _forward_and_grads(case, x, implementation), _forward_and_grads(case, x, None)
            errors = {n: (float(np.max(np.abs(got[n] - want[n]))), float(np.max(np.abs(want[n])))) for n in want}
            entry["errors"] = judge_errors(errors)
            entry["ok"] = all(e["ok"] for e in entry["errors"].values())
        except Exception as e:  # a refusal (shapes cuDNN does not take) or a crash is a failed case
            entry.update(ok=False, error=f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"[:300])
        log("attention", f"{case.name}: {'pass' if entry['ok'] else 'FAIL'}")
        cases.append(entry)
        free_device_memory()
    return {
        "comparison": comparison,
        "implementation": implementation,
        "platform": platform,
        "cases": cases,
        "ok": all(c["ok"] for c in cases),
        "wall_s": time.perf_counter() - start,
    }


# -- decoding rows ---------------------------------------------------------------------------

_PARAMS: dict[str, Any] = {}  # the last decode row's params, reused by the next row of the same config


def _timed_calls(fns: Mapping[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Seconds of each function's calls, `repeats` rounds interleaved, after one warm-up each."""
    for fn in fns.values():
        jax.block_until_ready(fn())
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - start)
    return times


def kv_bytes_per_position(
    model: DecoderOnlyModel, params: Any, batch: int, lengths: tuple[int, int] = (256, 512)
) -> float:
    """Bytes of key-value cache per row and position: how much the decode cache grows from one
    length to the other (from its shapes; nothing is allocated), whatever its layout or padding."""

    def cache_bytes(length: int) -> int:
        def make_cache(p):
            dummy = jnp.zeros((batch, length), jnp.int32)
            return model.module.apply({"params": p}, dummy, decode=True, mutable=["cache"])[1]["cache"]

        leaves = jax.tree.leaves(jax.eval_shape(make_cache, params))
        return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in leaves)

    short, long = lengths
    return (cache_bytes(long) - cache_bytes(short)) / (batch * (long - short))


def _write_select(cache: jax.Array, chunk: jax.Array, start: jax.Array) -> jax.Array:
    """A one-token chunk written by a select over the whole cache (longer chunks: the model's)."""
    if chunk.shape[1] != 1:
        return _write_slice(cache, chunk, start)
    at = jnp.arange(cache.shape[1], dtype=jnp.int32)[None, :, None, None] == start
    return jnp.where(at, chunk.astype(cache.dtype), cache)


def _write_pinned(major_to_minor: tuple[int, ...]) -> Callable:
    """The model's write, then the cache's layout pinned for XLA (`with_layout_constraint`)."""

    def write(cache: jax.Array, chunk: jax.Array, start: jax.Array) -> jax.Array:
        return with_layout_constraint(_write_slice(cache, chunk, start), Layout(major_to_minor=major_to_minor))

    return write


def _write_slice(cache: jax.Array, chunk: jax.Array, start: jax.Array) -> jax.Array:
    """`dynamic_update_slice` alone, the cache's layout left to XLA."""
    return jax.lax.dynamic_update_slice(cache, chunk.astype(cache.dtype), (0, start, 0, 0))


_FOUR_D = {"FLAT_CACHE_PLATFORMS": ()}
_FLAT = {"FLAT_CACHE_PLATFORMS": ("cpu", "gpu", "tpu")}
#: `--decode_variants`: `cairn.models.llama.attention`'s module settings while a decode row's
#: program is traced ("model": the model's own; `write_cache` writes the cache
#: `[b, len, kv_heads, head_dim]` of the four-dimensional variants).
DECODE_SETTINGS: dict[str, dict[str, Any]] = {
    "model": {},
    "model_4d": _FOUR_D,
    "flat": {**_FLAT, "FLAT_WRITTEN_PREFIX": False},
    "flat_written": {**_FLAT, "FLAT_WRITTEN_PREFIX": True},
    "slice": {**_FOUR_D, "write_cache": _write_slice},
    "select": {**_FOUR_D, "write_cache": _write_select},
    "row_major": {**_FOUR_D, "write_cache": _write_pinned((0, 1, 2, 3))},
    "head_major": {**_FOUR_D, "write_cache": _write_pinned((0, 2, 1, 3))},
    "position_major": {**_FOUR_D, "write_cache": _write_pinned((1, 0, 2, 3))},
}


def _compile_decode(model: DecoderOnlyModel, params: Any, prompts: Any, row: DecodeRow, settings, opts):
    """`({"full": executable, "prefill": executable}, compile seconds)`, traced with
    `cairn.models.llama.attention`'s `settings` (module attributes, restored after)."""
    lengths = {"full": row.prompt + row.new, "prefill": row.prompt + 1}
    lowered = {}
    saved = {name: getattr(llama_attention, name) for name in settings}
    for name, value in settings.items():  # read when the model is traced, i.e. while lowering
        setattr(llama_attention, name, value)
    try:
        for name, length in lengths.items():
            options = DecodeOptions(max_decode_length=length, eos_id=-1)
            fn = jax.jit(lambda p, x, o=options: model.predict_batch(p, x, o)[0])
            lowered[name] = fn.lower(params, prompts)
    finally:
        for name, value in saved.items():
            setattr(llama_attention, name, value)
    compile_start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max(1, min(2, opts.compile_threads))) as pool:
        compiled = dict(zip(lowered, pool.map(lambda lo: lo.compile(), lowered.values())))
    return compiled, time.perf_counter() - compile_start


def run_decode_row(row: DecodeRow, env: Mapping[str, Any], opts: Options) -> dict[str, Any]:
    """Greedy decoding of `row.batch` prompts; the decode steps timed apart from the prefill,
    for each of `opts.decode_variants` (the fastest is the row's result)."""
    if row.new < 2:
        raise ValueError(f"decode row {row.name}: new must be >= 2 (the first token comes from the prefill)")
    start = time.perf_counter()
    config, applied, ignored = build_config(row.preset, {**row.overrides, **cli_model_overrides(opts, train=False)})
    model = DecoderOnlyModel(config)
    key = repr(config)
    if key not in _PARAMS:
        _PARAMS.clear()
        free_device_memory()
        _PARAMS[key] = jax.block_until_ready(model.init(jax.random.PRNGKey(0)))
    params = _PARAMS[key]
    prompts = jnp.asarray(
        np.random.default_rng([11, row.batch]).integers(2, config.vocab_size, (row.batch, row.prompt), dtype=np.int32)
    )
    steps = row.new - 1  # the first new token comes from the prefill's logits
    weights = sum(x.nbytes for x in jax.tree.leaves(params))
    tied = getattr(config, "tie_word_embeddings", getattr(config, "logits_via_embedding", False))
    if not tied:  # an untied input embedding is only gathered, not read whole
        weights -= params["token_embedder"]["embedding"].nbytes
    kv = kv_bytes_per_position(model, params, row.batch)
    per_step = decode_bytes_per_step(weights, kv, row.batch, row.prompt + 1, steps)
    hbm = env.get("hbm_bytes_per_s")
    measured: dict[str, dict[str, Any]] = {}
    executables: dict[str, dict[str, Any]] = {}
    reference = None
    for variant in opts.decode_variants:
        try:
            compiled, compile_s = _compile_decode(model, params, prompts, row, DECODE_SETTINGS[variant], opts)
        except Exception as e:  # a variant XLA or the layout pass refuses is a result too
            measured[variant] = {"error": f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"[:300]}
            log(row.name, f"decode cache {variant}: {measured[variant]['error']}")
            continue
        log(row.name, f"decode cache {variant}: compiled prefill and decode in {compile_s:.1f} s")
        outputs: dict[str, Any] = {}

        def call(name, compiled=compiled, outputs=outputs):
            def fn():
                outputs[name] = compiled[name](params, prompts)
                return outputs[name]

            return fn

        times = _timed_calls({name: call(name) for name in compiled}, row.repeats)
        full, prefill = np.asarray(outputs["full"]), np.asarray(outputs["prefill"])
        reference = full if reference is None else reference
        total_s, prefill_s = statistics.median(times["full"]), statistics.median(times["prefill"])
        decode_s = total_s - prefill_s
        step_s = decode_s / steps if decode_s > 0 else None
        measured[variant] = {
            "compile_s": compile_s,
            "call_s": total_s,
            "prefill_s": prefill_s,
            "decode_s": decode_s,
            "step_s": step_s,
            "roofline_fraction": roofline_fraction(per_step, hbm, step_s) if hbm and step_s else None,
            "first_tokens_agree": bool(np.array_equal(full[:, row.prompt], prefill[:, row.prompt])),
            "tokens_equal_first_variant": bool(np.array_equal(full, reference)),
            "times_s": times,
        }
        executables[variant] = compiled
        del outputs
    timed = [v for v in measured if "step_s" in measured[v] and measured[v]["step_s"]]
    if not timed:
        raise RuntimeError(f"no decode variant ran: {measured}")
    best = min(timed, key=lambda v: measured[v]["step_s"])
    chosen = measured[best]
    profile: dict[str, Any] = {}
    if opts.profile:
        compiled = executables[best]
        trace = _op_profile.profile_steps(
            lambda: compiled["full"](params, prompts), 1, tempfile.mkdtemp(prefix="accel_bench_trace_")
        )
        tags = {"vocabulary (logits, argmax)": rf"\b{config.vocab_size}\b"}
        profile = _profile_result(trace, 1, tags)
    prefill_s, decode_s, step_s = chosen["prefill_s"], chosen["decode_s"], chosen["step_s"]
    prefill_flops = training_flops_per_step(config, row.batch, {"targets": row.prompt + 1}) / 3  # forward only
    peak = (env.get("peak_flops_per_device") or 0) * env["devices"]
    note = f"prefill {1e3 * prefill_s:.1f} ms"
    if len(opts.decode_variants) > 1:
        note += f"; decode cache {best}"
    if ignored:
        note += "; ignored: " + ", ".join(sorted(ignored))
    if not chosen["first_tokens_agree"]:
        note += "; first new tokens differ between the two calls"
    if not all(m.get("tokens_equal_first_variant", True) for m in measured.values()):
        note += "; the decode caches decoded different tokens"
    return {
        "batch": row.batch,
        "prompt": row.prompt,
        "new": row.new,
        "params": count_params(config),
        "config_overrides": applied,
        "ignored_overrides": sorted(ignored),
        "compile_s": chosen["compile_s"],
        "call_s": chosen["call_s"],
        "prefill_s": prefill_s,
        "prefill_mfu": prefill_flops / prefill_s / peak if peak else None,
        "decode_s": decode_s,
        "decode_steps": steps,
        "step_s": step_s,
        "tokens_per_s": row.batch * steps / decode_s if decode_s > 0 else None,
        "weight_bytes": weights,
        "kv_bytes_per_position": kv,
        "bytes_per_step": per_step,
        "roofline_step_s": per_step / hbm if hbm else None,
        "roofline_fraction": chosen["roofline_fraction"],
        "target": row.target_roofline,
        "first_tokens_agree": chosen["first_tokens_agree"],
        "cache_write": best,
        "cache_writes": {v: {k: x for k, x in m.items() if k != "times_s"} for v, m in measured.items()},
        "times_s": chosen["times_s"],
        "wall_s": time.perf_counter() - start,
        "note": note,
        **profile,
    }


def run_row(row: TrainRow | DecodeRow | LossRow, env: Mapping[str, Any], opts: Options) -> dict[str, Any]:
    """The row's result: `{"row", "kind", "title", "preset", "status": "ok", ...}`, or status
    "error" with `error` (the exception's type and first line) when it failed; `restart` says
    whether the failure may have left the device in a bad state (any failure but a row that
    does not fit or a bad option)."""
    head = {"row": row.name, "kind": row.kind, "title": row.title, "preset": row.preset}
    start = time.perf_counter()
    if opts.topology and isinstance(row, DecodeRow):
        note = f"--topology={opts.topology} compiles only; decoding is timed on the chip"
        return {**head, "status": "skipped", "note": note, "target": row.target_roofline}
    try:
        runner = {"train": run_train_row, "decode": run_decode_row, "loss": run_loss_row}[row.kind]
        out = {**head, "status": "ok", **runner(row, env, opts)}
    except Exception as e:  # one row's failure is recorded, never the end of the run
        import traceback

        if not isinstance(e, DoesNotFit):
            traceback.print_exc()
        else:
            log(row.name, str(e))
        first = (str(e).strip().splitlines() or [""])[0]
        out = {
            **head,
            "status": "error",
            "error": f"{type(e).__name__}: {first}"[:300],
            "restart": not isinstance(e, (DoesNotFit, ValueError, KeyError, TypeError)),
            "wall_s": time.perf_counter() - start,
        }
        if isinstance(row, TrainRow):
            out["target"] = row.target_mfu
            if row.speedup_over:
                out.update(speedup_over=row.speedup_over, target_speedup=row.target_speedup)
        elif isinstance(row, LossRow):
            out["target"] = row.target_gap
        else:
            out["target"] = row.target_roofline
    finally:
        free_device_memory()
    return out
