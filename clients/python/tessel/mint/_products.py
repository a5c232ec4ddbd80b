"""mint's matrix products (`addmm`, `baddbmm`, `mv`, `dot`, `outer`, `cross`, `einsum`), composed from `tessel.ops`.

The add-forms compute beta * input + alpha * product, and beta 0 ignores input (its NaNs too), as torch and mint.
einsum contracts two operands at a time as one batched matmul.
"""

from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from tessel.common.support import not_supported_yet
from tessel.common.tensor import Tensor
from tessel.core.errors import ConfigurationError
from tessel.ops import composed as C
from tessel.ops import functional as F


def _scaled(value: Any, scale: Any) -> Any:
    return value if scale == 1 else value * scale


def _plus(input: Any, product: Any, beta: Any, alpha: Any) -> Tensor:
    """beta * input + alpha * product; beta 0 ignores input (its NaNs too), as torch and mint."""
    if beta == 0:
        shape = np.broadcast_shapes(C._shape(input, "mint.addmm"), C._shape(product, "mint.addmm"))
        return F.broadcast_to(_scaled(product, alpha), shape)
    return _scaled(input, beta) + _scaled(product, alpha)


def outer(input: Any, vec2: Any) -> Tensor:
    """The outer product of two 1-D tensors."""
    return C.outer(input, vec2)


def dot(input: Any, other: Any) -> Tensor:
    """The inner product of two 1-D tensors (0-D)."""
    if F._ndim(input) != 1 or F._ndim(other) != 1:
        raise ConfigurationError(f"mint.dot: both inputs must be 1-D, got ranks {F._ndim(input)} and {F._ndim(other)}")
    return F.sum(input * other)


def mv(input: Any, vec: Any) -> Tensor:
    """The product of a 2-D matrix and a 1-D vector."""
    if F._ndim(input) != 2 or F._ndim(vec) != 1:
        raise ConfigurationError(f"mint.mv: input must be 2-D and vec 1-D, got ranks {F._ndim(input)}, {F._ndim(vec)}")
    return F.matmul(input, vec)


