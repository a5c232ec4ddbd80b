"""Strategies: what `Primitive.shard(in_strategy, out_strategy)` asks for, checked against the op's rule and turned
into a `Placement` (the op's device matrix and the layout of every input and output).

MindSpore's rules, as here:
- in_strategy[i][d] = how many parts input i is cut into along dim d; a dim shared by several inputs (MatMul's k)
  must be cut alike; the product of the cuts of the op's distinct dims must equal device_num, or divide it, in
  which case the op is computed `device_num / product` times over (repeated calculation: a leading axis of the
  device matrix holds copies);
- an op without a strategy runs data parallel: its batch dim (output 0's dim 0) cut device_num ways;
- the device matrix is [copies] + one axis per cut dim, in order of first appearance (MatMul ((a, b), (b, c))
  gives [a, b, c]).

    >>> resolve(node, ((1, 1), (1, 2)), device_num=8).device_matrix
    (4, 2)
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessel.compiler.ir import Node
from tessel.compiler.parallel.layout import Layout
from tessel.compiler.parallel.mesh import DeviceMesh, divisors
from tessel.compiler.shapes import format_shape
from tessel.compiler.sharding import ShardingSpec
from tessel.core.errors import ConfigurationError

log = logging.getLogger("tessel.parallel")

DATA_PARALLEL = "data_parallel"  # a strategy value: this op runs data parallel (Cell.set_data_parallel)

Splits = tuple[tuple[int, ...], ...]


class StrategyError(ConfigurationError):
    """A shard() strategy the op cannot run with; the message names the op, the input, the dim and a valid fix."""


@dataclass(frozen=True)
class Strategy:
    """An operator's strategy: one tuple of cuts per input (optionally one per output), or one Layout per input
    (MindSpore's `Layout` form of shard(): a device matrix and which of its axes cut each dim; None = take the
    input as it comes) and optionally one per output."""

    in_strategy: Splits | None
    out_strategy: Splits | None = None
    in_layouts: tuple[Layout | None, ...] | None = None
    out_layouts: tuple[Layout, ...] | None = None

    @staticmethod
    def of(value: Any) -> Strategy:
        """From a Strategy, a tuple of tuples (in_strategy), a tuple of Layouts, or anything with `in_strategy` /
        `out_strategy` attributes (a Primitive after `.shard(...)`)."""
        if isinstance(value, Strategy):
            return value
        if hasattr(value, "in_strategy"):
            return Strategy.of_parts(value.in_strategy, getattr(value, "out_strategy", None))
        return Strategy.of_parts(value, None)

    @staticmethod
    def of_parts(inputs: Any, outputs: Any) -> Strategy:
        if inputs is not None and any(isinstance(s, Layout) for s in inputs):
            return Strategy(None, None, tuple(inputs), None if outputs is None else tuple(outputs))
        return Strategy(_tuples(inputs), _tuples(outputs))

    def __repr__(self) -> str:
        if self.in_layouts is not None:
            return f"Strategy(layouts={self.in_layouts})"
        out = f", out={self.out_strategy}" if self.out_strategy else ""
        return f"Strategy({self.in_strategy}{out})"


def _tuples(value: Any) -> Splits | None:
    if value is None:
        return None
    return tuple(None if s is None else tuple(int(d) for d in s) for s in value)


@dataclass(frozen=True)
class Placement:
    """Where one node runs: its device matrix, which mesh axis cuts each label, and the layout every input must
    have (None: taken as it comes) and every output gets (possibly partial)."""

    op: str
    strategy: Splits
    origin: str  # "shard()", "data parallel", "replicated", "parameter"
    device_matrix: tuple[int, ...]
    label_axes: tuple[tuple[str, int | tuple[int, ...]], ...]
    inputs: tuple[Layout | None, ...]
    outputs: tuple[Layout, ...]
    out_targets: tuple[Layout, ...] | None = None

    def block(self, rank: int, label: str) -> tuple[int, int]:
        """(this rank's block index, number of blocks) along `label`."""
        found = dict(self.label_axes)
        if label not in found:
            return 0, 1
        axes = found[label] if isinstance(found[label], tuple) else (found[label],)
        return DeviceMesh(self.device_matrix).block(rank, axes), math.prod(self.device_matrix[a] for a in axes)


# --- checking a user strategy -------------------------------------------------------------------------------------


def _where(node: Node) -> str:
    return f" (at {node.source})" if node.source else ""


def _entries(node: Node, strategy: Splits, device_num: int, spec: ShardingSpec) -> list[tuple[int, ...] | None]:
    """One entry per input; scalar inputs may be left out, as MindSpore does."""
    tensors = [i for i, v in enumerate(node.inputs) if v.ndim > 0]
    if len(strategy) == len(node.inputs):
        return list(strategy)
    if len(strategy) == len(tensors):
        entries: list[tuple[int, ...] | None] = [()] * len(node.inputs)
        for i, s in zip(tensors, strategy):
            entries[i] = s
        return entries
    shapes = ", ".join(format_shape(v.shape) for v in node.inputs)
    raise StrategyError(
        f"{node.op}{_where(node)}: in_strategy {strategy} has {len(strategy)} entries, but {node.op} takes "
        f"{len(node.inputs)} inputs ({shapes}); the rule: one tuple of cuts per input. "
        f"A valid strategy: {data_parallel(node, spec, device_num, set())}"
    )


def check(node: Node, spec: ShardingSpec, strategy: Splits, device_num: int) -> dict[str, int]:
    """The cut of every label under a user strategy, or a StrategyError naming what is wrong and a valid fix."""
    cuts: dict[str, tuple[int, int, int]] = {}  # label -> (cut, input, dim) where first seen
    entries = _entries(node, strategy, device_num, spec)
    fix = lambda: repair(node, spec, tuple(entries), device_num)  # noqa: E731
    blocked = spec.fixed | uncombinable(spec)
    for i, (entry, v, labels) in enumerate(zip(entries, node.inputs, spec.inputs)):
        if labels is None or entry is None:
            continue
        if len(entry) != v.ndim:
            raise StrategyError(
                f"{node.op}{_where(node)}: input {i} {format_shape(v.shape)} has {v.ndim} dims but its strategy "
                f"{entry} has {len(entry)}; the rule: one cut per dim. A valid strategy: {fix()}"
            )
        for d, (cut, size, label) in enumerate(zip(entry, v.shape, labels)):
            if cut < 1 or size % cut:
                raise StrategyError(
                    f"{node.op}{_where(node)}: input {i} dim {d} has size {size}, which cannot be split into {cut} "
                    f"parts; the rule: a cut must divide its dim. A valid strategy: {fix()}"
                )
            if cut > 1 and label in blocked:
                why = spec.why or "the op needs it whole"
                raise StrategyError(
                    f"{node.op}{_where(node)}: input {i} dim {d} (size {size}) cannot be split ({why}), got {cut}; "
                    f"keep 1 there. A valid strategy: {fix()}"
                )
            if label in cuts and cuts[label][0] != cut:
                first, j, e = cuts[label]
                raise StrategyError(
                    f"{node.op}{_where(node)}: input {i} dim {d} and input {j} dim {e} are the same dim of "
                    f"{node.op} (size {size}) and must be cut alike; got {cut} and {first}. A valid strategy: {fix()}"
                )
            cuts.setdefault(label, (cut, i, d))
    result = {label: c for label, (c, _, _) in cuts.items() if c > 1}
    _check_outputs(node, spec, result, fix)
    product = math.prod(result.values())
    if device_num % product:
        raise StrategyError(
            f"{node.op}{_where(node)}: in_strategy {strategy} cuts the op into {product} parts (the product of the "
            f"cuts of its distinct dims) on {device_num} devices; the rule: the product must equal device_num or "
            f"divide it (repeated calculation). A valid strategy: {fix()}"
        )
    return result


def uncombinable(spec: ShardingSpec) -> set[str]:
    """Labels that would leave partial results an op cannot combine (its `reduce` is None): never split."""
    if spec.reduce is not None:
        return set()
    return {label for j in range(len(spec.outputs)) for label in spec.contracted(j)}


def _check_outputs(node: Node, spec: ShardingSpec, cuts: dict[str, int], fix) -> None:
    for j, (v, labels) in enumerate(zip(node.outputs, spec.outputs)):
        for d, (size, label) in enumerate(zip(v.shape, labels)):
            if size % cuts.get(label, 1):
                raise StrategyError(
                    f"{node.op}{_where(node)}: output {j} dim {d} has size {size}, which the strategy cuts into "
                    f"{cuts[label]} parts; the rule: a cut must divide the dim on both sides. A valid strategy: {fix()}"
                )


def label_sizes(node: Node, spec: ShardingSpec) -> dict[str, list[int]]:
    sizes: dict[str, list[int]] = {}
    for labels, v in zip((*spec.inputs, *spec.outputs), (*node.inputs, *node.outputs)):
        for label, size in zip(labels or (), v.shape):
            sizes.setdefault(label, []).append(size)
    return sizes


def _legal_cut(node: Node, spec: ShardingSpec, label: str, want: int, device_num: int) -> int:
    """The largest cut <= want that divides `want`, device_num and every dim carrying `label`."""
    if label in spec.fixed | uncombinable(spec):
        return 1
    sizes = label_sizes(node, spec)[label]
    return max(d for d in divisors(math.gcd(want, device_num)) if all(s % d == 0 for s in sizes))


def _as_strategy(node: Node, spec: ShardingSpec, cuts: Mapping[str, int]) -> Splits:
    return tuple(
        () if labels is None else tuple(cuts.get(label, 1) for label in labels)
        for labels in spec.inputs[: len(node.inputs)]
    )


def repair(node: Node, spec: ShardingSpec, strategy: Splits, device_num: int) -> Splits:
    """A legal strategy close to `strategy`: each dim's cut lowered to one that is allowed and divides."""
    cuts: dict[str, int] = {}
    for entry, labels in zip(strategy, spec.inputs):
        for cut, label in zip(entry or (), labels or ()):
            cuts.setdefault(label, _legal_cut(node, spec, label, max(int(cut), 1), device_num))
    while device_num % math.prod(cuts.values()):
        label = max(cuts, key=cuts.get)
        cuts[label] = max(d for d in divisors(cuts[label]) if d < cuts[label])
    if not any(c > 1 for c in cuts.values()):
        return data_parallel(node, spec, device_num, set())
    return _as_strategy(node, spec, cuts)


# --- defaults -----------------------------------------------------------------------------------------------------


def data_parallel_cuts(node: Node, spec: ShardingSpec, device_num: int, parameters: set[int]) -> dict[str, int]:
    """MindSpore's default: the batch dim (output 0's dim 0, else input 0's) cut device_num ways, or the largest
    divisor of device_num that divides it. Never cuts a parameter (its layout is its consumers' choice)."""
    first = next((labels for labels in spec.outputs if labels), None)
    first = first or next((labels for labels in spec.inputs if labels), None)
    if not first:
        return {}
    label = first[0]
    carriers = [i for i, labels in enumerate(spec.inputs) if labels and label in labels]
    if not carriers or parameters.intersection(carriers):
        return {}
    cut = _legal_cut(node, spec, label, device_num, device_num)
    return {label: cut} if cut > 1 else {}


def data_parallel(node: Node, spec: ShardingSpec, device_num: int, parameters: set[int]) -> Splits:
    """The data-parallel strategy of a node, as an in_strategy tuple."""
    return _as_strategy(node, spec, data_parallel_cuts(node, spec, device_num, parameters))


# --- placement ----------------------------------------------------------------------------------------------------


def place(node: Node, spec: ShardingSpec, cuts: Mapping[str, int], device_num: int, origin: str) -> Placement:
    """The node's device matrix and the layouts of its inputs and outputs under label cuts `cuts`."""
    labels = [label for label in spec.labels() if cuts.get(label, 1) > 1]
    product = math.prod(cuts[label] for label in labels)
    copies = device_num // product
    sizes = ([copies] if copies > 1 else []) + [cuts[label] for label in labels]
    offset = 1 if copies > 1 else 0
    axis_of = {label: offset + k for k, label in enumerate(labels)}
    matrix = tuple(sizes) or (1,)

    def layout(labels, partial=()):
        return Layout.from_axes(
            matrix, [(axis_of[x],) if x in axis_of else () for x in labels], partial, spec.reduce or "sum"
        )

    inputs = tuple(None if labs is None else layout(labs) for labs in spec.inputs)
    outputs = tuple(
        layout(labs, sorted(axis_of[x] for x in spec.contracted(j) if x in axis_of))
        for j, labs in enumerate(spec.outputs)
    )
    return Placement(node.op, _as_strategy(node, spec, cuts), origin, matrix, tuple(axis_of.items()), inputs, outputs)


def check_devices(layout: Layout, device_num: int, what: str) -> None:
    """MindSpore's rule for a Layout: its device matrix multiplies to the devices of the stage."""
    size = math.prod(layout.device_matrix)
    if size != device_num:
        raise StrategyError(
            f"{what} has device matrix {tuple(layout.device_matrix)} ({size} devices), but the plan has "
            f"{device_num}; the rule: a Layout's device matrix multiplies to the device count (of a pipeline stage). "
            f"Fix: build the Layout for {device_num} devices"
        )


def follow(node: Node, spec: ShardingSpec, index: int, layout: Layout) -> Placement | None:
    """The placement under which input `index` is used as it is laid out (its device matrix and mesh axes kept),
    or None when the op's rule cannot: a label it may not split, a size that does not divide, or two dims of the
    layout that are one label of the op."""
    layouts: list[Layout | None] = [None] * len(node.inputs)
    layouts[index] = layout
    try:
        return from_layouts(node, spec, layouts, "follows its input")
    except StrategyError:
        return None


def from_layouts(
    node: Node, spec: ShardingSpec, layouts: Sequence[Layout | None], origin: str = "shard() layouts"
) -> Placement:
    """The placement that takes each input in the given layout (None: as it comes), all on one device matrix:
    a label takes the mesh axes of the dims that carry it. A StrategyError names what the op cannot do."""
    given = [(i, lay) for i, lay in enumerate(layouts) if lay is not None]
    if not given:
        raise StrategyError(f"{node.op}{_where(node)}: no input layout given")
    matrix = given[0][1].device_matrix
    blocked = spec.fixed | uncombinable(spec)
    axes_of: dict[str, tuple[int, ...]] = {}
    for i, layout in given:
        labels = spec.inputs[i] if i < len(spec.inputs) else None
        if layout.device_matrix != matrix:
            raise StrategyError(
                f"{node.op}{_where(node)}: input {i}'s layout has device matrix {layout.device_matrix}, input "
                f"{given[0][0]}'s {matrix}; the rule: the layouts of one op share one device matrix"
            )
        if labels is None or layout.is_partial or len(labels) != layout.ndim:
            shape = format_shape(node.inputs[i].shape)
            raise StrategyError(f"{node.op}{_where(node)}: input {i} {shape} cannot take layout {layout}")
        for d, (label, axes) in enumerate(zip(labels, layout.dim_axes)):
            if axes and label in blocked:
                why = spec.why or "the op needs it whole"
                raise StrategyError(f"{node.op}{_where(node)}: input {i} dim {d} cannot be split ({why})")
            taken = {a for other, used in axes_of.items() if other != label for a in used}
            if axes_of.get(label, axes) != axes or taken & set(axes):
                # Layouts that cut one dim of the op two ways (MindSpore's nd tensor parallel, an Ascend kernel's
                # own algorithm): the op runs as the inputs before say; this input is redistributed to match.
                log.warning(
                    "%s%s: input %d's layout %s cuts dim %d as no consistent strategy can (the other inputs' layouts "
                    "cut it otherwise); it is redistributed to the op's layout",
                    node.op,
                    _where(node),
                    i,
                    layout,
                    d,
                )
                continue
            if axes:
                axes_of[label] = axes
    sizes = label_sizes(node, spec)
    for label, axes in axes_of.items():
        cut = math.prod(matrix[a] for a in axes)
        if any(size % cut for size in sizes[label]):
            raise StrategyError(f"{node.op}{_where(node)}: a dim of size {sizes[label]} cannot be cut into {cut}")

    def laid_out(labs, partial=()) -> Layout:
        return Layout.from_axes(matrix, [axes_of.get(x, ()) for x in labs], partial, spec.reduce or "sum")

    inputs = tuple(None if labs is None else laid_out(labs) for labs in spec.inputs)
    outputs = tuple(
        laid_out(labs, sorted(a for x in spec.contracted(j) for a in axes_of.get(x, ())))
        for j, labs in enumerate(spec.outputs)
    )
    cuts = {label: math.prod(matrix[a] for a in axes) for label, axes in axes_of.items()}
    strategy = _as_strategy(node, spec, cuts)
    return Placement(node.op, strategy, origin, matrix, tuple(axes_of.items()), inputs, outputs)


def resolve(
    node: Node, spec: ShardingSpec, given: Any, device_num: int, parameters: set[int] = frozenset()
) -> Placement:
    """The placement of `node` under a user strategy (`given`), or data parallel when `given` is None or
    DATA_PARALLEL (and replicated when the op cannot split its batch dim)."""
    strategy = None if given is None or given == DATA_PARALLEL else Strategy.of(given)
    if strategy is not None and strategy.in_layouts is not None:
        for kind, layouts in (("in_strategy", strategy.in_layouts), ("out_strategy", strategy.out_layouts or ())):
            for i, layout in enumerate(layouts):
                if layout is not None:
                    check_devices(layout, device_num, f"{node.op}{_where(node)}: {kind} layout {i}")
        placement = from_layouts(node, spec, strategy.in_layouts)
        if strategy.out_layouts is None:
            return placement
        return dataclasses.replace(placement, out_targets=tuple(strategy.out_layouts))
    if strategy is None or strategy.in_strategy is None:  # a Primitive never shard()-ed has no in_strategy
        cuts = data_parallel_cuts(node, spec, device_num, set(parameters))
        return place(node, spec, cuts, device_num, "data parallel" if cuts else "replicated")
    placement = place(node, spec, check(node, spec, strategy.in_strategy, device_num), device_num, "shard()")
    if strategy.out_strategy is None:
        return placement
    targets = out_targets(node, placement, strategy.out_strategy)
    return dataclasses.replace(placement, out_targets=targets)


def out_targets(node: Node, placement: Placement, out_strategy: Splits) -> tuple[Layout, ...]:
    """The output layouts an out_strategy asks for: extra cuts taken from the partial axes (a ReduceScatter
    instead of an AllReduce) or the copies axis, in device-matrix order."""
    if len(out_strategy) != len(placement.outputs):
        raise StrategyError(
            f"{node.op}{_where(node)}: out_strategy {out_strategy} has {len(out_strategy)} entries for "
            f"{len(placement.outputs)} outputs; the rule: one tuple of cuts per output"
        )
    return tuple(_out_target(node, placement, j, want) for j, want in enumerate(out_strategy))


def _out_target(node: Node, placement: Placement, j: int, want: tuple[int, ...]) -> Layout:
    have = placement.outputs[j]
    natural = have.splits
    pool = [*have.partial_axes, *have.replicated_axes]
    dims = [list(axes) for axes in have.dim_axes]
    ok = len(want) == have.ndim
    for d in range(have.ndim if ok else 0):
        extra, rem = divmod(want[d], have.splits[d])
        chosen = _subset(pool, placement.device_matrix, extra) if rem == 0 else None
        if chosen is None or node.outputs[j].shape[d] % want[d]:
            ok = False
            break
        dims[d].extend(chosen)
        pool = [a for a in pool if a not in chosen]
    if not ok:
        raise StrategyError(
            f"{node.op}{_where(node)}: out_strategy entry {want} for output {j} {format_shape(node.outputs[j].shape)} "
            f"cannot be reached from the in_strategy's output cuts {natural}; the rule: each output cut must be the "
            f"input-side cut times cuts of the reduced dims or of the copies. A valid out_strategy: ({natural},)"
        )
    return Layout.from_axes(placement.device_matrix, dims)


def _subset(pool: list[int], matrix: tuple[int, ...], product: int) -> tuple[int, ...] | None:
    for r in range(len(pool) + 1):
        for axes in itertools.combinations(pool, r):
            if math.prod(matrix[a] for a in axes) == product:
                return axes
    return None
