"""Normalisation layers: LayerNorm, GroupNorm, BatchNorm1d/2d and InstanceNorm1d/2d/3d (MindSpore's names, defaults and
BatchNorm momentum: moving = momentum * moving + (1 - momentum) * batch, momentum=0.9)."""

from __future__ import annotations

from typing import Any

from tessel.common.dtype import DType
from tessel.common.tracing import compute_dtype
from tessel.core.errors import ConfigurationError
from tessel.nn.cell import Cell
from tessel.nn.layers import _positive, make_parameter, require_float
from tessel.ops import functional as F
from tessel.ops.nn_functional import check_data_format


class LayerNorm(Cell):
    """Normalise over dims from begin_norm_axis, scale by gamma and shift by beta (shaped normalized_shape)."""

    def __init__(
        self,
        normalized_shape: Any,
        begin_norm_axis: int = -1,
        begin_params_axis: int = -1,
        gamma_init: Any = "ones",
        beta_init: Any = "zeros",
        epsilon: float = 1e-7,
        dtype: Any = DType.float32,
    ):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        if not shape:
            raise ConfigurationError("LayerNorm: normalized_shape must name at least one dim")
        self.normalized_shape, self.epsilon = shape, epsilon
        self.begin_norm_axis, self.begin_params_axis = begin_norm_axis, begin_params_axis
        self.gamma = make_parameter(gamma_init, shape, dtype, "gamma")
        self.beta = make_parameter(beta_init, shape, dtype, "beta")

    def construct(self, x):
        require_float(self, x)
        from tessel.common.tracing import apply_op

        # MindSpore casts gamma and beta to the input's dtype, and a float16 input gives a float16 output; the
        # statistics are taken in float32 at least
        wide = x if x.dtype.itemsize >= 4 else F.cast(x, DType.float32)
        gamma, beta = (F.cast(F.cast(p, x.dtype), wide.dtype) for p in (self.gamma, self.beta))
        y, _, _ = apply_op(
            "LayerNorm",
            wide,
            gamma,
            beta,
            begin_norm_axis=self.begin_norm_axis,
            begin_params_axis=self.begin_params_axis,
            epsilon=self.epsilon,
        )
        return F.cast(y, x.dtype)

    def extend_repr(self) -> str:
        return f"normalized_shape={self.normalized_shape}, epsilon={self.epsilon}"


class GroupNorm(Cell):
    """Normalise each of `num_groups` channel groups of an (N, C, *) input over its channels and positions (biased
    variance, eps inside the square root), then scale by gamma and shift by beta per channel (MindSpore's)."""

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-05,
        affine: bool = True,
        gamma_init: Any = "ones",
        beta_init: Any = "zeros",
        dtype: Any = DType.float32,
    ):
        super().__init__()
        for name, value in (("num_groups", num_groups), ("num_channels", num_channels)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"GroupNorm: {name} must be an int >= 1, got {value!r}")
        if num_channels % num_groups:
            raise ConfigurationError(f"GroupNorm: num_channels {num_channels} must divide by num_groups {num_groups}")
        if not isinstance(affine, bool):
            raise ConfigurationError(f"GroupNorm: affine must be a bool, got {affine!r}")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, float(eps), affine
        self.gamma = make_parameter(gamma_init, (num_channels,), dtype, "gamma")
        self.beta = make_parameter(beta_init, (num_channels,), dtype, "beta")
        self.gamma.requires_grad = self.beta.requires_grad = affine

    def construct(self, x):
        require_float(self, x)
        shape = tuple(x.shape)
        if len(shape) < 2 or shape[1] != self.num_channels:
            raise ConfigurationError(f"GroupNorm: expects input (N, {self.num_channels}, ...), got shape {shape}")
        return F.group_norm(x, self.num_groups, self.gamma, self.beta, self.eps)

    def extend_repr(self) -> str:
        return f"num_groups={self.num_groups}, num_channels={self.num_channels}, eps={self.eps}, affine={self.affine}"


