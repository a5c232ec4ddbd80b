"""The plugin contract: the two small interfaces every hardware plugin implements (the same for CPU, GPU and
Ascend), and the lookup that finds plugins through the `tessel.plugins` entry-point group.

A plugin package exposes one `Plugin` subclass through the `tessel.plugins` entry-point group. It reports
whether it can run here (`available()` with a reason), describes its device, and hands out a `ComputePlugin`
(ONNX executables on the device) and a `CollectivePlugin` (communicators over groups of ranks).
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

import numpy as np

from tessel.core.errors import ConfigurationError, MissingRuntimeError
from tessel.core.wire import COLLECTIVE_DTYPES, REDUCE_OPS

__all__ = [  # the contract, and the wire tables plugins check against
    "COLLECTIVE_DTYPES",
    "GROUP",
    "REDUCE_OPS",
    "CollectivePlugin",
    "Communicator",
    "ComputePlugin",
    "DeviceInfo",
    "Done",
    "Executable",
    "GroupContext",
    "Handle",
    "LinkMeasurement",
    "Measurement",
    "Peer",
    "Plugin",
    "available_plugins",
    "load_plugin",
    "plugin_class",
]


@dataclass(frozen=True)
class Peer:
    """One member of a group as seen by the data plane."""

    rank: int  # global rank in the job
    host_id: str  # equal host ids <=> shared memory reaches the peer
    data_address: str  # "host:port" of the peer daemon's TCP data plane
    pid: int  # the peer daemon's process id (liveness check on the same host)
    plugin: str = ""  # the peer daemon's plugin: ranks of one host and one plugin form a hierarchical group's part


def _never_aborted() -> str | None:
    return None


@dataclass(frozen=True)
class GroupContext:
    """Everything a communicator needs to know about its group. Group rank i is `ranks[i]`."""

    job_id: str
    name: str
    ranks: tuple[int, ...]  # global ranks, in group-rank order
    rank: int  # this process's global rank
    peers: tuple[Peer, ...]  # same order as `ranks`
    # Longest a collective waits for a live peer to arrive; dead peers are detected far sooner.
    timeout_s: float = 300.0
    # Polled while waiting: returns the cause once the job has failed elsewhere (set by the daemon from the
    # coordinator's heartbeat events), so a wait ends within a heartbeat instead of at the timeout.
    abort: Callable[[], str | None] = field(default=_never_aborted, compare=False, repr=False)
    # Random per job and the same on every member (the coordinator draws it): job ids repeat across coordinators
    # and over time, so names shared on a host (shared-memory segments) include this to stay apart between jobs.
    job_nonce: str = ""
    # How many of the job's ranks run on this host (0: not known). Where each has a core of its own, a waiter on a
    # communicator's thread may poll on the core its program leaves idle while it waits (program_waits()).
    local_ranks: int = 0

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def group_rank(self) -> int:
        return self.ranks.index(self.rank)


_worker = threading.local()

# A program thread blocked in Handle.wait() leaves the core it computes on idle, and the communicator's thread
# running the call it waits for may poll there instead of sleeping (plugins/cpu/shm_sync.py). The poller holds the
# GIL but for a moment each round, so a thread that needs it could wait up to the interpreter's switch interval:
# hence only for the call the program waits for (the program, woken by the result, must not find the next call's
# poller in its way), and only while no other communicator thread of the process runs Python (one asleep on a futex
# or a socket, inside `asleep()`, does not). A communicator thread asleep already is woken through the hooks when
# a program starts waiting, so that it can turn to polling.
_wait_hooks: list[Callable[[], None]] = []
_AWAITED = 2  # index, in an asynchronous call's times list, of the flag Handle.wait sets
_active_lock = threading.Lock()
_active = [0]  # communicators' threads running a call, less those inside asleep()


def program_waits() -> bool:
    """On a communicator's thread: whether a program thread is blocked waiting for the call running here, while no
    other communicator thread runs Python."""
    times = getattr(_worker, "current", None)
    return bool(times and times[_AWAITED]) and _active[0] <= 1


def _count_active(delta: int) -> None:
    with _active_lock:
        _active[0] += delta


@contextmanager
def asleep() -> Iterator[None]:
    """Around a communicator thread's wait that holds no GIL (a futex, a socket): meanwhile it leaves another
    thread free to poll (program_waits). Elsewhere it does nothing."""
    if not on_collective_thread():
        yield
        return
    _count_active(-1)
    try:
        yield
    finally:
        _count_active(1)


def on_program_wait(hook: Callable[[], None]) -> None:
    """Call `hook` (cheap, never raising) each time a program thread starts to wait for an unfinished result."""
    _wait_hooks.append(hook)


def on_collective_thread() -> bool:
    """True on a communicator's background thread (asynchronous collectives), where the daemon's compute runs
    meanwhile on the other threads: a waiter there should block rather than spin, so that compute threads plus
    collective threads stay within the host's cores."""
    return getattr(_worker, "collective", False)


