"""mint's inverse trigonometric and hyperbolic functions, composed from `tessel.ops` (tessel has no Atan op).

atan is Cephes' atanf: the argument reduced to [-tan(pi/8), tan(pi/8)] and a degree-9 odd polynomial, within two
float32 ulps of the true value; atan2, asin and acos follow from it with the ratio whose magnitude is at most 1, and
1 - x^2 as (1 - x)(1 + x). The inverse hyperbolics use log1p, so small arguments keep their digits. Each branch
reads a guarded argument, so the branches select() drops give no NaN gradients. Integer and bool inputs give
float32.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tessel.common.tensor import Tensor
from tessel.mint._math import _float
from tessel.ops import composed as C
from tessel.ops import functional as F

_TAN_3PI_8 = 2.414213562373095
_TAN_PI_8 = 0.4142135623730950
_LARGE = 2.0**28  # beyond it 1 + x^2 is x^2 in float32 (and x^2 may overflow): asinh(x) and acosh(x) are ln(2x)


def _guard(condition: Any, x: Tensor, safe: float) -> Tensor:
    """x where condition holds, `safe` elsewhere (so an unused branch cannot divide by zero)."""
    return F.select(condition, x, F.zeros_like(x) + safe)


def _atan_positive(x: Tensor) -> Tensor:
    """atan(x) for x >= 0."""
    big = F.greater(x, _TAN_3PI_8)
    middle = F.logical_and(F.greater(x, _TAN_PI_8), F.logical_not(big))
    reduced = F.select(
        big,
        -1.0 / _guard(big, x, 1.0),
        F.select(middle, (x - 1.0) / (_guard(middle, x, 1.0) + 1.0), x),
    )
    zero = F.zeros_like(x)
    base = F.select(big, zero + math.pi / 2, F.select(middle, zero + math.pi / 4, zero))
    z = reduced * reduced
    poly = (((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1) * z
    return base + (poly * reduced + reduced)


def atan(input: Any) -> Tensor:
    """The arc tangent, in (-pi/2, pi/2)."""
    x = _float(input)
    negative = F.less(x, 0.0)
    magnitude = _atan_positive(F.select(negative, -x, x))  # not abs(x): its slope at 0 is 0
    return F.select(negative, -magnitude, magnitude)


def atan2(input: Any, other: Any) -> Tensor:
    """The angle of the point (other, input) in (-pi, pi]: atan(input / other) in the right quadrant; atan2(0, 0)
    is 0 (or +-pi for -0 and other < 0, as in C)."""
    y, x = (_float(v if isinstance(v, Tensor) else C._constant(np.float32(v))) for v in (input, other))
    shape = np.broadcast_shapes(tuple(y.shape), tuple(x.shape))
    y, x = F.broadcast_to(y, shape), F.broadcast_to(x, shape)  # (not y + 0 * x: -0 + 0 is +0, and -0 says -pi)
    steep = F.greater(F.abs(y), F.abs(x))
    flat = F.logical_and(F.logical_not(steep), F.not_equal(x, 0.0))
    flat_ratio = _guard(flat, y, 0.0) / _guard(flat, x, 1.0)
    steep_ratio = _guard(steep, x, 0.0) / _guard(steep, y, 1.0)
    # |y| > |x|: pi/2 - atan(x / y) with y's sign; otherwise atan(y / x), moved by pi when x < 0
    upright = F.select(F.less(y, 0.0), -math.pi / 2 - atan(steep_ratio), math.pi / 2 - atan(steep_ratio))
    level = atan(flat_ratio)
    behind = F.logical_or(F.less(x, 0.0), F.logical_and(F.equal(x, 0.0), F.less(F.ones_like(x) / x, 0.0)))
    shift = F.select(F.logical_or(F.less(y, 0.0), F.less(F.ones_like(y) / y, 0.0)), -math.pi, math.pi)
    level = F.select(behind, level + shift, level)
    return F.select(steep, upright, level)


def asin(input: Any) -> Tensor:
    """The arc sine, in [-pi/2, pi/2] (nan outside [-1, 1])."""
    x = _float(input)
    return atan2(x, F.sqrt((1.0 - x) * (1.0 + x)))


def acos(input: Any) -> Tensor:
    """The arc cosine, in [0, pi] (nan outside [-1, 1])."""
    x = _float(input)
    return atan2(F.sqrt((1.0 - x) * (1.0 + x)), x)


def _asinh_positive(x: Tensor) -> Tensor:
    """asinh(x) for x >= 0: log1p(x + x^2 / (1 + sqrt(1 + x^2))), ln(2x) for huge x."""
    huge = F.greater(x, _LARGE)
    moderate = _guard(F.logical_not(huge), x, 0.0)
    near = C.log1p(moderate + moderate * moderate / (1.0 + F.sqrt(1.0 + moderate * moderate)))
    return F.select(huge, F.log(_guard(huge, x, 1.0)) + math.log(2.0), near)


def asinh(input: Any) -> Tensor:
    """The inverse hyperbolic sine."""
    x = _float(input)
    negative = F.less(x, 0.0)
    magnitude = _asinh_positive(F.select(negative, -x, x))
    return F.select(negative, -magnitude, magnitude)


def acosh(input: Any) -> Tensor:
    """The inverse hyperbolic cosine, for input >= 1 (nan below): log1p((x - 1) + sqrt((x - 1)(x + 1)))."""
    x = _float(input)
    huge = F.greater(x, _LARGE)
    moderate = _guard(F.logical_not(huge), x, 1.0)
    near = C.log1p((moderate - 1.0) + F.sqrt((moderate - 1.0) * (moderate + 1.0)))
    return F.select(huge, F.log(_guard(huge, x, 1.0)) + math.log(2.0), near)


def atanh(input: Any) -> Tensor:
    """The inverse hyperbolic tangent, (log1p(x) - log1p(-x)) / 2 (1 + x and 1 - x are exact near +-1); +-inf at
    +-1, nan beyond."""
    x = _float(input)
    return (C.log1p(x) - C.log1p(-x)) * 0.5
