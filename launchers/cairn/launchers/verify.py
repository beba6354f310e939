"""`//launchers:verify`: compares two runs step by step and names the first divergent step.

    bazel run //launchers:verify -- --run_a=DIR --run_b=DIR [--rtol=0] [--atol=0] [--allow_config_diff]
        [--common_steps_only]

Both runs must have been trained with the fingerprint (`cairn.launchers.fingerprint`). Headers
are compared first (config hash, data fingerprint; seed, layout and versions are shown when
they differ), then steps in order: the fingerprint of the global batch the step trained on
(always bitwise: the same data whatever the host count), the train loss of each step present
in both runs, and the parameter checksum of each step checksummed in both. With `--rtol=0 --atol=0` (the default)
losses must be bitwise equal and checksums' sha256 equal; otherwise losses and the checksums'
`param_sum`/`param_abs_sum` must satisfy `|a - b| <= atol + rtol * |b|`.

A step that one run has and the other lacks (a loss, a checksum or a batch fingerprint: a metric
row lost on a kill, a run cut short) fails the comparison, with the steps named, unless
`--common_steps_only` asks to compare only the steps both runs have (a shorter run against a
longer one).

Exit status: 0 identical, 1 divergent or missing steps (or configs differ without
`--allow_config_diff`), 2 unusable input (a missing directory, no fingerprint, nothing to compare).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterable

from absl import flags

from cairn.launchers import entry
from cairn.launchers.entry import UsageError
from cairn.launchers.fingerprint import Checksum, FingerprintError, Run, header_summary, load_run

EXIT_IDENTICAL, EXIT_DIVERGENT, EXIT_UNUSABLE = 0, 1, 2
_HEADER_INFO = ("seed", "process_count", "device_count", "mesh", "jax_version", "platform")


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first difference: at `step`, `quantity` ('batch_sha256', 'loss', 'param_sha256',
    'param_sum', 'param_abs_sum') is `value_a` in run A and `value_b` in run B."""

    step: int
    quantity: str
    value_a: float | str
    value_b: float | str

    def describe(self) -> str:
        def show(v):
            return f"{v!r} ({v.hex()})" if isinstance(v, float) else str(v)

        text = (
            f"first divergent step: {self.step} ({self.quantity}): "
            f"run A {show(self.value_a)}, run B {show(self.value_b)}"
        )
        if isinstance(self.value_a, float) and isinstance(self.value_b, float):
            text += f", difference {self.value_a - self.value_b:.6g}"
        return text


@dataclasses.dataclass(frozen=True)
class Report:
    """The comparison of two runs (see `compare_runs`)."""

    run_a: str
    run_b: str
    config_differs: bool
    data_differs: bool
    header_notes: tuple  # human-readable lines about the headers
    first_divergence: Divergence | None
    last_step: int | None  # the last step compared (through the divergence, if any)
    losses_compared: int
    checksums_compared: int
    only_in_a: tuple  # (what, steps) pairs: e.g. ("losses", (11, 12))
    only_in_b: tuple
    allow_config_diff: bool = False
    batches_compared: int = 0
    common_steps_only: bool = False

    @property
    def missing_steps(self) -> bool:
        """One run lacks steps the other has, and that fails the comparison (not `common_steps_only`)."""
        return not self.common_steps_only and bool(self.only_in_a or self.only_in_b)

    @property
    def identical(self) -> bool:
        return (
            self.first_divergence is None
            and (self.allow_config_diff or not self.config_differs)
            and not self.missing_steps
            and self.compared > 0
        )

    @property
    def compared(self) -> int:
        return self.losses_compared + self.checksums_compared + self.batches_compared

    @property
    def exit_code(self) -> int:
        if (
            self.first_divergence is not None
            or (self.config_differs and not self.allow_config_diff)
            or (self.missing_steps and self.compared)
        ):
            return EXIT_DIVERGENT
        return EXIT_IDENTICAL if self.compared else EXIT_UNUSABLE

    def text(self) -> str:
        lines = [f"run A: {self.run_a}", f"run B: {self.run_b}", *self.header_notes]
        counts = (
            f"{self.losses_compared} losses, {self.checksums_compared} checksums, "
            f"{self.batches_compared} batch fingerprints compared"
        )
        if self.first_divergence is not None:
            lines.append(f"DIVERGENT: {self.first_divergence.describe()}")
            lines.append(
                f"  identical before step {self.first_divergence.step} ({counts}, "
                f"including step {self.first_divergence.step})"
            )
        elif not self.compared:
            lines.append("NOTHING TO COMPARE: the runs have no step in common with a loss or a checksum")
        else:
            scope = "in the steps both runs have, " if self.only_in_a or self.only_in_b else ""
            lines.append(f"identical {scope}through step {self.last_step} ({counts})")
            if self.config_differs and not self.allow_config_diff:
                lines.append("FAILED: the configs differ (pass --allow_config_diff to accept that)")
        for name, other, only in (("A", "B", self.only_in_a), ("B", "A", self.only_in_b)):
            for what, steps in only:
                lines.append(f"only in run {name}: {what} at steps {_ranges(steps)} (run {other} lacks them)")
        if self.missing_steps and self.compared:
            lines.append(
                "FAILED: steps are missing from one run (pass --common_steps_only to compare only the steps both have)"
            )
        return "\n".join(lines)


