"""`mindspore.nn.learning_rate_schedule`: the schedule cells, where MindSpore's scripts import them from (a schedule of
one's own subclasses `learning_rate_schedule.LearningRateSchedule`). Defined in tessel.nn.optim.learning_rate."""

from tessel.nn.optim.learning_rate import (
    CosineDecayLR,
    ExponentialDecayLR,
    InverseDecayLR,
    LearningRateSchedule,
    NaturalExpDecayLR,
    PolynomialDecayLR,
    WarmUpLR,
)

__all__ = [
    "CosineDecayLR",
    "ExponentialDecayLR",
    "InverseDecayLR",
    "LearningRateSchedule",
    "NaturalExpDecayLR",
    "PolynomialDecayLR",
    "WarmUpLR",
]