class _BatchNorm(Cell):
    _ndims: tuple[int, ...] = ()

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.9,
        affine: bool = True,
        gamma_init: Any = "ones",
        beta_init: Any = "zeros",
        moving_mean_init: Any = "zeros",
        moving_var_init: Any = "ones",
        use_batch_statistics: bool | None = None,
        data_format: str = "NCHW",
        dtype: Any = DType.float32,
    ):
        super().__init__()
        _positive(self.cls_name, num_features=num_features)
        if not 0.0 <= momentum <= 1.0:
            raise ConfigurationError(f"{self.cls_name}: momentum must be in [0, 1], got {momentum}")
        check_data_format(f"nn.{self.cls_name}", data_format)
        if use_batch_statistics is not None and not isinstance(use_batch_statistics, bool):
            raise ConfigurationError(
                f"{self.cls_name}: use_batch_statistics must be None (follow set_train), True or False, "
                f"got {use_batch_statistics!r}"
            )
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.use_batch_statistics = use_batch_statistics
        shape = (num_features,)
        # MindSpore's order and names (nn/layer/normalization.py): the moving statistics first, so get_parameters()
        # and a checkpoint list them before gamma and beta, named "mean" and "variance" (what a top-level BatchNorm's
        # names stay; a nested one's are its attribute paths, "bn.moving_mean")
        self.moving_mean = make_parameter(moving_mean_init, shape, dtype, "mean", requires_grad=False)
        self.moving_variance = make_parameter(moving_var_init, shape, dtype, "variance", requires_grad=False)
        self.gamma = make_parameter(gamma_init, shape, dtype, "gamma", requires_grad=affine)
        self.beta = make_parameter(beta_init, shape, dtype, "beta", requires_grad=affine)

    def construct(self, x):
        require_float(self, x)
        if x.ndim not in self._ndims:
            raise ConfigurationError(
                f"{self.cls_name} takes inputs of rank {' or '.join(map(str, self._ndims))} (N, C, ...), "
                f"got shape {tuple(x.shape)}"
            )
        training = self.training if self.use_batch_statistics is None else self.use_batch_statistics
        # the dtype the parameters enter the op in (to_float's, under amp), which the input must share
        dtype = compute_dtype() or self.gamma.dtype
        # MindSpore's BatchNorm takes a float16 input with float32 parameters and statistics and gives a float16
        # output: run it in the parameters' dtype
        wide = F.cast(x, dtype) if x.dtype.itemsize < dtype.itemsize else x
        y = F.batch_norm(
            wide, self.moving_mean, self.moving_variance, self.gamma, self.beta, training, 1.0 - self.momentum, self.eps
        )
        return F.cast(y, x.dtype)

    def extend_repr(self) -> str:
        return f"num_features={self.num_features}, eps={self.eps}, momentum={self.momentum}"


class BatchNorm1d(_BatchNorm):
    """Batch normalisation of (N, C) or (N, C, L) inputs over all dims but C."""

    _ndims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalisation of (N, C, H, W) inputs over N, H and W."""

    _ndims = (4,)


class _InstanceNorm(Cell):
    """Normalisation of each sample's each channel over its own spatial dims, then gamma * x + beta per channel.

    MindSpore's parameters and names: moving_mean "mean", moving_variance "variance" (requires_grad False), gamma,
    beta (requires_grad = affine). The output uses the instance's own statistics in training and in evaluation
    alike (MindSpore's InstanceNorm kernel, GPU only); tessel leaves the moving statistics at their initial values.
    """

    _ndim = 0

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
        gamma_init: Any = "ones",
        beta_init: Any = "zeros",
        dtype: Any = DType.float32,
    ):
        super().__init__()
        for name, value, kinds in (
            ("num_features", num_features, (int,)),
            ("eps", eps, (float,)),
            ("momentum", momentum, (float,)),
            ("affine", affine, (bool,)),
        ):
            if not isinstance(value, kinds) or (kinds == (int,) and isinstance(value, bool)):
                raise TypeError(
                    f"For '{self.cls_name}', the type of '{name}' must be {kinds[0].__name__}, got {value!r}."
                )
        if num_features < 1:
            raise ValueError(f"For '{self.cls_name}', the 'num_features' must be at least 1, but got {num_features}.")
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"For '{self.cls_name}', the 'momentum' must be a number in range [0, 1], got {momentum}.")
        if not 0.0 <= eps < 1.0:  # MindSpore's InstanceNorm primitive, built in __init__, checks it
            raise ValueError(f"For 'InstanceNorm', the 'epsilon' must be in range [0, 1), but got {eps}.")
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        shape = (num_features,)
        self.moving_mean = make_parameter("zeros", shape, dtype, "mean", requires_grad=False)
        self.moving_variance = make_parameter("ones", shape, dtype, "variance", requires_grad=False)
        self.gamma = make_parameter(gamma_init, shape, dtype, "gamma", requires_grad=affine)
        self.beta = make_parameter(beta_init, shape, dtype, "beta", requires_grad=affine)

    def construct(self, x):
        if x.ndim != self._ndim:
            raise ValueError(f"For '{self.cls_name}', the in_shape must have {self._ndim} dims, but got {x.ndim}.")
        dtype = x.dtype
        x = F.cast(x, self.gamma.dtype)  # a float16 input runs with the float32 parameters, as MindSpore's kernel
        axes = tuple(range(2, x.ndim))
        mean = F.mean(x, axes, keep_dims=True)
        centred = x - mean
        variance = F.mean(centred * centred, axes, keep_dims=True)
        per_channel = (1, -1) + (1,) * (x.ndim - 2)
        scale = F.reshape(self.gamma, per_channel) / F.sqrt(variance + self.eps)
        return F.cast(centred * scale + F.reshape(self.beta, per_channel), dtype)

    def extend_repr(self) -> str:
        return f"num_features={self.num_features}, eps={self.eps}, momentum={self.momentum}"


class InstanceNorm1d(_InstanceNorm):
    """Instance normalisation of (N, C, L) inputs over L."""

    _ndim = 3


class InstanceNorm2d(_InstanceNorm):
    """Instance normalisation of (N, C, H, W) inputs over H and W."""

    _ndim = 4


class InstanceNorm3d(_InstanceNorm):
    """Instance normalisation of (N, C, D, H, W) inputs over D, H and W."""

    _ndim = 5