def addmm(input: Any, mat1: Any, mat2: Any, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    """beta * input + alpha * (mat1 @ mat2) for 2-D mat1 and mat2."""
    return _plus(input, C.mm(mat1, mat2), beta, alpha)


def addmv(input: Any, mat: Any, vec: Any, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    """beta * input + alpha * (mat @ vec)."""
    return _plus(input, mv(mat, vec), beta, alpha)


def baddbmm(input: Any, batch1: Any, batch2: Any, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    """beta * input + alpha * (batch1 @ batch2), batch by batch (3-D batches)."""
    return _plus(input, F.bmm(batch1, batch2), beta, alpha)


def addbmm(input: Any, batch1: Any, batch2: Any, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    """beta * input + alpha * the sum over the batch of batch1[i] @ batch2[i]."""
    return _plus(input, F.sum(F.bmm(batch1, batch2), 0), beta, alpha)


def cross(input: Any, other: Any, dim: int | None = None) -> Tensor:
    """The cross product of 3-vectors along `dim` (None: the first dim of length 3)."""
    shape = C._shape(input, "mint.cross")
    if dim is None:
        dim = next((d for d, n in enumerate(shape) if n == 3), None)
        if dim is None:
            raise ConfigurationError(f"mint.cross: no dim of length 3 in shape {shape}; give dim")
    dim = C._dim(int(dim), len(shape), "mint.cross")
    if shape[dim] != 3:
        raise ConfigurationError(f"mint.cross: dim {dim} must have length 3, got shape {shape}")
    a = [F.gather(input, C._constant(np.array([k], np.int64)), dim) for k in range(3)]
    b = [F.gather(other, C._constant(np.array([k], np.int64)), dim) for k in range(3)]
    return F.concat([a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]], dim)


def _einsum_terms(equation: str, count: int) -> tuple[list[str], str]:
    equation = equation.replace(" ", "")
    if "." in equation:
        raise not_supported_yet("mindspore.mint.einsum with '...'", "write the broadcast dims out as letters")
    inputs, arrow, output = equation.partition("->")
    terms = inputs.split(",")
    if (
        len(terms) != count
        or not builtins.all(t.isalpha() for t in terms)
        or (arrow and not output.isalpha() and output)
    ):
        raise ConfigurationError(f"mint.einsum: equation {equation!r} does not fit {count} operands")
    if not arrow:  # implicit output: the letters seen once, in alphabetical order
        letters = "".join(terms)
        output = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    return terms, output


def _einsum_diagonal(x: Tensor, term: str) -> tuple[Tensor, str]:
    """x with each repeated letter of `term` reduced to its diagonal (the letter kept once, at its first place)."""
    while len(set(term)) < len(term):
        letter = next(c for c in term if term.count(c) > 1)
        first, second = term.index(letter), term.index(letter, term.index(letter) + 1)
        shape = C._shape(x, "mint.einsum")
        perm = [d for d in range(len(shape)) if d not in (first, second)] + [first, second]
        moved = F.transpose(x, perm)
        n = shape[first]
        flat = F.reshape(moved, (*[shape[d] for d in perm[:-2]], n * n))
        x = F.gather(flat, C._constant(np.arange(n, dtype=np.int64) * (n + 1)), len(perm) - 2)
        rest = [term[d] for d in perm[:-2]] + [letter]
        order = sorted(range(len(rest)), key=lambda k: term.index(rest[k]))
        x, term = F.transpose(x, order), "".join(rest[k] for k in order)
    return x, term


def _einsum_pair(a: Tensor, ta: str, b: Tensor, tb: str, keep: set[str]) -> tuple[Tensor, str]:
    """a and b contracted over the letters they share that `keep` does not need, as one batched matmul."""
    size = dict(zip(ta, C._shape(a, "mint.einsum"))) | dict(zip(tb, C._shape(b, "mint.einsum")))
    batch = [c for c in ta if c in tb and c in keep]
    summed = [c for c in ta if c in tb and c not in keep]
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]

    def arranged(x, term, groups):
        order = [term.index(c) for group in groups for c in group]
        x = F.transpose(x, order) if order != list(range(len(order))) else x
        return F.reshape(x, tuple(int(np.prod([size[c] for c in group])) for group in groups))

    product = F.bmm(arranged(a, ta, (batch, left, summed)), arranged(b, tb, (batch, summed, right)))
    letters = batch + left + right
    return F.reshape(product, tuple(size[c] for c in letters)), "".join(letters)


def einsum(equation: str, *operands: Any) -> Tensor:
    """Einstein summation over `operands` (a list of them works too): repeated letters within an operand take the
    diagonal, letters absent from the output are summed, two operands contract as a batched matmul. '...' is not
    supported yet."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    terms, output = _einsum_terms(equation, len(operands))
    pairs = [_einsum_diagonal(x, t) for x, t in zip(operands, terms)]
    for k, (x, term) in enumerate(pairs):  # letters only this operand has and the output lacks: summed now
        others = output + "".join(t for j, (_, t) in enumerate(pairs) if j != k)
        alone = [d for d, c in enumerate(term) if c not in others]
        if alone:
            pairs[k] = (F.sum(x, tuple(alone)), "".join(c for c in term if c in others))
    x, term = pairs[0]
    for k in range(1, len(pairs)):
        later = output + "".join(t for _, t in pairs[k + 1 :])
        x, term = _einsum_pair(x, term, *pairs[k], set(later))
    order = [term.index(c) for c in output]
    return F.transpose(x, order) if order != list(range(len(order))) else x


_CDIST_MODES = ("use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist")


def cdist(x1: Any, x2: Any, p: float = 2.0, compute_mode: str = "use_mm_for_euclid_dist_if_necessary") -> Tensor:
    """The p-norm distances between the rows of x1 (..., P, M) and of x2 (..., R, M): (..., P, R). Every mode
    computes the differences directly (the matmul form is torch's speed-up for large inputs, not another value).
    The gradient at a zero distance is 0, as torch's."""
    if compute_mode not in _CDIST_MODES:
        raise ConfigurationError(f"mint.cdist: compute_mode must be one of {_CDIST_MODES}, got {compute_mode!r}")
    if isinstance(p, bool) or not isinstance(p, (int, float)) or p < 0:
        raise ConfigurationError(f"mint.cdist: p must be a number >= 0, got {p!r}")
    d = F.abs(F.expand_dims(x1, -2) - F.expand_dims(x2, -3))
    if p == 0:
        return F.sum(F.cast(F.not_equal(d, 0.0), d.dtype), -1)
    if p == float("inf"):
        return F.amax(d, -1)
    if p == 1:
        return F.sum(d, -1)
    total = F.sum(F.square(d) if p == 2 else F.pow(d, float(p)), -1)
    positive = F.greater(total, 0.0)
    root = F.sqrt if p == 2 else (lambda t: F.pow(t, 1.0 / p))
    return F.select(positive, root(F.select(positive, total, F.ones_like(total))), F.zeros_like(total))
