"""Core SDK types: dtypes, Tensor, Parameter, initializers and the global seed."""

from tessel.common import dtype, initializer  # initializer: the module, as mindspore.common.initializer
from tessel.common.dtype import *  # noqa: F403 - tessel.float32 etc.
from tessel.common.parameter import Parameter, ParameterTuple
from tessel.common.seed import get_seed, set_seed
from tessel.common.tensor import Tensor

__all__ = ["Parameter", "ParameterTuple", "Tensor", "dtype", "get_seed", "initializer", "set_seed"]