def _ranges(steps: Iterable[int]) -> str:
    """`[1, 2, 3, 7, 9, 10]` -> `1-3, 7, 9-10`."""
    out, steps = [], sorted(steps)
    i = 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        out.append(str(steps[i]) if i == j else f"{steps[i]}-{steps[j]}")
        i = j + 1
    return ", ".join(out)


def _equal(a: float, b: float, rtol: float, atol: float) -> bool:
    if rtol == 0 and atol == 0:
        return a.hex() == b.hex()  # bitwise (NaN equals NaN; 0.0 differs from -0.0)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= atol + rtol * abs(b)


def _checksum_divergence(a: Checksum, b: Checksum, rtol: float, atol: float) -> Divergence | None:
    if rtol == 0 and atol == 0:
        if a.param_sha256 != b.param_sha256:
            return Divergence(a.step, "param_sha256", a.param_sha256, b.param_sha256)
        return None
    for name in ("param_sum", "param_abs_sum"):
        va, vb = getattr(a, name), getattr(b, name)
        if not _equal(va, vb, rtol, atol):
            return Divergence(a.step, name, va, vb)
    return None


def _header_notes(a: Run, b: Run) -> tuple:
    notes = []
    for key, label in (("config_hash", "config hash"), ("data_fingerprint", "data fingerprint")):
        va, vb = a.header.get(key), b.header.get(key)
        if va == vb:
            notes.append(f"{label}: same ({va})")
        else:
            notes.append(f"{label}: DIFFERS: run A {va}, run B {vb}")
    for key in _HEADER_INFO:
        if a.header.get(key) != b.header.get(key):
            notes.append(f"{key} differs (informational): run A {a.header.get(key)}, run B {b.header.get(key)}")
    for name, run in (("A", a), ("B", b)):
        if run.skipped_lines:
            notes.append(f"run {name}: {run.skipped_lines} unreadable line(s) skipped")
    return tuple(notes)


def _as_run(run: Run | str | os.PathLike) -> Run:
    return run if isinstance(run, Run) else load_run(run)


