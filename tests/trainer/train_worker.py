"""A training run in its own process, for the SIGTERM, lock and reproducibility tests.

usage: train_worker.py MODEL_DIR NUM_STEPS [--checkpoint_every N] [--sleep S] [--out params.npz]
                       [--wait_for_sigterm]
Prints READY when it reads the batch of its second step (the first step, compiled, is done);
with --wait_for_sigterm it then waits for SIGTERM before handing that batch over, so the loop
stops (saving) right after that step. Exits 0 at the end or after SIGTERM (the loop saves first).
`trainer(...)` and `Batches` are also imported by the tests, for the same run in their process.
"""

import argparse
import logging
import os
import signal
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np
from tiny_model import CountingIterator, TinyModel

from cairn.partitioning import Partitioner, create_mesh, standard_logical_axis_rules
from cairn.trainer import OptimizerConfig, Trainer, TrainerConfig, factor_schedule

SIGTERM_WAIT_S = 600  # --wait_for_sigterm gives up (exit 3) after this long


class Batches(CountingIterator):
    """The run's data (seed 1), `sleep` seconds per batch; READY on this process's third read
    (the setup's peek, step one, then the batch of step two)."""

    def __init__(self, sleep: float = 0.0, wait_for_sigterm: bool = False):
        super().__init__(seed=1)
        self.sleep, self.wait_for_sigterm, self.reads = sleep, wait_for_sigterm, 0

    def __next__(self):
        self.reads += 1
        if self.reads == 3:
            if self.wait_for_sigterm:
                self._wait_for_sigterm()
            else:
                print("READY", flush=True)
        time.sleep(self.sleep)
        return super().__next__()

    def _wait_for_sigterm(self):
        """Chains onto the trainer's SIGTERM handler (installed by `train`), says READY, and
        returns once SIGTERM has arrived: the trainer's flag is set before this batch's step."""
        got = []
        previous = signal.getsignal(signal.SIGTERM)

        def handler(signum, frame):
            got.append(signum)
            if callable(previous):
                previous(signum, frame)

        signal.signal(signal.SIGTERM, handler)
        print("READY", flush=True)
        deadline = time.monotonic() + SIGTERM_WAIT_S
        while not got:
            if time.monotonic() > deadline:
                print(f"no SIGTERM within {SIGTERM_WAIT_S}s", flush=True)
                sys.exit(3)
            time.sleep(0.01)


def trainer(model_dir, num_steps: int, checkpoint_every: int = 5) -> Trainer:
    partitioner = Partitioner(create_mesh({"data": 4, "model": 2}), standard_logical_axis_rules())
    cfg = TrainerConfig(
        model_dir=str(model_dir),
        num_train_steps=num_steps,
        seed=5,
        log_every=1,
        checkpoint_every=checkpoint_every,
        tensorboard=False,
    )
    return Trainer(
        TinyModel(dropout=0.1),
        OptimizerConfig(),
        factor_schedule(base_learning_rate=1.0, warmup_steps=5),
        partitioner,
        cfg,
        experiment_config={"worker": True},
    )


def flat_params(params) -> dict:
    """{path: numpy array} of a params tree (as --out saves it)."""
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(params)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("num_steps", type=int)
    ap.add_argument("--checkpoint_every", type=int, default=5)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--out", default="")
    ap.add_argument("--wait_for_sigterm", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    run = trainer(args.model_dir, args.num_steps, args.checkpoint_every)
    result = run.train(Batches(args.sleep, args.wait_for_sigterm))
    if args.out:
        np.savez(args.out, **flat_params(result.state.params))
    print(f"DONE step={result.step} preempted={result.preempted}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
