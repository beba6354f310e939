"""The loop's running figures: `PendingMetrics` (step metrics still on the device, checked for
NaN/Inf one step late), `Rates` (train time, tokens and sequences, for the rates and MFU) and
`StepMetrics` (one step's metrics for the step hooks, fetched only when read)."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax

from cairn.trainer.checkpoints import Checkpointer
from cairn.trainer.faults import NonFiniteLossError
from cairn.trainer.mfu import mfu as compute_mfu
from cairn.trainer.model_protocol import sequences_in_batch, tokens_in_batch

log = logging.getLogger("cairn.trainer")


class PendingMetrics:
    """Step metrics not yet fetched from the device. The previous step's are checked once the
    next step is dispatched (one step of pipelining), all of them at log steps and before saves.
    A NaN/Inf loss or gradient norm raises `NonFiniteLossError` after the saves in flight (which
    hold earlier, good states) are done and the steps before it are handed to `record`."""

    def __init__(self, ckpt: Checkpointer, model_dir: str, record: Callable[[list], None]):
        self.ckpt, self.model_dir, self.record = ckpt, model_dir, record
        self.items: list[tuple[int, Any]] = []  # (step, metrics on the device)
        self.latest: Mapping[str, Any] = {}  # the last checked step's metrics, on the host
        self.fetched_through = 0  # the last step whose metrics were fetched (so computed)

    def add(self, step: int, metrics: Any) -> None:
        self.items.append((step, metrics))

    def check_latest(self) -> None:
        """Checks the latest step added (called before adding the next one)."""
        fetched = _fetch(self.items[-1:])
        self._check(fetched)
        if fetched:
            self.latest = fetched[-1][1]
            self.fetched_through = fetched[-1][0]

    def check_all(self) -> None:
        fetched = _fetch(self.items)
        self._check(fetched)
        if fetched:
            self.fetched_through = fetched[-1][0]

    def take(self) -> list[tuple[int, Mapping[str, Any]]]:
        """Fetches, checks and forgets every pending step's metrics; returns them."""
        fetched = _fetch(self.items)
        self._check(fetched)
        self.items.clear()
        return fetched

    def salvage(self) -> None:
        """On the way out after an error: hands the finite steps still pending to `record`, in
        order up to the first whose fetch fails (the step a collective failed in)."""
        fetched = []
        for item in self.items:
            try:
                fetched.extend(_fetch([item]))
            except Exception as e:  # the device or a collective failed: nothing later to save
                log.debug("pending metrics of step %d and later lost after an error: %s", item[0], e)
                break
        self.items.clear()
        self.record(_finite_prefix(fetched))

    def take_ready(self) -> list[tuple[int, Mapping[str, Any]]]:
        """Fetches and forgets the pending steps, in order, whose metrics are computed (fetched
        once already, or ready: never blocks on the device), up to the first NaN/Inf; for a
        thread other than the loop's."""
        ready = []
        for step, metrics in list(self.items):
            if step > self.fetched_through and not all(_ready(x) for x in jax.tree.leaves(metrics)):
                break
            ready.append((step, metrics))
        fetched = _finite_prefix(_fetch(ready))
        del self.items[: len(fetched)]
        return fetched

    def _check(self, fetched: list[tuple[int, Mapping[str, Any]]]) -> None:
        for step, metrics in fetched:
            name = _non_finite(metrics)
            if name:
                value = float(metrics[name])
                good = [(s, m) for s, m in _fetch(self.items) if s < step]
                self.items.clear()
                self.record(good)  # the rows before the NaN, kept
                self.ckpt.wait()  # a save in flight holds an earlier, good state
                raise NonFiniteLossError(step, value, name, self.ckpt.latest_step(), self.model_dir)


def _ready(leaf: Any) -> bool:
    """A device array whose computation has finished (a host value always is)."""
    return bool(leaf.is_ready()) if isinstance(leaf, jax.Array) else True  # type: ignore[attr-defined]


def _finite_prefix(fetched: list[tuple[int, Mapping[str, Any]]]) -> list[tuple[int, Mapping[str, Any]]]:
    """The steps before the first with a NaN/Inf loss or gradient norm."""
    bad = next((i for i, (_, m) in enumerate(fetched) if _non_finite(m)), len(fetched))
    return fetched[:bad]


def _non_finite(metrics: Mapping[str, Any]) -> str | None:
    """The first of loss and grad_norm that is NaN/Inf, or None."""
    return next((name for name in ("loss", "grad_norm") if not math.isfinite(float(metrics[name]))), None)


def _fetch(items: list[tuple[int, Any]]) -> list[tuple[int, Mapping[str, Any]]]:
    return [(step, jax.device_get(metrics)) for step, metrics in items]


class Rates:
    """Steps, tokens and sequences trained since the last `restart`, over the train time: the
    first step of a `train` call (compilation) is not counted, nor time spent `paused()`
    (evaluation, step hooks)."""

    def __init__(self, flops_per_token: float | None, peak: float | None):
        self.flops_per_token, self.peak = flops_per_token, peak
        self.restart()

    def restart(self) -> None:
        self.start, self.steps, self.tokens, self.sequences = time.perf_counter(), 0, 0, 0

    def count(self, global_batch: Mapping[str, Any]) -> None:
        self.steps += 1
        self.tokens += tokens_in_batch(global_batch)
        self.sequences += sequences_in_batch(global_batch)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent inside is not train time."""
        start = time.perf_counter()
        yield
        self.start += time.perf_counter() - start

    def timing(self) -> dict:
        """`step_time_s`, `steps_per_second`, `tokens_per_second`, `sequences_per_second` and `mfu`
        (with FLOPs and a peak); empty before any counted step."""
        elapsed = time.perf_counter() - self.start
        if not (self.steps and elapsed > 0):
            return {}
        timing = {
            "step_time_s": elapsed / self.steps,
            "steps_per_second": self.steps / elapsed,
            "tokens_per_second": self.tokens / elapsed,
            "sequences_per_second": self.sequences / elapsed,
        }
        if self.flops_per_token and self.peak:
            timing["mfu"] = compute_mfu(self.flops_per_token, self.tokens / elapsed, self.peak)
        return timing


class StepMetrics(Mapping[str, float]):
    """A step's metrics as `{name: float}`, fetched from the device on first use."""

    def __init__(self, device_metrics: Any):
        self._device = device_metrics
        self._host: dict[str, float] | None = None

    def _values(self) -> dict[str, float]:
        if self._host is None:
            fetched = jax.device_get(self._device) if self._device is not None else {}
            self._host = {k: float(v) for k, v in fetched.items()}
        return self._host

    def __getitem__(self, name: str) -> float:
        return self._values()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values())

    def __len__(self) -> int:
        return len(self._values())
