"""`tessel.train` — MindSpore's `mindspore.train`: Model, callbacks, metrics, checkpoints and export."""

from tessel.train.callback import (
    Callback,
    CheckpointConfig,
    History,
    LambdaCallback,
    LearningRateScheduler,
    LossMonitor,
    ModelCheckpoint,
    RunContext,
    TimeMonitor,
)
from tessel.train.loss_scale_manager import DynamicLossScaleManager, FixedLossScaleManager, LossScaleManager
from tessel.train.metrics import (
    MAE,
    MSE,
    Accuracy,
    Loss,
    Metric,
    Top1CategoricalAccuracy,
    Top5CategoricalAccuracy,
    TopKCategoricalAccuracy,
    rearrange_inputs,
)
from tessel.train.model import Model
from tessel.train.progress import ProgressBar
from tessel.train.serialization import export, load_checkpoint, load_param_into_net, save_checkpoint

__all__ = [
    "MAE",
    "MSE",
    "Accuracy",
    "Callback",
    "CheckpointConfig",
    "DynamicLossScaleManager",
    "FixedLossScaleManager",
    "History",
    "LambdaCallback",
    "LearningRateScheduler",
    "Loss",
    "LossMonitor",
    "LossScaleManager",
    "Metric",
    "Model",
    "ModelCheckpoint",
    "ProgressBar",
    "RunContext",
    "TimeMonitor",
    "Top1CategoricalAccuracy",
    "Top5CategoricalAccuracy",
    "TopKCategoricalAccuracy",
    "export",
    "load_checkpoint",
    "load_param_into_net",
    "rearrange_inputs",
    "save_checkpoint",
]