def compare_runs(
    a: Run | str | os.PathLike,
    b: Run | str | os.PathLike,
    rtol: float = 0.0,
    atol: float = 0.0,
    allow_config_diff: bool = False,
    common_steps_only: bool = False,
) -> Report:
    """Compares run `a` with run `b` (Runs or model_dirs; a missing one raises `FingerprintError`).
    Steps only one run has fail the comparison unless `common_steps_only`.

    Steps are walked in order; at each step the loss (computed from the previous step's params)
    is compared before the checksum (the params after the step). The walk stops at the first
    difference."""
    if rtol < 0 or atol < 0:
        raise ValueError(f"rtol and atol must be >= 0, got rtol={rtol}, atol={atol}")
    a, b = _as_run(a), _as_run(b)
    config_differs = a.header.get("config_hash") != b.header.get("config_hash")
    data_differs = a.header.get("data_fingerprint") != b.header.get("data_fingerprint")
    loss_steps = set(a.losses) & set(b.losses)
    check_steps = set(a.checksums) & set(b.checksums)
    batch_steps = set(a.batches) & set(b.batches)
    divergence, last, n_losses, n_checks, n_batches = None, None, 0, 0, 0
    for step in sorted(loss_steps | check_steps | batch_steps):
        last = step
        if step in batch_steps:
            n_batches += 1
            if a.batches[step] != b.batches[step]:
                divergence = Divergence(step, "batch_sha256", a.batches[step], b.batches[step])
                break
        if step in loss_steps:
            n_losses += 1
            if not _equal(a.losses[step], b.losses[step], rtol, atol):
                divergence = Divergence(step, "loss", a.losses[step], b.losses[step])
                break
        if step in check_steps:
            n_checks += 1
            divergence = _checksum_divergence(a.checksums[step], b.checksums[step], rtol, atol)
            if divergence is not None:
                break

    def only(x: Run, y: Run) -> tuple:
        out = []
        for what, xs, ys in (
            ("losses", x.losses, y.losses),
            ("checksums", x.checksums, y.checksums),
            ("batch fingerprints", x.batches, y.batches),
        ):
            extra = sorted(set(xs) - set(ys))
            if extra:
                out.append((what, tuple(extra)))
        return tuple(out)

    return Report(
        a.model_dir,
        b.model_dir,
        config_differs,
        data_differs,
        _header_notes(a, b),
        divergence,
        last,
        n_losses,
        n_checks,
        only(a, b),
        only(b, a),
        allow_config_diff,
        n_batches,
        common_steps_only,
    )


RUN_A = flags.DEFINE_string("run_a", None, "model_dir of the first run")
RUN_B = flags.DEFINE_string("run_b", None, "model_dir of the second run")
RTOL = flags.DEFINE_float("rtol", 0.0, "relative tolerance (0 with atol 0: bitwise)")
ATOL = flags.DEFINE_float("atol", 0.0, "absolute tolerance")
ALLOW_CONFIG_DIFF = flags.DEFINE_bool("allow_config_diff", False, "a different config hash is not a failure")
COMMON_STEPS_ONLY = flags.DEFINE_bool(
    "common_steps_only", False, "compare only the steps both runs have (steps one run lacks are not a failure)"
)


def verify_runs(
    run_a: str,
    run_b: str,
    rtol: float = 0.0,
    atol: float = 0.0,
    allow_config_diff: bool = False,
    out: Callable[[str], None] = print,
    common_steps_only: bool = False,
) -> int:
    """Compares the runs at `run_a` and `run_b` (paths resolved as a user typed them), prints
    the report, and returns the exit status. Raises `UsageError` for a negative tolerance and
    `FingerprintError` for unusable input."""
    if rtol < 0 or atol < 0:
        raise UsageError(f"--rtol and --atol must be >= 0 (got {rtol}, {atol})")
    a, b = load_run(entry.user_path(run_a)), load_run(entry.user_path(run_b))
    report = compare_runs(a, b, rtol, atol, allow_config_diff, common_steps_only)
    for name, run in (("A", a), ("B", b)):
        out(
            f"run {name} header: {header_summary(run)}; {len(run.losses)} losses, {len(run.checksums)} checksums, "
            f"{len(run.batches)} batch fingerprints"
        )
    out(report.text())
    return report.exit_code


def run() -> None:
    """The program (exit status 0 identical, 1 divergent or missing steps, 2 unusable input)."""
    flags.mark_flags_as_required(["run_a", "run_b"])
    entry.run(
        lambda: verify_runs(
            str(RUN_A.value),
            str(RUN_B.value),
            RTOL.value,
            ATOL.value,
            ALLOW_CONFIG_DIFF.value,
            common_steps_only=COMMON_STEPS_ONLY.value,
        ),
        expected=(FingerprintError,),
        prefix="verify",
    )


if __name__ == "__main__":
    entry.main(run)
