"""cairn.trainer: Train state, optimizers, schedules, the training loop and checkpoints.

TensorFlow is imported only when TensorBoard files are written.
"""

__version__ = "0.1.0"

from cairn.trainer.adafactor_axes import STANDARD_FACTOR_RULES, adafactor_axes, logical_factor_map
from cairn.trainer.callbacks import evaluator_callback
from cairn.trainer.checkpoints import (
    AllCheckpointsCorruptError,
    CheckpointConfig,
    Checkpointer,
    CorruptCheckpointError,
    NoCheckpointError,
    abstract_like,
    restore_opt_state,
    restore_params,
    stored_params,
)
from cairn.trainer.data_state import TfDataIterator
from cairn.trainer.faults import DiskFullError, NonFiniteLossError, StorageWriteError
from cairn.trainer.lock import ModelDirLock, ModelDirLockedError
from cairn.trainer.memory_plan import MemoryPlan, StepDoesNotFitError, StepMemory, device_memory_limit, plan_memory
from cairn.trainer.mfu import (
    PEAK_BF16_TFLOPS,
    cpu_matmul_peak_flops,
    mfu,
    peak_flops,
    published_peak_flops,
)
from cairn.trainer.model_protocol import TrainableModel, init_params, tokens_in_batch
from cairn.trainer.optimizers import OptimizerConfig, adafactor_t5, make_optimizer
from cairn.trainer.param_groups import DEFAULT_NO_DECAY, ParamGroup
from cairn.trainer.param_offload import params_on_device
from cairn.trainer.schedules import cosine_schedule, factor_schedule, linear_schedule, linear_warmup
from cairn.trainer.train_state import TrainState
from cairn.trainer.train_step import dropout_key, make_train_step, opt_state_specs, state_shardings
from cairn.trainer.trainer import Trainer, TrainerConfig, TrainResult

__all__ = [
    "AllCheckpointsCorruptError",
    "CheckpointConfig",
    "Checkpointer",
    "CorruptCheckpointError",
    "DEFAULT_NO_DECAY",
    "DiskFullError",
    "MemoryPlan",
    "ModelDirLock",
    "ModelDirLockedError",
    "NoCheckpointError",
    "NonFiniteLossError",
    "OptimizerConfig",
    "ParamGroup",
    "PEAK_BF16_TFLOPS",
    "STANDARD_FACTOR_RULES",
    "StepDoesNotFitError",
    "StepMemory",
    "StorageWriteError",
    "TrainResult",
    "TfDataIterator",
    "TrainState",
    "TrainableModel",
    "Trainer",
    "TrainerConfig",
    "abstract_like",
    "adafactor_axes",
    "adafactor_t5",
    "cosine_schedule",
    "cpu_matmul_peak_flops",
    "device_memory_limit",
    "dropout_key",
    "evaluator_callback",
    "factor_schedule",
    "init_params",
    "linear_schedule",
    "linear_warmup",
    "logical_factor_map",
    "make_optimizer",
    "make_train_step",
    "mfu",
    "opt_state_specs",
    "params_on_device",
    "peak_flops",
    "plan_memory",
    "published_peak_flops",
    "restore_opt_state",
    "restore_params",
    "stored_params",
    "state_shardings",
    "tokens_in_batch",
]