_GROUP = object()  # _submit's default lane: found from the call


def _mark_collective_thread(communicator: Communicator) -> None:
    _worker.collective = True
    _worker.communicator = weakref.ref(communicator)  # whose thread this is (Communicator._dispatch)


class Done:
    """A Handle's face for a result already there (a collective run at once): wait() returns it."""

    def __init__(self, value: Any, started: int, finished: int):
        self.value, self.started, self.finished = value, started, finished

    def wait(self, timeout: float | None = None) -> Any:
        return self.value

    def done(self) -> bool:
        return True


class Handle:
    """Result of an asynchronous collective: `wait()` returns its value or raises its error. `started` and
    `finished` are the wall-clock times (time.time_ns()) at which the communicator's thread began and ended it
    (0 until then): the timeline shows them."""

    def __init__(self, future: Future, times: list[int] | None = None):
        self._future = future
        self._times = times if times is not None else [0, 0]

    def wait(self, timeout: float | None = None) -> Any:
        self._awaited()
        return self._future.result(timeout)

    def settle(self) -> None:
        """Wait until the call has ended, whatever its outcome (its error is for `wait` to raise). Through a done
        callback: it also runs for a call that close() cancelled, which concurrent.futures.wait never sees end."""
        self._awaited()
        ended = threading.Event()
        self._future.add_done_callback(lambda _: ended.set())
        ended.wait()

    def _awaited(self) -> None:
        if not self._future.done() and len(self._times) > _AWAITED and not on_collective_thread():
            self._times[_AWAITED] = 1  # see program_waits
            for hook in list(_wait_hooks):
                hook()

    def done(self) -> bool:
        return self._future.done()

    @property
    def awaited(self) -> bool:
        """Whether a program thread started waiting for this call before it finished (program_waits)."""
        return len(self._times) > _AWAITED and bool(self._times[_AWAITED])

    @property
    def started(self) -> int:
        return self._times[0]

    @property
    def finished(self) -> int:
        return self._times[1]


def _timed(fn: Callable[..., Any], times: list[int], args: tuple, kwargs: dict) -> Any:
    times[0] = time.time_ns()
    _worker.current = times  # the call running on this communicator's thread (program_waits)
    _count_active(1)
    try:
        return fn(*args, **kwargs)
    finally:
        _count_active(-1)
        _worker.current = None
        times[1] = time.time_ns()


