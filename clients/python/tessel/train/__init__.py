"""`tessel.train` — MindSpore's `mindspore.train`: Model, callbacks, metrics, checkpoints and export."""

import importlib

from tessel.common.mindspore_names import TRAIN
from tessel.common.support import unsupported_names
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
    F1,
    MAE,
    MSE,
    Accuracy,
    ConfusionMatrix,
    Fbeta,
    Loss,
    Metric,
    Precision,
    Recall,
    Top1CategoricalAccuracy,
    Top5CategoricalAccuracy,
    TopKCategoricalAccuracy,
    rearrange_inputs,
)
from tessel.train.model import Model
from tessel.train.plateau import EarlyStopping, ReduceLROnPlateau
from tessel.train.progress import ProgressBar
from tessel.train.serialization import export, load_checkpoint, load_param_into_net, save_checkpoint

__all__ = [
    "F1",
    "MAE",
    "MSE",
    "Accuracy",
    "Callback",
    "CheckpointConfig",
    "ConfusionMatrix",
    "DynamicLossScaleManager",
    "EarlyStopping",
    "Fbeta",
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
    "Precision",
    "ProgressBar",
    "Recall",
    "ReduceLROnPlateau",
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

# MindSpore re-exports these in mindspore.train; tessel keeps them where their work is done
_ELSEWHERE = {
    "build_train_network": "tessel.amp",
    "build_searched_strategy": "tessel.parallel",
    "load_distributed_checkpoint": "tessel.parallel",
    "merge_sliced_parameter": "tessel.parallel",
    "restore_group_info_list": "tessel.parallel",
}
_missing = unsupported_names("mindspore.train", TRAIN, "tessel does not map this name yet (README: the API table)")


def __getattr__(name: str):
    if name in _ELSEWHERE:
        return getattr(importlib.import_module(_ELSEWHERE[name]), name)
    return _missing(name)
