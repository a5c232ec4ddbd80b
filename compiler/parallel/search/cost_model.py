"""The α–β cost model the strategy search prices plans with: what a device computes per second, what a collective
costs on the links it crosses, what a redistribution between two layouts costs.

A `CostModel` is a frozen value the coordinator fills from what the daemons measured at registration (matrix
throughput, memory bandwidth, memory size) and from a link probe (latency α and bandwidth β of shared memory within a
host and of TCP between hosts); `default_cpu()` gives plausible figures for a laptop or CI machine:

    >>> model = CostModel.from_measurements(
    ...     [DeviceMeasurement("host-a", 4e10, 1.2e10, 16 << 30), DeviceMeasurement("host-b", 3e10, 1e10, 16 << 30)],
    ...     {"shared_memory": Link(20e-6, 8e9), "tcp": Link(60e-6, 1.1e9)},
    ... )
    >>> model.collective_time("all_reduce", (0, 1), 4 << 20)      # the two ranks sit on two hosts: TCP

Collectives are priced after the algorithms tessel's CPU plugin runs (plugins/cpu/shm.py, shm_pipelines.py,
tcp_algorithms.py, tcp_agree.py), per member, n = group size, b = the member's input bytes:

    kind            TCP (between hosts)                               shared memory (one host)
    all_reduce      b <= 64 KiB: data rides Bruck's agreement,        b small: 1 round, reads every copy  n·b
                    ceil(log2 n) rounds, (n-1)·b; else ring           else pipelined reduce-scatter +
                    reduce-scatter + all-gather, 2(n-1) steps,        all-gather, a round per segment,
                    2(n-1)/n·b                                        2(n-1)/n·b
    all_gather      ring, n-1 steps, (n-1)·b                          2 rounds, (n-1)·b
    reduce_scatter  ring, n-1 steps, (n-1)/n·b                        n rounds, (n-1)/n·b
    all_to_all      pairwise, n-1 steps, (n-1)/n·b                    2 rounds, (n-1)/n·b
    broadcast       pipelined chain, n-1 steps, b                     2 rounds, b

plus, on TCP, the agreement step every collective starts with (ceil(log2 n) rounds). A collective whose group spans
hosts runs at TCP's α and β (the slowest link of a ring paces it); one inside a host at shared memory's. Its first
round, which waits for every member to arrive, costs at least `collective_latency`: one small collective over the
job's ranks as the coordinator probed it among their daemons (the same figure for every group of the job: an upper
bound for a group of fewer ranks).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from tessel.compiler.parallel.layout import Layout, Partial, Replicate, Shard
from tessel.compiler.parallel.mesh import DeviceMesh
from tessel.compiler.registry import Cost
from tessel.core.errors import ConfigurationError

TCP_SMALL_BYTES = 64 << 10  # tcp_communicator.SMALL_BYTES: data up to this size rides with the agreement step
SHM_SMALL_BYTES = 192 << 10  # ShmCommunicator.small_bytes at 4 ranks: the one-round all_reduce up to this size
SHM_CHUNK_BYTES = 512 << 10  # shm_pipelines: an all_reduce segment is size * chunk bytes
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


@dataclass(frozen=True)
class Link:
    """One kind of link: α = seconds per message round (latency), β = bytes per second (bandwidth)."""

    latency: float
    bandwidth: float

    def __post_init__(self):
        if self.latency < 0 or self.bandwidth <= 0:
            raise ConfigurationError(f"a link needs latency >= 0 and bandwidth > 0, got {self}")


@dataclass(frozen=True)
class DeviceMeasurement:
    """What a daemon reports at registration: its host, matrix throughput (flop/s), memory bandwidth (bytes/s)
    and memory size (bytes); optionally its runtime's overheads (seconds per op, per segment launch) and per-op
    calibration factors (an op's measured forward + backward time over the model's price for it)."""

    host: str
    matmul_flops: float
    memory_bandwidth: float
    memory_bytes: int
    op_overhead: float | None = None
    launch_overhead: float | None = None
    op_factors: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class CostModel:
    """Per-device speeds, the two link kinds and where ranks live (`hosts[r]` = rank r's host index; empty: one
    host). Every rank runs the same program (SPMD), so the slowest device paces a step: `from_measurements` keeps
    the minimum throughput, bandwidth and memory over the devices.

    - `op_overhead`: seconds a kernel launch costs whatever its size (ONNX Runtime's per-node dispatch);
    - `parameter_bytes_factor`: bytes held per byte of parameter (weights + gradients = 2; + momentum = 3; Adam 4);
    - `bucket_bytes`: gradients are all-reduced in buckets of about this size (buckets.DEFAULT_BUCKET_BYTES);
    - `launch_overhead`: seconds one segment launch costs (a runtime call): a step launches one segment, plus one
      more after every collective;
    - `op_factors`: (op, factor) pairs measured on the devices: an op's real forward + backward time over what the
      flop/byte model prices (a convolution's backward runs far below the GEMM rate; 1 = as priced, the default);
    - `collective_latency`: seconds one small collective takes over the job's ranks, probed among their daemons
      (0: not measured). A link's latency is a ping-pong between two threads that are both running; a collective
      also waits for every member to arrive, and where a host runs more busy threads than it has cores (4 ranks on
      2 cores, other work) members are descheduled and each collective waits for the last of them: measured here at
      1-7 ms against a 5-30 µs link latency. It replaces the first round's latency of every collective when larger.
    - `alltoall`: whether redistributions may use AlltoAll (set_auto_parallel_context(enable_alltoall)); without it
      a split moved to another dim is gathered whole and sliced, as the partitioner then emits it.
    """

    flops_per_second: float
    memory_bandwidth: float
    memory_bytes: int
    shared_memory: Link
    tcp: Link
    hosts: tuple[int, ...] = ()
    op_overhead: float = 5e-6
    parameter_bytes_factor: float = 2.0
    bucket_bytes: int = 25 << 20
    launch_overhead: float = 0.0
    op_factors: tuple[tuple[str, float], ...] = ()
    collective_latency: float = 0.0
    alltoall: bool = True

    def __post_init__(self):
        if self.flops_per_second <= 0 or self.memory_bandwidth <= 0 or self.memory_bytes <= 0:
            raise ConfigurationError(f"a cost model needs positive throughput, bandwidth and memory, got {self}")
        factors = tuple(sorted((str(op), float(f)) for op, f in dict(self.op_factors).items()))
        overheads = (self.launch_overhead, self.op_overhead, self.collective_latency)
        if any(f <= 0 for _, f in factors) or min(overheads) < 0:
            raise ConfigurationError(f"op factors must be > 0 and overheads and latencies >= 0, got {self}")
        object.__setattr__(self, "op_factors", factors)
        object.__setattr__(self, "_factor", dict(factors))

    # --- constructors -----------------------------------------------------------------------------------------------
    @staticmethod
    def default_cpu(device_num: int = 1, devices_per_host: int | None = None) -> CostModel:
        """Plausible figures for CPU daemons sharing a laptop-class host: 10 Gflop/s and 8 GB/s per device, 8 GiB
        each, shared memory at 20 µs / 8 GB/s (measured 10-37 GB/s for large copies), TCP at 50 µs / 1.25 GB/s
        (10 GbE). `devices_per_host` ranks per host, numbered host by host (None: all on one host)."""
        hosts = () if devices_per_host is None else tuple(r // devices_per_host for r in range(device_num))
        return CostModel(1e10, 8e9, 8 << 30, Link(20e-6, 8e9), Link(50e-6, 1.25e9), hosts)

    @staticmethod
    def from_measurements(
        devices: Sequence[DeviceMeasurement], links: Mapping[str, Link], **options: float
    ) -> CostModel:
        """The model of a job's ranks: `devices[r]` is rank r's daemon; `links` holds "shared_memory" and "tcp"
        as probed (either may be missing when no two ranks share a host, or no two are apart: it then keeps the
        default). Extra keyword options set the other fields (op_overhead, parameter_bytes_factor, bucket_bytes,
        collective_latency)."""
        if not devices:
            raise ConfigurationError("from_measurements needs at least one device")
        unknown = set(links) - {"shared_memory", "tcp"}
        if unknown:
            raise ConfigurationError(f"unknown link kinds {sorted(unknown)}; measure 'shared_memory' and 'tcp'")
        default = CostModel.default_cpu()
        names: dict[str, int] = {}
        hosts = tuple(names.setdefault(d.host, len(names)) for d in devices)
        measured: dict[str, object] = {}  # the slowest device's overheads and factors: it paces every step
        for name in ("op_overhead", "launch_overhead"):
            values = [getattr(d, name) for d in devices if getattr(d, name) is not None]
            if values:
                measured[name] = max(values)
        factors: dict[str, float] = {}
        for d in devices:
            for op, factor in d.op_factors:
                factors[op] = max(factor, factors.get(op, 0.0))
        if factors:
            measured["op_factors"] = tuple(factors.items())
        return CostModel(
            min(d.matmul_flops for d in devices),
            min(d.memory_bandwidth for d in devices),
            min(d.memory_bytes for d in devices),
            links.get("shared_memory", default.shared_memory),
            links.get("tcp", default.tcp),
            hosts if len(names) > 1 else (),
            **{**measured, **options},
        )

    # --- prices -----------------------------------------------------------------------------------------------------
    def compute_time(self, cost: Cost, op: str | None = None) -> float:
        """Seconds one device takes for an op of this cost: bound by flops or by memory traffic, times the op's
        measured factor (when `op` is named and has one)."""
        seconds = max(cost.flops / self.flops_per_second, cost.bytes / self.memory_bandwidth)
        if op is not None:
            seconds *= self._factor.get(op, 1.0)
        return seconds + self.op_overhead

    def copy_time(self, nbytes: float) -> float:
        """A local copy (a StridedSlice): read and write every byte."""
        return 2 * nbytes / self.memory_bandwidth if nbytes else 0.0

    def spans_hosts(self, ranks: Sequence[int]) -> bool:
        if not self.hosts:
            return False
        if max(ranks) >= len(self.hosts):
            raise ConfigurationError(
                f"rank {max(ranks)} is outside the {len(self.hosts)} ranks this cost model describes; build it "
                "from the job's devices (from_measurements) or with default_cpu(device_num, devices_per_host)"
            )
        return len({self.hosts[r] for r in ranks}) > 1

    def collective_cost(self, kind: str, ranks: Sequence[int], nbytes: float) -> tuple[float, float]:
        """(latency seconds, bandwidth seconds) of a collective of `kind` over `ranks`, each member holding
        `nbytes` of input."""
        n = len(ranks)
        if n <= 1 or nbytes <= 0:
            return 0.0, 0.0
        if self.spans_hosts(ranks):
            rounds, sent = _tcp(kind, n, nbytes)
            link = self.tcp
        else:
            rounds, sent = _shared_memory(kind, n, nbytes)
            link = self.shared_memory
        first = max(link.latency, self.collective_latency)  # the round every member must arrive for
        return first + (rounds - 1) * link.latency, sent / link.bandwidth

    def collective_time(self, kind: str, ranks: Sequence[int], nbytes: float) -> float:
        """Seconds a collective of `kind` over `ranks` takes when each member holds `nbytes` of input."""
        return sum(self.collective_cost(kind, ranks, nbytes))

    def group_cost(
        self, kind: str, device_matrix: tuple[int, ...], axes: tuple[int, ...], nbytes: float
    ) -> tuple[float, float]:
        """A collective over mesh `axes` of `device_matrix`: every group of them runs at once, so the slowest
        group (the one crossing hosts, if any) sets the time. (latency seconds, bandwidth seconds)."""
        if not axes or nbytes <= 0:
            return 0.0, 0.0
        groups = _groups(device_matrix, axes, self.hosts)
        return max((self.collective_cost(kind, group, nbytes) for group in groups), key=sum)

    def group_time(self, kind: str, device_matrix: tuple[int, ...], axes: tuple[int, ...], nbytes: float) -> float:
        return sum(self.group_cost(kind, device_matrix, axes, nbytes))

    def redistribution_time(self, source: Layout, target: Layout, shape: tuple[int, ...], itemsize: int) -> float:
        """Seconds to take a tensor of global `shape` from `source` to `target` (see `_redistribution_time`)."""
        return _redistribution_time(self, source, target, tuple(shape), itemsize)


def _tcp(kind: str, n: int, b: float) -> tuple[float, float]:
    """(latency rounds, bytes each member sends) of one collective over TCP."""
    agree = math.ceil(math.log2(n))
    if kind in ("all_reduce", "all_gather", "reduce_scatter") and b <= TCP_SMALL_BYTES:
        return agree, (n - 1) * b  # every member's data rides Bruck's all-gather of the descriptors
    table = {
        "all_reduce": (2 * (n - 1), 2 * (n - 1) / n * b),
        "all_gather": (n - 1, (n - 1) * b),
        "reduce_scatter": (n - 1, (n - 1) / n * b),
        "all_to_all": (n - 1, (n - 1) / n * b),
        "broadcast": (n - 1, b),
    }
    rounds, sent = table[kind]
    return agree + rounds, sent


def _shared_memory(kind: str, n: int, b: float) -> tuple[float, float]:
    """(latency rounds, bytes each member copies) of one collective over shared memory."""
    if kind == "all_reduce":
        if b <= SHM_SMALL_BYTES:
            return 1, n * b
        return math.ceil(b / (n * SHM_CHUNK_BYTES)) + 1, 2 * (n - 1) / n * b
    table = {
        "all_gather": (2, (n - 1) * b),
        "reduce_scatter": (n, (n - 1) / n * b),
        "all_to_all": (2, (n - 1) / n * b),
        "broadcast": (2, b),
    }
    return table[kind]


@lru_cache(maxsize=4096)
def _groups(device_matrix: tuple[int, ...], axes: tuple[int, ...], hosts: tuple[int, ...]) -> tuple[tuple[int, ...]]:
    """One representative group per distinct set of hosts it touches (enough to find the slowest group)."""
    mesh = DeviceMesh(device_matrix)
    if not hosts:
        return (mesh.group(0, axes),)
    seen: dict[frozenset, tuple[int, ...]] = {}
    done: set[int] = set()
    for rank in range(mesh.size):
        if rank in done:
            continue
        group = mesh.group(rank, axes)
        done.update(group)
        seen.setdefault(frozenset(hosts[r] for r in group), group)
    return tuple(seen.values())


@lru_cache(maxsize=1 << 16)
def _redistribution_time(model: CostModel, source: Layout, target: Layout, shape: tuple, itemsize: int) -> float:
    """A closed form of what redistribution.plan runs, priced with the model (the search calls this thousands of
    times; planning each move exactly takes milliseconds on a large mesh). Per prime axis of the common refined
    device matrix: partial -> replicated is an AllReduce, partial -> split a ReduceScatter, split -> replicated an
    AllGather, split(d) -> split(e) (or the same dim in another order) an AlltoAll, replicated -> split a local
    slice. Each kind runs as one collective over all its axes, in the order that moves the fewest bytes: reduce,
    slice, exchange, gather. Matrices that do not refine alike meet at the replicated layout. Without AlltoAll
    (`model.alltoall` False) an exchange is a gather and a local slice."""
    if source.same_as(target):
        return 0.0
    a, b = source.refined, target.refined
    nbytes = math.prod(a.local_shape(shape)) * itemsize
    if a.device_matrix != b.device_matrix:
        replicated = Layout.from_axes(a.device_matrix, ((),) * len(shape))
        gather = _redistribution_time(model, source, replicated, shape, itemsize)
        return gather + model.copy_time(math.prod(shape) * itemsize)
    matrix = a.device_matrix
    kinds: dict[str, list[int]] = {
        "all_reduce": [],
        "reduce_scatter": [],
        "slice": [],
        "all_to_all": [],
        "gather": [],
        "slice_after": [],
    }
    for axis, (have, want) in enumerate(zip(a.placements, b.placements)):
        if have == want and not _reordered(a, b, axis):
            continue
        if isinstance(have, Partial):
            kinds["reduce_scatter" if isinstance(want, Shard) else "all_reduce"].append(axis)
        elif isinstance(have, Replicate):
            kinds["slice"].append(axis)
        elif isinstance(want, Shard) and model.alltoall:
            kinds["all_to_all"].append(axis)
        elif isinstance(want, Shard):  # gathered whole along the axis, then the new split sliced from it
            kinds["gather"].append(axis)
            kinds["slice_after"].append(axis)
        else:
            kinds["gather"].append(axis)
    size = lambda axes: math.prod(matrix[x] for x in axes)  # noqa: E731
    seconds = model.group_time("all_reduce", matrix, tuple(kinds["all_reduce"]), nbytes)
    seconds += model.group_time("reduce_scatter", matrix, tuple(kinds["reduce_scatter"]), nbytes)
    nbytes /= size(kinds["reduce_scatter"])
    if kinds["slice"]:
        nbytes /= size(kinds["slice"])
        seconds += model.copy_time(nbytes)
    seconds += model.group_time("all_to_all", matrix, tuple(kinds["all_to_all"]), nbytes)
    seconds += model.group_time("all_gather", matrix, tuple(kinds["gather"]), nbytes)
    if kinds["slice_after"]:
        seconds += model.copy_time(nbytes * size(kinds["gather"]) / size(kinds["slice_after"]))
    return seconds


def is_local_slice(source: Layout, target: Layout) -> bool:
    """True when going from `source` to `target` only slices what every rank already holds (each device axis that
    changes is replicated in `source`): a local StridedSlice, no collective. Its price (`copy_time`) is compute,
    not communication; its transpose is not (the gradient of a sliced value must be gathered back)."""
    if source.same_as(target):
        return True
    a, b = source.refined, target.refined
    if a.device_matrix != b.device_matrix:
        return all(isinstance(have, Replicate) for have in a.placements)
    for axis, (have, want) in enumerate(zip(a.placements, b.placements)):
        if (have != want or _reordered(a, b, axis)) and not isinstance(have, Replicate):
            return False
    return True


def clear_caches() -> None:
    """Forget the remembered groups and redistribution prices."""
    _groups.cache_clear()
    _redistribution_time.cache_clear()


def _reordered(a: Layout, b: Layout, axis: int) -> bool:
    """True when `axis` splits the same dim in both layouts but at another position among that dim's axes (the
    blocks land on other ranks: the data must move)."""
    for have, want in zip(a.dim_axes, b.dim_axes):
        if axis in have and axis in want:
            return have[: have.index(axis) + 1] != want[: want.index(axis) + 1]
    return False
