"""A training run in its own process, for the SIGTERM, lock and reproducibility tests.

usage: train_worker.py MODEL_DIR NUM_STEPS [--checkpoint_every N] [--sleep S] [--out params.npz]
Prints READY after setup; exits 0 at the end or after SIGTERM (the loop saves first).
"""

import argparse
import logging
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np
from tiny_model import CountingIterator, TinyModel

from cairn.partitioning import Partitioner, create_mesh, standard_logical_axis_rules
from cairn.trainer import OptimizerConfig, Trainer, TrainerConfig, factor_schedule


class SlowIterator(CountingIterator):
    def __init__(self, sleep: float):
        super().__init__(seed=1)
        self.sleep = sleep

    def __next__(self):
        if self.position == 1:
            print("READY", flush=True)
        time.sleep(self.sleep)
        return super().__next__()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("num_steps", type=int)
    ap.add_argument("--checkpoint_every", type=int, default=5)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    partitioner = Partitioner(create_mesh({"data": 4, "model": 2}), standard_logical_axis_rules())
    cfg = TrainerConfig(
        model_dir=args.model_dir,
        num_train_steps=args.num_steps,
        seed=5,
        log_every=1,
        checkpoint_every=args.checkpoint_every,
        tensorboard=False,
    )
    trainer = Trainer(
        TinyModel(dropout=0.1),
        OptimizerConfig(),
        factor_schedule(base_learning_rate=1.0, warmup_steps=5),
        partitioner,
        cfg,
        experiment_config={"worker": True},
    )
    result = trainer.train(SlowIterator(args.sleep))
    if args.out:
        flat = {
            jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(result.state.params)
        }
        np.savez(args.out, **flat)
    print(f"DONE step={result.step} preempted={result.preempted}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
