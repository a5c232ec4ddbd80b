"""Redistribution: the cheapest sequence of collectives and local slices taking a tensor from one layout to another.

The steps are a table (`TRANSITIONS`), one entry per placement change, each with the collective it emits and a
closed-form count of the bytes every rank sends (ring algorithms, n = group size, b = local bytes in):

    P -> R      AllReduce      2 (n-1) b / n
    P -> S(d)   ReduceScatter    (n-1) b / n
    S(d) -> R   AllGather        (n-1) b
    S(d)->S(e)  AlltoAll         (n-1) b / n
    R -> S(d)   StridedSlice     0            (local)

plus `LATENCY_BYTES` per collective, so one collective over a group of 4 beats two over groups of 2. The planner
is Dijkstra over layouts on the prime refinement of the device matrix (mesh.py), walking the table; plans are
cached on (source, target, shape, itemsize). Layouts whose device matrices do not refine alike (2x3 vs 3x2) go
through the replicated layout: gather on the source mesh, slice on the target's. The same table prices
candidate strategies for AUTO_PARALLEL (`redistribution_cost`).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache

from tessel.compiler.parallel.layout import Layout
from tessel.compiler.parallel.mesh import DeviceMesh

LATENCY_BYTES = 1 << 16  # a collective's fixed cost, in bytes-equivalent (~50 us at a few GB/s)
SLICE_COST = 1  # a local slice is nearly free; the unit cost only prefers fewer nodes

# A state on the refined mesh: (per tensor dim the axes splitting it, major first; the axes holding partials).
State = tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]


@dataclass(frozen=True)
class Step:
    """One redistribution step on a refined mesh. `axes` are refined mesh axes, major first. `dim` is the dim
    gathered (all_gather), sliced or scattered into (slice, reduce_scatter) or concatenated (all_to_all, which
    splits `to_dim`)."""

    kind: str
    axes: tuple[int, ...]
    dim: int = -1
    to_dim: int = -1
    op: str = "sum"


@dataclass(frozen=True)
class Transition:
    """One row of the table: a placement change, the op it emits, and the bytes each rank sends."""

    kind: str
    change: str
    op: str
    sent_bytes: Callable[[int, int], float]
    moves: Callable[[State, State, tuple[int, ...], tuple[int, ...]], Iterator[Step]]
    collective: bool = True


def _partial_to_replicate(state, goal, sizes, local):
    free = [a for a in state[1] if a not in goal[1]]
    for r in range(1, len(free) + 1):
        for axes in itertools.combinations(free, r):
            yield Step("all_reduce", axes)


def _partial_to_shard(state, goal, sizes, local):
    # One partial axis onto any dim, or a run of them in the order the target lists them on a dim whose axes so
    # far match the target's (every ordering of every subset would grow factorially with the mesh).
    free = [a for a in state[1] if a not in goal[1]]
    runs = {((a,), dim) for a in free for dim in range(len(local))}
    for dim, (have, want) in enumerate(zip(state[0], goal[0])):
        run: list[int] = []
        for a in want[len(have) :] if want[: len(have)] == have else ():
            if a not in free:
                break
            run.append(a)
            runs.add((tuple(run), dim))
    for axes, dim in sorted(runs):
        if local[dim] % math.prod(sizes[a] for a in axes) == 0:
            yield Step("reduce_scatter", axes, dim)


def _shard_to_replicate(state, goal, sizes, local):
    for dim, axes in enumerate(state[0]):
        for k in range(1, len(axes) + 1):
            yield Step("all_gather", axes[-k:], dim)


def _shard_to_shard(state, goal, sizes, local):
    for dim, axes in enumerate(state[0]):
        for k in range(1, len(axes) + 1):
            moved = axes[-k:]
            n = math.prod(sizes[a] for a in moved)
            for to_dim, size in enumerate(local):
                if to_dim != dim and size % n == 0:
                    yield Step("all_to_all", moved, dim, to_dim)


def _replicate_to_shard(state, goal, sizes, local):
    # Slicing a replicated axis onto a dim is only worth it in the target's order: an axis sliced anywhere else
    # would have to move again at a cost, while leaving it replicated costs nothing.
    used = {a for axes in state[0] for a in axes} | set(state[1])
    for dim, (have, want) in enumerate(zip(state[0], goal[0])):
        if want[: len(have)] != have:
            continue
        for k in range(1, len(want) - len(have) + 1):
            axes = want[len(have) : len(have) + k]
            n = math.prod(sizes[a] for a in axes)
            if not used.intersection(axes) and local[dim] % n == 0:
                yield Step("slice", axes, dim)


TRANSITIONS = (
    Transition("all_reduce", "P -> R", "AllReduce", lambda n, b: 2 * (n - 1) * b / n, _partial_to_replicate),
    Transition("reduce_scatter", "P -> S(d)", "ReduceScatter", lambda n, b: (n - 1) * b / n, _partial_to_shard),
    Transition("all_gather", "S(d) -> R", "AllGather", lambda n, b: (n - 1) * b, _shard_to_replicate),
    Transition("all_to_all", "S(d) -> S(e)", "AlltoAll", lambda n, b: (n - 1) * b / n, _shard_to_shard),
    Transition("slice", "R -> S(d)", "StridedSlice", lambda n, b: 0, _replicate_to_shard, collective=False),
)
TABLE = {t.kind: t for t in TRANSITIONS}


def _apply(state: State, step: Step) -> State:
    dims, partial = [list(a) for a in state[0]], [a for a in state[1] if a not in step.axes]
    if step.kind in ("all_gather", "all_to_all"):
        del dims[step.dim][-len(step.axes) :]
    if step.kind in ("slice", "reduce_scatter"):
        dims[step.dim].extend(step.axes)
    if step.kind == "all_to_all":
        dims[step.to_dim].extend(step.axes)
    return tuple(map(tuple, dims)), tuple(partial)


def _local(shape: tuple[int, ...], state: State, sizes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d // math.prod(sizes[a] for a in axes) for d, axes in zip(shape, state[0]))


def step_cost(step: Step, sizes: tuple[int, ...], local_bytes: int) -> tuple[float, float]:
    """(bytes each rank sends, planner cost) of one step taken on a tensor of `local_bytes` per rank."""
    row = TABLE[step.kind]
    sent = row.sent_bytes(math.prod(sizes[a] for a in step.axes), local_bytes)
    return sent, sent + (LATENCY_BYTES if row.collective else SLICE_COST)


@dataclass(frozen=True)
class Segment:
    """Steps taken on one refined device matrix; `layouts[i]` is the layout after step i."""

    device_matrix: tuple[int, ...]
    steps: tuple[Step, ...]
    layouts: tuple[Layout, ...]
    sent_bytes: tuple[int, ...]
    cost: float


@dataclass(frozen=True)
class Redistribution:
    """How to take a tensor of `shape` from `source` to `target`; `cost` is what the planner minimised."""

    source: Layout
    target: Layout
    shape: tuple[int, ...]
    segments: tuple[Segment, ...]
    cost: float

    @property
    def steps(self) -> tuple[Step, ...]:
        return tuple(s for seg in self.segments for s in seg.steps)

    @property
    def sent_bytes(self) -> int:
        """Bytes each rank sends in total."""
        return sum(sum(seg.sent_bytes) for seg in self.segments)

    @property
    def collectives(self) -> tuple[str, ...]:
        return tuple(TABLE[s.kind].op for s in self.steps if TABLE[s.kind].collective)

    def __repr__(self) -> str:
        shown = " -> ".join(_describe(s) for s in self.steps) or "nothing"
        return f"Redistribution({self.source} -> {self.target}: {shown}; {self.sent_bytes} bytes/rank)"


def _describe(step: Step) -> str:
    op = TABLE[step.kind].op
    if step.kind == "all_to_all":
        return f"{op}(axes={step.axes}, concat={step.dim}, split={step.to_dim})"
    if step.kind == "all_reduce":
        return f"{op}({step.op}, axes={step.axes})"
    return f"{op}(axes={step.axes}, dim={step.dim})"


def _state(layout: Layout) -> State:
    return layout.dim_axes, layout.partial_axes


def _search(source: Layout, target: Layout, shape: tuple[int, ...], itemsize: int, kinds: frozenset[str]) -> Segment:
    """Dijkstra from source to target (both refined onto the same device matrix), using the steps in `kinds`."""
    sizes = source.device_matrix
    start, goal = _state(source), _state(target)
    frontier: list = [(0.0, 0, start, ())]
    best = {start: 0.0}
    counter = itertools.count(1)
    while frontier:
        cost, _, state, path = heapq.heappop(frontier)
        if state == goal:
            return _segment(source, sizes, path, shape, itemsize)
        if cost > best.get(state, math.inf):
            continue
        local = _local(shape, state, sizes)
        local_bytes = math.prod(local) * itemsize
        for row in TRANSITIONS:
            if row.kind not in kinds:
                continue
            for step in row.moves(state, goal, sizes, local):
                if step.kind in ("all_reduce", "reduce_scatter"):
                    step = Step(step.kind, step.axes, step.dim, step.to_dim, source.partial_op)
                nxt = _apply(state, step)
                total = cost + step_cost(step, sizes, local_bytes)[1]
                if total < best.get(nxt, math.inf):
                    best[nxt] = total
                    heapq.heappush(frontier, (total, next(counter), nxt, (*path, step)))
    raise ValueError(
        f"no redistribution from {source} to {target} for shape {shape} with steps {sorted(kinds)}; "
        "AllReduce, AllGather and StridedSlice alone always reach any layout"
    )


def _segment(source: Layout, sizes, path: tuple[Step, ...], shape, itemsize) -> Segment:
    state, layouts, sent, cost = _state(source), [], [], 0.0
    for step in path:
        local = _local(shape, state, sizes)
        step_sent, step_total = step_cost(step, sizes, math.prod(local) * itemsize)
        sent.append(int(step_sent))
        cost += step_total
        state = _apply(state, step)
        layouts.append(Layout.from_axes(sizes, state[0], state[1], source.partial_op))
    return Segment(sizes, path, tuple(layouts), tuple(sent), cost)


ALL_STEPS = frozenset(TABLE)


def allowed_steps(alltoall: bool = True) -> frozenset[str]:
    """The steps a redistribution may take: without AlltoAll (set_auto_parallel_context(enable_alltoall=False)) a
    split moved to another dim is gathered and sliced instead (MindSpore's AllGather, Split and Concat)."""
    return ALL_STEPS if alltoall else ALL_STEPS - {"all_to_all"}


@lru_cache(maxsize=4096)
def plan(
    source: Layout, target: Layout, shape: tuple[int, ...], itemsize: int = 4, kinds: frozenset[str] = ALL_STEPS
) -> Redistribution:
    """The cheapest way from `source` to `target` for a tensor of global `shape` (cached). `kinds` limits the
    steps to a subset of the table (a backend without AlltoAll: `ALL_STEPS - {"all_to_all"}`)."""
    source.check(shape, "source")
    target.check(shape, "target")
    if source.device_num != target.device_num:
        raise ValueError(f"cannot redistribute between {source.device_num} and {target.device_num} devices")
    if set(target.refined.partial_axes) - set(source.refined.partial_axes) and not target.same_as(source):
        raise ValueError(f"cannot create partial results: {source} -> {target}")
    a, b = source.refined, target.refined
    if a.device_matrix == b.device_matrix:
        segments = (_search(a, b, shape, itemsize, kinds),)
    else:
        if target.partial:
            raise ValueError(f"cannot keep partial results across device matrices: {source} -> {target}")
        # Different refinements (e.g. 2x3 and 3x2): meet at the replicated layout, which every mesh shares.
        middle = Layout.from_axes(a.device_matrix, ((),) * len(shape))
        landing = Layout.from_axes(b.device_matrix, ((),) * len(shape))
        segments = (_search(a, middle, shape, itemsize, kinds), _search(landing, b, shape, itemsize, kinds))
    return Redistribution(source, target, tuple(shape), segments, sum(seg.cost for seg in segments))


def redistribution_cost(source: Layout, target: Layout, shape: tuple[int, ...], itemsize: int = 4) -> float:
    """The planner's cost of redistributing (bytes-equivalent), for strategy search."""
    return 0.0 if source.same_as(target) else plan(source, target, tuple(shape), itemsize).cost


# --- emitting the steps into a rank's graph ---------------------------------------------------------------------------

Emit = Callable[[str, tuple, dict, Layout], object]


def emit_steps(redistribution: Redistribution, value, rank: int, emit: Emit):
    """Append `rank`'s nodes for every step; `emit(op, inputs, attrs, layout)` adds one node and returns its output
    (a Value); returns the final value."""
    shape = redistribution.shape
    for segment in redistribution.segments:
        mesh = DeviceMesh(segment.device_matrix)
        state = _first_layout(redistribution, segment)  # segment.layouts hold the state *after* each step
        for step, after in zip(segment.steps, segment.layouts):
            value = _emit_step(step, value, state.local_shape(shape), mesh, rank, after, emit)
            state = after
    return value


def _first_layout(redistribution: Redistribution, segment: Segment) -> Layout:
    if segment is redistribution.segments[0]:
        return redistribution.source.refined
    return Layout.from_axes(segment.device_matrix, ((),) * len(redistribution.shape))


def _emit_step(step: Step, value, local: tuple[int, ...], mesh: DeviceMesh, rank: int, layout: Layout, emit: Emit):
    group = mesh.group(rank, step.axes)
    if step.kind == "all_reduce":
        return emit("AllReduce", (value,), {"reduce_op": step.op, "group": group}, layout)
    if step.kind == "reduce_scatter":
        return emit("ReduceScatter", (value,), {"reduce_op": step.op, "group": group, "axis": step.dim}, layout)
    if step.kind == "all_gather":
        return emit("AllGather", (value,), {"group": group, "axis": step.dim}, layout)
    if step.kind == "all_to_all":
        attrs = {"group": group, "split_dim": step.to_dim, "concat_dim": step.dim}
        return emit("AlltoAll", (value,), attrs, layout)
    n = len(group)
    part = local[step.dim] // n
    index = mesh.block(rank, step.axes)
    begin, end = [None] * len(local), [None] * len(local)
    begin[step.dim], end[step.dim] = index * part, (index + 1) * part
    attrs = {"begin": tuple(begin), "end": tuple(end), "strides": (1,) * len(local)}
    return emit("StridedSlice", (value,), attrs, layout)