class Communicator(ABC):
    """Collectives over one group. Ranks in arguments (root, peer, send/recv ranks) are group ranks.

    Every method takes numpy arrays and returns new arrays (inputs are not modified). With `async_op=True`
    it returns a `Handle` instead; asynchronous group collectives run in issue order on one background thread per
    communicator, so every rank sees the same sequence, and asynchronous sends (receives) to (from) one peer on one
    thread per direction and peer, in issue order too. Before data moves, all participants compare what each
    is about to do; a disagreement raises `CollectiveMismatchError` on every rank, naming the culprit.
    """

    # The data path the plugin chose for this group ("shm", "tcp", "nccl", ...): the daemon's Status reports it.
    transport: str = ""
    # True when a collective keeps a core busy for all its duration (copies and reductions in shared memory), as
    # opposed to waiting on a link or a device: it then overlaps computation only where a core is free for it.
    compute_bound: bool = False

    def __init__(self, context: GroupContext):
        self.context = context
        self._async_lock = threading.Lock()
        self._async_worker: Any = None
        # Asynchronous sends and receives run on a thread per direction and peer ("lane"), in issue order within
        # it: a rank's isend to one peer and its irecv from another progress together (a ring), while its group
        # collectives keep one thread and their issue order.
        self._lanes: dict[tuple, Any] = {}
        self._last_async: dict[tuple | None, Handle] = {}  # lane -> the latest asynchronous call issued on it
        self._in_flight = 0  # asynchronous calls submitted and not finished (their results may still be unread)
        self._closed = False

    @property
    def size(self) -> int:
        return self.context.size

    @property
    def group_rank(self) -> int:
        return self.context.group_rank

    def _lane(self, fn: Callable[..., Any], args: tuple) -> tuple | None:
        """The lane of an asynchronous send or receive (its direction and peer, the last argument); None: a group
        collective."""
        if fn == self._send:
            return ("send", args[-1])
        if fn == self._recv:
            return ("recv", args[-1])
        return None

    def _submit(self, fn: Callable[..., Any], *args: Any, lane: Any = _GROUP, **kwargs: Any) -> Handle:
        """Queue fn(*args, **kwargs) on its thread: `lane` (default: `_lane(fn, args)`) names a send's or a
        receive's; None the group collectives'."""
        from concurrent.futures import ThreadPoolExecutor

        lane = self._lane(fn, args) if lane is _GROUP else lane
        with self._async_lock:
            if self._closed:
                raise ConfigurationError(
                    f"an asynchronous call on group {self.context.name!r}: the communicator is closed; create the "
                    "group again"
                )
            if lane is None:
                if self._async_worker is None:
                    self._async_worker = ThreadPoolExecutor(
                        1,
                        thread_name_prefix=f"tessel-coll-{self.context.name}",
                        initializer=_mark_collective_thread,
                        initargs=(self,),
                    )
                worker = self._async_worker
            else:
                worker = self._lanes.get(lane)
                if worker is None:
                    name = f"tessel-{lane[0]}-{self.context.name}-{lane[1]}"
                    worker = self._lanes[lane] = ThreadPoolExecutor(
                        1,
                        thread_name_prefix=name,
                        initializer=_mark_collective_thread,
                        initargs=(self,),
                    )
            times = [0, 0, 0]  # started, finished (time.time_ns()), awaited (Handle.wait)
            self._in_flight += 1
            future = worker.submit(_timed, fn, times, args, kwargs)
            handle = Handle(future, times)
            self._last_async[lane] = handle
        # Outside the lock: a call already finished runs its callback right here, and the callback takes the lock.
        # The callback holds the lane, not the handle: a handle it held would make a cycle with its future, and the
        # result (in a shared-memory arena) would wait for the garbage collector instead of going with the handle.
        future.add_done_callback(functools.partial(self._finished_async, lane))
        return handle

    def _finished_async(self, lane: tuple | None, future: Future) -> None:
        with self._async_lock:
            self._in_flight -= 1
            latest = self._last_async.get(lane)
            if latest is not None and latest._future is future:  # the lane's latest call is done: nothing to wait for
                del self._last_async[lane]

    def idle(self) -> bool:
        """Whether no asynchronous call of this communicator is queued or running: one made now on the calling
        thread keeps the issue order."""
        with self._async_lock:
            return self._in_flight == 0

    def _dispatch(self, async_op: bool, fn: Callable[..., Any], *args: Any) -> Any:
        """Run now, or queue on its thread. A synchronous call first waits for the asynchronous ones issued before
        it on its lane (the group's collectives; the sends to one peer; the receives from one), so every rank keeps
        issue order there; a send and a receive between two ranks may still overlap, and so may either and a group
        collective. On this communicator's own threads it does not wait: the latest call is the one running there.
        The earlier call's failure is not this one's: its handle reports it, and a group it broke fails this call
        too."""
        if async_op:
            return self._submit(fn, *args)
        owner = getattr(_worker, "communicator", None)
        if owner is None or owner() is not self:
            with self._async_lock:
                pending = self._last_async.get(self._lane(fn, args))
            if pending is not None:
                pending.settle()
        return fn(*args)

    def all_reduce(self, x: np.ndarray, op: str = "sum", async_op: bool = False) -> np.ndarray | Handle:
        return self._dispatch(async_op, self._all_reduce, x, op)

    def all_gather(self, x: np.ndarray, async_op: bool = False) -> np.ndarray | Handle:
        """Concatenate every rank's `x` along dim 0, in group-rank order (MindSpore's AllGather)."""
        return self._dispatch(async_op, self._all_gather, x)

    def reduce_scatter(self, x: np.ndarray, op: str = "sum", async_op: bool = False) -> np.ndarray | Handle:
        """Reduce over ranks, then give group rank i block i of dim 0 (dim 0 must divide by the group size)."""
        return self._dispatch(async_op, self._reduce_scatter, x, op)

    def broadcast(self, x: np.ndarray, root: int = 0, async_op: bool = False) -> np.ndarray | Handle:
        return self._dispatch(async_op, self._broadcast, x, root)

    def all_to_all(
        self, x: np.ndarray, split_dim: int = 0, concat_dim: int = 0, async_op: bool = False
    ) -> np.ndarray | Handle:
        """Split `x` along split_dim into `size` blocks, send block i to rank i, concat received on concat_dim."""
        return self._dispatch(async_op, self._all_to_all, x, split_dim, concat_dim)

    def neighbor_exchange(
        self,
        sends: Sequence[np.ndarray],
        send_ranks: Sequence[int],
        recv_ranks: Sequence[int],
        recv_shapes: Sequence[Sequence[int]],
        recv_dtype: np.dtype,
        async_op: bool = False,
    ) -> list[np.ndarray] | Handle:
        """Send sends[i] to send_ranks[i]; receive one tensor of recv_shapes[j] from each recv_ranks[j]."""
        args = (list(sends), list(send_ranks), list(recv_ranks), [tuple(s) for s in recv_shapes], np.dtype(recv_dtype))
        return self._dispatch(async_op, self._neighbor_exchange, *args)

    def send(self, x: np.ndarray, peer: int, async_op: bool = False) -> Handle | None:
        return self._dispatch(async_op, self._send, x, peer)

    def recv(self, shape: Sequence[int], dtype: np.dtype, peer: int, async_op: bool = False) -> np.ndarray | Handle:
        return self._dispatch(async_op, self._recv, tuple(shape), np.dtype(dtype), peer)

    def barrier(self, async_op: bool = False) -> Handle | None:
        return self._dispatch(async_op, self._barrier)

    def close(self) -> None:
        """Release the group's resources (shared memory, sockets). Idempotent; later asynchronous calls raise."""
        with self._async_lock:  # no thread is made after this
            self._closed = True
            workers = [w for w in (self._async_worker, *self._lanes.values()) if w is not None]
            self._async_worker, self._lanes, self._last_async = None, {}, {}
        for worker in workers:
            worker.shutdown(wait=False, cancel_futures=True)

    @abstractmethod
    def _all_reduce(self, x: np.ndarray, op: str) -> np.ndarray: ...

    @abstractmethod
    def _all_gather(self, x: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def _reduce_scatter(self, x: np.ndarray, op: str) -> np.ndarray: ...

    @abstractmethod
    def _broadcast(self, x: np.ndarray, root: int) -> np.ndarray: ...

    @abstractmethod
    def _all_to_all(self, x: np.ndarray, split_dim: int, concat_dim: int) -> np.ndarray: ...

    @abstractmethod
    def _neighbor_exchange(
        self,
        sends: list[np.ndarray],
        send_ranks: list[int],
        recv_ranks: list[int],
        recv_shapes: list[tuple[int, ...]],
        recv_dtype: np.dtype,
    ) -> list[np.ndarray]: ...

    @abstractmethod
    def _send(self, x: np.ndarray, peer: int) -> None: ...

    @abstractmethod
    def _recv(self, shape: tuple[int, ...], dtype: np.dtype, peer: int) -> np.ndarray: ...

    @abstractmethod
    def _barrier(self) -> None: ...


class CollectivePlugin(ABC):
    """Hands out communicators. `new_group` is called by every member of the group (a rendezvous)."""

    @abstractmethod
    def new_group(self, context: GroupContext) -> Communicator: ...

    def probe_link(self, data_address: str) -> LinkMeasurement | None:
        """Latency and bandwidth of this data plane to the daemon whose data plane listens at `data_address`
        (the coordinator asks for it between two hosts); None when the plugin cannot probe."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release process-wide resources (listening sockets, thread pools)."""

    def deadlines(self) -> str:
        """The plugin's own deadlines in words (e.g. "data-plane connect 5 s"), for the daemon's start-up line."""
        return ""


class Executable(ABC):
    """A compiled ONNX graph on one device."""

    input_names: tuple[str, ...]
    output_names: tuple[str, ...]


class ComputePlugin(ABC):
    """Runs ONNX graphs on the plugin's device. Filled in by the compiler issue."""

    @abstractmethod
    def compile(self, onnx_bytes: bytes) -> Executable: ...

    @abstractmethod
    def run(self, executable: Executable, inputs: dict[str, Any]) -> list[Any]: ...

    def to_device(self, array: np.ndarray) -> Any:
        return array

    def to_host(self, value: Any) -> np.ndarray:
        return np.asarray(value)

    def release_memory(self) -> None:
        """Give memory the device keeps for reuse between runs back (the daemon calls it once its last job ended)."""
        return None


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cpu", "NVIDIA H200", ...
    device_id: int
    cores: int
    memory_bytes: int
    speed: float = 1.0  # relative to the reference CPU; the coordinator balances batches by it


@dataclass(frozen=True)
class Measurement:
    """What a plugin measured its device doing, once, when its daemon started (reported at registration; the
    coordinator's cost model is calibrated with it). Rates are per second; 0 = not measured."""

    matmul_flops: float  # fp32 matrix-product flop/s with the daemon's threads
    memory_bandwidth: float  # bytes read plus written per second by a large copy
    shm_latency_s: float = 0.0  # one-way latency of a message through shared memory on this host
    shm_bandwidth: float = 0.0  # bytes per second copied into shared memory
    seconds: float = 0.0  # how long measuring took
    op_overhead_s: float = 0.0  # the runtime's extra time per op of a program
    launch_overhead_s: float = 0.0  # the runtime's time per program run (a segment launch)


@dataclass(frozen=True)
class LinkMeasurement:
    """A probed link between two daemons: one-way latency (seconds) and bandwidth (bytes per second)."""

    latency_s: float
    bandwidth: float


class Plugin(ABC):
    """One hardware plugin, found through the `tessel.plugins` entry-point group."""

    name: str = ""
    # Whether every device index of this plugin on one host is the same hardware (the cpu plugin's "devices" share
    # the host's cores), so that what one daemon calibrated holds for another with the same thread count.
    interchangeable_devices: bool = False

    @classmethod
    @abstractmethod
    def available(cls) -> tuple[bool, str]:
        """(True, "") when it can run here, else (False, why and what to install)."""

    @abstractmethod
    def __init__(self, device_id: int = 0, threads: int = 1, host: str = "127.0.0.1", advertise_host: str = ""):
        """`host`: the address the plugin's data plane listens on (the daemon's --host); `advertise_host`: the
        address peers dial to reach it (default `host`; needed when `host` is a wildcard such as 0.0.0.0)."""

    @property
    @abstractmethod
    def device(self) -> DeviceInfo: ...

    @property
    @abstractmethod
    def compute(self) -> ComputePlugin: ...

    @property
    @abstractmethod
    def collective(self) -> CollectivePlugin: ...

    @property
    def host_transport(self) -> CollectivePlugin | None:
        """The collectives that join this plugin's groups to other hosts and other plugins: shared memory within a
        host, TCP between hosts (the cpu plugin's, which is its own collective). None (the default): this plugin's
        collectives reach only devices of its own kind, and the daemon joins its groups to the others through the
        cpu plugin's host transport. See daemon/hierarchy.py."""
        return None

    def measure(self) -> Measurement | None:
        """Measure the device now (a fraction of a second; the daemon calls it once at start). None: this plugin
        measures nothing, and the coordinator keeps its default figures for its daemons."""
        return None

    def close(self) -> None:
        self.collective.close()


# --- finding plugins ----------------------------------------------------------------------------------------------

GROUP = "tessel.plugins"


def _entry_points() -> dict:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def plugin_class(name: str) -> type[Plugin]:
    """The plugin class named `name` in the `tessel.plugins` entry-point group, or at `module:Class` (a plugin not
    installed as a package, e.g. one a test defines: tessel daemon --plugin my_plugins:FastCpu)."""
    if ":" in name:
        return _plugin_at(name)
    found = _entry_points()
    if name not in found:
        raise ConfigurationError(
            f"no tessel plugin named {name!r}; installed: {sorted(found)}. "
            f"A plugin registers itself in the {GROUP!r} entry-point group (pip install it, or pick one listed)."
        )
    return found[name].load()


def _plugin_at(path: str) -> type[Plugin]:
    import importlib

    module_name, _, attribute = path.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(
            f"plugin {path!r}: cannot load {attribute!r} from module {module_name!r} ({exc}); a plugin given as "
            "module:Class must be importable (on PYTHONPATH) and name a tessel.core.plugin.Plugin subclass"
        ) from None
    if not (isinstance(found, type) and issubclass(found, Plugin)) or not found.name:
        raise ConfigurationError(
            f"plugin {path!r} is {found!r}, not a tessel.core.plugin.Plugin subclass with a name; subclass Plugin "
            "(or a plugin such as tessel.plugins.cpu.CpuPlugin) and set its `name`"
        )
    return found


def available_plugins() -> dict[str, tuple[bool, str]]:
    """Every installed plugin with (available, reason)."""
    result = {}
    for name, ep in sorted(_entry_points().items()):
        try:
            result[name] = ep.load().available()
        except Exception as exc:  # a broken third-party plugin must not hide the others
            result[name] = (False, f"failed to load: {exc}")
    return result


def load_plugin(
    name: str, device_id: int = 0, threads: int = 1, host: str = "127.0.0.1", advertise_host: str = ""
) -> Plugin:
    """The plugin `name` for one device; its data plane listens on `host` and peers reach it at `advertise_host`
    (default `host`)."""
    cls = plugin_class(name)
    ok, why = cls.available()
    if not ok:
        raise MissingRuntimeError(f"plugin {name!r} cannot run here: {why}")
    return cls(device_id=device_id, threads=threads, host=host, advertise_host=advertise_host)
