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
from tessel.nn.optim.rules import SGD, Adadelta, Adagrad, Adam, AdamWeightDecay, Momentum, ProximalAdagrad, RMSProp

__all__ = [
    "SGD",
    "Adadelta",
    "Adagrad",
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
    "ProximalAdagrad",
    "RMSProp",
    "WarmUpLR",
    "cosine_decay_lr",
    "exponential_decay_lr",
    "inverse_decay_lr",
    "natural_exp_decay_lr",
    "piecewise_constant_lr",
    "polynomial_decay_lr",
    "warmup_lr",
]
