"""Optimizers and learning-rate schedules."""

from tessel.nn.optim.learning_rate import (
    CosineDecayLR,
    ExponentialDecayLR,
    InverseDecayLR,
    LearningRateSchedule,
    NaturalExpDecayLR,
    PolynomialDecayLR,
    WarmUpLR,
    cosine_decay_lr,
    exponential_decay_lr,
    inverse_decay_lr,
    natural_exp_decay_lr,
    piecewise_constant_lr,
    polynomial_decay_lr,
    warmup_lr,
)
from tessel.nn.optim.optimizer import Optimizer
from tessel.nn.optim.rules import SGD, Adam, AdamWeightDecay, Momentum

__all__ = [
    "SGD",
    "Adam",
    "AdamWeightDecay",
    "CosineDecayLR",
    "ExponentialDecayLR",
    "InverseDecayLR",
    "LearningRateSchedule",
    "Momentum",
    "NaturalExpDecayLR",
    "Optimizer",
    "PolynomialDecayLR",
    "WarmUpLR",
    "cosine_decay_lr",
    "exponential_decay_lr",
    "inverse_decay_lr",
    "natural_exp_decay_lr",
    "piecewise_constant_lr",
    "polynomial_decay_lr",
    "warmup_lr",
]
