"""Reader-throughput and memory measurements shared by Cairn's side and Grain's (peer venv).

`deterministic_bench.py` (its reader child, in .venv) and `_grain_peer.py` (in .peer-venv)
time their iterators with `measure` and report memory with `rss_report`, so both columns
of the table come from the same code. Imports only the standard library, NumPy and psutil.
"""

from __future__ import annotations

import resource
import statistics
import threading
import time

import numpy as np


class TreeRss:
    """Samples the RSS of this process and all its children every 50 ms; `stop()` returns
    the peak of their sum in bytes (catches worker processes while they run)."""

    def __init__(self):
        import psutil

        self.proc, self.peak, self._stop = psutil.Process(), 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                procs = [self.proc] + self.proc.children(recursive=True)
                self.peak = max(self.peak, sum(p.memory_info().rss for p in procs))
            except Exception:  # a child that exited between the listing and the read
                pass

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def max_rss_mb(children: bool = False) -> float:
    """Peak RSS of this process in MiB: `VmHWM` of /proc/self/status, which starts afresh at
    `exec` (`ru_maxrss` does not: a child started by a big process would report its
    parent's size); with `children`, `ru_maxrss` of the largest waited-for child."""
    if not children:
        try:
            with open("/proc/self/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024  # kB
        except OSError:
            pass
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    return resource.getrusage(who).ru_maxrss / 1024  # KiB on Linux


def measure(it, batches: int, warmup: int, repeats: int, targets_len: int) -> dict:
    """Medians over `repeats` timed windows of `batches` batches each: batches/s, non-pad
    target tokens/s (`decoder_loss_weights > 0`) and the target-slot fill ratio (non-pad
    target tokens / (rows x targets_len)). The count is the only work done per batch."""
    rates, tokens, fills = [], [], []
    for _ in range(warmup):
        next(it)
    for _ in range(repeats):
        n_tok = rows = 0
        start = time.perf_counter()
        for _ in range(batches):
            w = next(it)["decoder_loss_weights"]
            n_tok += int(np.count_nonzero(w))
            rows += w.shape[0]
        seconds = time.perf_counter() - start
        rates.append(batches / seconds)
        tokens.append(n_tok / seconds)
        fills.append(n_tok / (rows * targets_len))
    return {
        "batches_per_s": statistics.median(rates),
        "tokens_per_s": statistics.median(tokens),
        "fill": statistics.median(fills),
        "rates": rates,
        "batches": batches,
        "repeats": repeats,
    }


def rss_report(imports_mb: float, tree_peak: int) -> dict:
    """Peak RSS figures after a measurement; call after the workers (if any) were joined."""
    return {
        "rss_imports_mb": imports_mb,
        "rss_self_mb": max_rss_mb(),
        "rss_child_max_mb": max_rss_mb(children=True),
        "rss_tree_peak_mb": tree_peak / 2**20,
    }
