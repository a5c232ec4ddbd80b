"""`mindspore.nn.dynamic_lr`: the per-step learning-rate lists, where MindSpore's scripts import them from. Defined in
tessel.nn.optim.learning_rate."""

from tessel.nn.optim.learning_rate import (
    cosine_decay_lr,
    exponential_decay_lr,
    inverse_decay_lr,
    natural_exp_decay_lr,
    piecewise_constant_lr,
    polynomial_decay_lr,
    warmup_lr,
)

__all__ = [
    "cosine_decay_lr",
    "exponential_decay_lr",
    "inverse_decay_lr",
    "natural_exp_decay_lr",
    "piecewise_constant_lr",
    "polynomial_decay_lr",
    "warmup_lr",
]
