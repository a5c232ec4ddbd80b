"""`tessel.nn` — MindSpore's `mindspore.nn`: Cell, layers, losses, optimizers, schedules and training wrappers.

>>> from tessel import nn
>>> net = nn.SequentialCell(nn.Flatten(), nn.Dense(784, 512), nn.ReLU(), nn.Dense(512, 10))
>>> optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
"""

from tessel.common.mindspore_names import NN
from tessel.common.parameter import Parameter, ParameterTuple
from tessel.common.support import unsupported_names
from tessel.nn import dynamic_lr, learning_rate_schedule, utils
from tessel.nn.activation import CELU, GLU, OneHot, PReLU, Softmax2d, Threshold
from tessel.nn.cell import Cell
from tessel.nn.container import CellDict, CellList, SequentialCell
from tessel.nn.conv import AvgPool2d, Conv1d, Conv1dTranspose, Conv2d, Conv2dTranspose, MaxPool2d
from tessel.nn.layers import (
    ELU,
    GELU,
    Dense,
    Dropout,
    Dropout1d,
    Dropout2d,
    Embedding,
    Flatten,
    Hardtanh,
    HShrink,
    HSigmoid,
    HSwish,
    Identity,
    LeakyReLU,
    LogSigmoid,
    LogSoftmax,
    Mish,
    ReLU,
    ReLU6,
    Sigmoid,
    SiLU,
    Softmax,
    Softmin,
    Softplus,
    SoftShrink,
    Softsign,
    Tanh,
    Tanhshrink,
    Unflatten,
    get_activation,
)
from tessel.nn.loss import (
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    LossBase,
    MAELoss,
    MSELoss,
    NLLLoss,
    SmoothL1Loss,
    SoftmaxCrossEntropyWithLogits,
)
from tessel.nn.loss_more import (
    CosineEmbeddingLoss,
    DiceLoss,
    FocalLoss,
    GaussianNLLLoss,
    HingeEmbeddingLoss,
    MarginRankingLoss,
    MultiClassDiceLoss,
    MultiLabelSoftMarginLoss,
    MultiMarginLoss,
    PoissonNLLLoss,
    RMSELoss,
    SoftMarginLoss,
    TripletMarginLoss,
)
from tessel.nn.math_cells import ClipByNorm, MatMul, Moments, Norm, Range, Roll, Tril, Triu
from tessel.nn.norm import (
    BatchNorm1d,
    BatchNorm2d,
    GroupNorm,
    InstanceNorm1d,
    InstanceNorm2d,
    InstanceNorm3d,
    LayerNorm,
)
from tessel.nn.optim import *  # noqa: F403 - optimizers and learning-rate schedules are nn.<name>
from tessel.nn.optim import __all__ as _optim_names
from tessel.nn.padding import (
    ChannelShuffle,
    ConstantPad1d,
    ConstantPad2d,
    ConstantPad3d,
    Pad,
    PixelShuffle,
    PixelUnshuffle,
    ReflectionPad1d,
    ReflectionPad2d,
    ReflectionPad3d,
    ReplicationPad1d,
    ReplicationPad2d,
    ReplicationPad3d,
    ZeroPad2d,
)
from tessel.nn.pooling import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveMaxPool1d,
    AdaptiveMaxPool2d,
    AvgPool1d,
    MaxPool1d,
)
from tessel.nn.rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from tessel.nn.transformer import (
    MultiheadAttention,
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from tessel.nn.wrap import (
    DistributedGradReducer,
    DynamicLossScaleUpdateCell,
    FixedLossScaleUpdateCell,
    ForwardValueAndGrad,
    GradAccumulation,
    GradAccumulationCell,
    MicroBatchInterleaved,
    PipelineCell,
    PipelineGradReducer,
    TrainOneStepCell,
    TrainOneStepWithLossScaleCell,
    WithEvalCell,
    WithGradCell,
    WithLossCell,
)

_METRICS = (
    "Accuracy",
    "ConfusionMatrix",
    "F1",
    "Fbeta",
    "Precision",
    "Recall",
    "Loss",
    "Metric",
    "MAE",
    "MSE",
    "Top1CategoricalAccuracy",
    "Top5CategoricalAccuracy",
    "TopKCategoricalAccuracy",
)


_missing = unsupported_names(
    "mindspore.nn", NN, "tessel has no such layer, loss, optimizer or wrapper yet (README: the API table lists them)"
)


# MindSpore 2.7's nn names that are its mint.nn classes themselves (nn.Linear is mint.nn.Linear, nn.DropoutExt is
# mint.nn.Dropout, ...): the same classes here, looked up when asked for (mint.nn imports this module).
_MINT_CLASSES = {
    "Linear": "Linear",
    "DropoutExt": "Dropout",
    "EmbeddingExt": "Embedding",
    "LayerNormExt": "LayerNorm",
    "MaxPool2dExt": "MaxPool2d",
    "AvgPool2dExt": "AvgPool2d",
    "PReLUExt": "PReLU",
    "L1LossExt": "L1Loss",
    "LogSoftmaxExt": "LogSoftmax",
}


def __getattr__(name: str):
    # MindSpore 1.x kept metrics in nn; they live in tessel.train.metrics.
    if name in _METRICS:
        from tessel.train import metrics

        return getattr(metrics, name)
    if name in _MINT_CLASSES:
        from tessel.mint import nn as mint_nn

        return getattr(mint_nn, _MINT_CLASSES[name])
    return _missing(name)


__all__ = [
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AvgPool1d",
    "Conv1d",
    "Conv1dTranspose",
    "Conv2dTranspose",
    "Dropout1d",
    "Dropout2d",
    "MaxPool1d",
    "Unflatten",
    "GroupNorm",
    "Softplus",
    "Mish",
    "HSwish",
    "HSigmoid",
    "ELU",
    "GELU",
    "AvgPool2d",
    "GradAccumulation",
    "GradAccumulationCell",
    "BCELoss",
    "BCEWithLogitsLoss",
    "HuberLoss",
    "KLDivLoss",
    "SmoothL1Loss",
    "BatchNorm1d",
    "BatchNorm2d",
    "Cell",
    "CellList",
    "Conv2d",
    "CrossEntropyLoss",
    "Dense",
    "DistributedGradReducer",
    "DynamicLossScaleUpdateCell",
    "FixedLossScaleUpdateCell",
    "Dropout",
    "Embedding",
    "Flatten",
    "Identity",
    "L1Loss",
    "LayerNorm",
    "LeakyReLU",
    "LogSoftmax",
    "LossBase",
    "MAELoss",
    "MSELoss",
    "MaxPool2d",
    "MultiheadAttention",
    "Transformer",
    "TransformerDecoder",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerEncoderLayer",
    "MicroBatchInterleaved",
    "PipelineCell",
    "PipelineGradReducer",
    "NLLLoss",
    "Parameter",
    "ParameterTuple",
    "ReLU",
    "ReLU6",
    "SequentialCell",
    "SiLU",
    "Sigmoid",
    "Softmax",
    "SoftmaxCrossEntropyWithLogits",
    "Tanh",
    "ForwardValueAndGrad",
    "TrainOneStepCell",
    "TrainOneStepWithLossScaleCell",
    "WithEvalCell",
    "WithGradCell",
    "WithLossCell",
    "get_activation",
    "GRU",
    "GRUCell",
    "LSTM",
    "LSTMCell",
    "RNN",
    "RNNCell",
    "Hardtanh",
    "HShrink",
    "LogSigmoid",
    "Softmin",
    "SoftShrink",
    "Softsign",
    "Tanhshrink",
    "CELU",
    "GLU",
    "OneHot",
    "PReLU",
    "Softmax2d",
    "Threshold",
    "CellDict",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "ConstantPad1d",
    "ConstantPad2d",
    "ConstantPad3d",
    "Pad",
    "PixelShuffle",
    "PixelUnshuffle",
    "ReflectionPad1d",
    "ReflectionPad2d",
    "ReplicationPad1d",
    "ReplicationPad2d",
    "ZeroPad2d",
    "CosineEmbeddingLoss",
    "DiceLoss",
    "FocalLoss",
    "GaussianNLLLoss",
    "HingeEmbeddingLoss",
    "MarginRankingLoss",
    "MultiClassDiceLoss",
    "MultiLabelSoftMarginLoss",
    "MultiMarginLoss",
    "PoissonNLLLoss",
    "RMSELoss",
    "SoftMarginLoss",
    "TripletMarginLoss",
    "ClipByNorm",
    "MatMul",
    "Moments",
    "Norm",
    "Range",
    "Roll",
    "Tril",
    "Triu",
    "ChannelShuffle",
    "InstanceNorm3d",
    "ReflectionPad3d",
    "ReplicationPad3d",
    "utils",
    "dynamic_lr",
    "learning_rate_schedule",
    *_optim_names,
]
