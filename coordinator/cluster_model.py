"""A job's cost model, measured rather than assumed: what each rank's daemon measured at registration (matrix
throughput, memory bandwidth, memory size, its shared-memory link) and what the coordinator probed between hosts
(TCP latency and bandwidth, asked of two daemons of different hosts through the daemons' ProbeLink RPC) and what a
collective among the job's daemons costs (all of them asked at once through ProbeGroup: on a host with fewer cores
than busy threads, waiting for every member to arrive costs far more than a link's latency).

    >>> model, message = job_cost_model(state, "train1", cluster)    # a CostModel and its ClusterModel message
    >>> cost_model_from_proto(message) == model
    True

Ranks are placed on hosts by their daemons' host ids (equal host id = shared memory reaches). Every rank runs the
same program, so the slowest device prices a step (CostModel.from_measurements keeps the minima); the shared-memory
link is the slowest any of the job's daemons measured, the TCP link the slowest probed pair of hosts. A figure
nothing measured (a plugin that measures nothing, TESSEL_MEASURE=0, a job on one host for TCP) keeps
CostModel.default_cpu's value, and the message says which ones were measured.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tessel.core import errors, rpc
from tessel.v1 import common_pb2, coordinator_pb2, daemon_pb2, daemon_pb2_grpc

if TYPE_CHECKING:
    from tessel.compiler.parallel.search import CostModel, Link

log = logging.getLogger("tessel.coordinator")

PROBE_TIMEOUT_S = 20.0
MAX_PROBED_PAIRS = 8  # host pairs probed for one job: a ring over its hosts, cut at this many
KEEP_PROBES = 256  # probed pairs (and refreshed measurements) remembered
RETRY_FAILED_PROBE_S = 60.0  # a failed probe is tried again after this long (until then: TCP's default figures)
GROUP_PROBE_COLLECTIVES = 16  # small all_reduces timed by a group probe (about 1-2 ms each on a loaded 2-core host)


def job_daemons(state, job_id: str) -> tuple[int, list[coordinator_pb2.DaemonInfo]]:
    """(world size, the DaemonInfo of every rank's daemon, index = rank) of a job that has its daemons."""
    info = state.job_info(job_id)  # KeyError (NOT_FOUND) naming the job when it is unknown
    if len(info.members) != info.world_size:
        raise errors.ConfigurationError(
            f"job '{job_id}' is {info.state} with {len(info.members)} of its {info.world_size} ranks placed on "
            "daemons; its cost model (and a plan priced with it) needs every rank's daemon: ask once the job runs "
            "(after every rank's init())"
        )
    registered = {d.daemon_id: d for d in state.cluster_status().daemons}
    daemons = []
    for member in info.members:
        daemon = registered.get(member.daemon_id)
        if daemon is None:
            raise errors.ConfigurationError(
                f"job '{job_id}': rank {member.rank}'s daemon {member.daemon_id} is no longer registered; "
                "its measurements are gone with it: run the job again on live daemons"
            )
        daemons.append(daemon)
    return info.world_size, daemons


def job_cost_model(
    state, job_id: str, cluster: ClusterMeasurements | None = None, refresh: bool = False
) -> tuple[CostModel, coordinator_pb2.ClusterModel]:
    """The cost model of a job's ranks, and the same as a ClusterModel message (with each rank's own figures).
    `refresh`: ask the job's daemons to measure again first (through `cluster`)."""
    _, daemons = job_daemons(state, job_id)
    if refresh:
        if cluster is None:
            raise errors.ConfigurationError("GetCostModel: this coordinator cannot call daemons to refresh them")
        cluster.refresh(daemons)
    return cost_model_of(daemons, cluster, refresh)


def cost_model_of(
    daemons: Sequence[coordinator_pb2.DaemonInfo], cluster: ClusterMeasurements | None = None, refresh: bool = False
) -> tuple[CostModel, coordinator_pb2.ClusterModel]:
    """The cost model of ranks on `daemons` (index = rank): their latest measurements (from `cluster`, else as
    registered) and, with `cluster`, the TCP link probed between their hosts and the latency of a collective among
    them (probed once per set of daemons; again with `refresh`)."""
    from tessel.compiler.parallel.search import CostModel, DeviceMeasurement, Link

    default = CostModel.default_cpu()
    found = [cluster.latest(d) if cluster is not None else d.measurement for d in daemons]
    devices = []
    for d, m in zip(daemons, found):
        measured = m.matmul_flops > 0
        devices.append(
            DeviceMeasurement(
                _host(d),
                m.matmul_flops or default.flops_per_second,
                m.memory_bandwidth or default.memory_bandwidth,
                d.memory_bytes or default.memory_bytes,
                m.op_overhead_s if measured else None,
                m.launch_overhead_s if measured else None,
                tuple(m.op_factors.items()),
            )
        )
    links: dict[str, Link] = {}
    shm = [m for m in found if m.shm_latency_s > 0 and m.shm_bandwidth > 0]
    if shm:
        links["shared_memory"] = Link(max(m.shm_latency_s for m in shm), min(m.shm_bandwidth for m in shm))
    tcp = cluster.tcp_link(daemons) if cluster is not None else None
    if tcp is not None:
        links["tcp"] = tcp
    options = {}
    if cluster is not None and any(m.matmul_flops > 0 for m in found):  # TESSEL_MEASURE=0 everywhere: no probe
        collective = cluster.collective_latency(daemons, refresh)
        if collective is not None:
            options["collective_latency"] = collective
    model = CostModel.from_measurements(devices, links, **options)
    message = cost_model_to_proto(model, shared_memory_measured=bool(shm), tcp_measured=tcp is not None)
    for rank, (d, m, device) in enumerate(zip(daemons, found, devices)):
        message.devices.add(
            rank=rank,
            daemon_id=d.daemon_id,
            host_id=device.host,
            matmul_flops=device.matmul_flops,
            memory_bandwidth=device.memory_bandwidth,
            memory_bytes=device.memory_bytes,
            measured=m.matmul_flops > 0,
        )
    return model, message


def _host(daemon: coordinator_pb2.DaemonInfo) -> str:
    return daemon.host_id or daemon.hostname or daemon.address


# --- the message ----------------------------------------------------------------------------------------------------


def cost_model_to_proto(
    model: CostModel, shared_memory_measured: bool = False, tcp_measured: bool = False
) -> coordinator_pb2.ClusterModel:
    """A CostModel as a ClusterModel message (without per-rank devices)."""
    return coordinator_pb2.ClusterModel(
        flops_per_second=model.flops_per_second,
        memory_bandwidth=model.memory_bandwidth,
        memory_bytes=model.memory_bytes,
        shared_memory=coordinator_pb2.LinkModel(
            latency_s=model.shared_memory.latency,
            bandwidth=model.shared_memory.bandwidth,
            measured=shared_memory_measured,
        ),
        tcp=coordinator_pb2.LinkModel(
            latency_s=model.tcp.latency, bandwidth=model.tcp.bandwidth, measured=tcp_measured
        ),
        hosts=list(model.hosts),
        op_overhead_s=model.op_overhead,
        parameter_bytes_factor=model.parameter_bytes_factor,
        bucket_bytes=model.bucket_bytes,
        launch_overhead_s=model.launch_overhead,
        op_factors=dict(model.op_factors),
        collective_latency_s=model.collective_latency,
    )


def cost_model_from_proto(message: coordinator_pb2.ClusterModel) -> CostModel:
    """The CostModel a ClusterModel message describes (what `predict_step_time` and the planner take)."""
    from tessel.compiler.parallel.search import CostModel, Link

    return CostModel(
        message.flops_per_second,
        message.memory_bandwidth,
        message.memory_bytes,
        Link(message.shared_memory.latency_s, message.shared_memory.bandwidth),
        Link(message.tcp.latency_s, message.tcp.bandwidth),
        tuple(message.hosts),
        op_overhead=message.op_overhead_s,
        parameter_bytes_factor=message.parameter_bytes_factor,
        bucket_bytes=message.bucket_bytes,
        launch_overhead=message.launch_overhead_s,
        op_factors=tuple(message.op_factors.items()),
        collective_latency=message.collective_latency_s,
    )


# --- probing TCP between hosts --------------------------------------------------------------------------------------


class ClusterMeasurements:
    """What the coordinator knows about its daemons beyond their registration: measurements a refresh took since
    (Daemon.Measure; kept here by daemon id and address, so the registry stays as registered) and the TCP links it
    probed between hosts (Daemon.ProbeLink, each pair once). Calls to daemons carry the cluster token."""

    def __init__(self, token: str, timeout_s: float = PROBE_TIMEOUT_S):
        self.token, self.timeout_s = token, timeout_s
        self._fresh: dict[tuple[str, str], common_pb2.DeviceMeasurement] = {}
        self._known: OrderedDict[tuple[str, str], tuple[Link | None, float]] = OrderedDict()
        self._groups: OrderedDict[tuple, tuple[float | None, float]] = OrderedDict()  # daemons -> (latency, when)
        self._lock = threading.Lock()
        self._probing = threading.Lock()  # one probe at a time: probes measure bandwidth, two at once would halve it

    def latest(self, daemon: coordinator_pb2.DaemonInfo) -> common_pb2.DeviceMeasurement:
        """The daemon's latest measurement: a refresh's, else what it registered with."""
        with self._lock:
            return self._fresh.get((daemon.daemon_id, daemon.address), daemon.measurement)

    def refresh(self, daemons: Sequence[coordinator_pb2.DaemonInfo]) -> None:
        """Ask every daemon to measure again, all at once (each measures its own device); a daemon that cannot
        is an error naming it."""
        unique = list({d.daemon_id: d for d in daemons}.values())
        results: dict[str, object] = {}

        def ask(daemon: coordinator_pb2.DaemonInfo) -> None:
            client = rpc.Client(daemon.address, daemon_pb2_grpc.DaemonStub, self.token, self.timeout_s)
            try:
                results[daemon.daemon_id] = client.Measure(common_pb2.Empty())
            except (errors.TesselError, KeyError) as exc:
                results[daemon.daemon_id] = exc
            finally:
                client.close()

        threads = [threading.Thread(target=ask, args=(d,), name="tessel-measure") for d in unique]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.timeout_s + 5)
        for daemon in unique:
            found = results.get(daemon.daemon_id)
            if not isinstance(found, common_pb2.DeviceMeasurement):
                raise errors.ConfigurationError(
                    f"refreshing the measurements: daemon {daemon.daemon_id} at {daemon.address} could not measure "
                    f"({found or 'no answer'})"
                )
            with self._lock:
                self._fresh[(daemon.daemon_id, daemon.address)] = found
                while len(self._fresh) > KEEP_PROBES:
                    self._fresh.pop(next(iter(self._fresh)))

    def collective_latency(self, daemons: Sequence[coordinator_pb2.DaemonInfo], refresh: bool = False) -> float | None:
        """Seconds one small collective takes among `daemons` (index = rank), probed by all of them at once
        (Daemon.ProbeGroup: GROUP_PROBE_COLLECTIVES all_reduces of 4 bytes over a temporary group; the slowest
        member's mean), once per set of daemons and again with `refresh`. None for fewer than two daemons, or when
        the probe failed (logged; tried again after RETRY_FAILED_PROBE_S)."""
        key = tuple((d.daemon_id, d.address) for d in daemons)
        if len(set(key)) < 2 or len(set(key)) != len(key):
            return None
        with self._probing:
            if key in self._groups and not refresh:
                latency, when = self._groups[key]
                if latency is not None or time.monotonic() - when < RETRY_FAILED_PROBE_S:
                    self._groups.move_to_end(key)
                    return latency
            latency = self._probe_group(daemons)
            self._groups[key] = (latency, time.monotonic())
            self._groups.move_to_end(key)
            while len(self._groups) > KEEP_PROBES:
                self._groups.popitem(last=False)
            return latency

    def _probe_group(self, daemons: Sequence[coordinator_pb2.DaemonInfo]) -> float | None:
        probe_id = secrets.token_hex(8)
        members = [
            common_pb2.Member(rank=rank, daemon_id=d.daemon_id, daemon_address=d.address, data_address=d.data_address,
                              host_id=d.host_id or d.hostname, pid=d.pid, plugin=d.plugin, device_id=d.device_id)
            for rank, d in enumerate(daemons)
        ]  # fmt: skip
        results: dict[int, object] = {}

        def ask(rank: int, daemon: coordinator_pb2.DaemonInfo) -> None:
            client = rpc.Client(daemon.address, daemon_pb2_grpc.DaemonStub, self.token, self.timeout_s)
            request = daemon_pb2.ProbeGroupRequest(
                probe_id=probe_id, rank=rank, members=members, collectives=GROUP_PROBE_COLLECTIVES
            )
            try:
                results[rank] = client.ProbeGroup(request).collective_s
            except (errors.TesselError, KeyError) as exc:
                results[rank] = exc
            finally:
                client.close()

        threads = [
            threading.Thread(target=ask, args=(rank, d), name="tessel-probe-group") for rank, d in enumerate(daemons)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.timeout_s + 5)
        failed = {rank: found for rank, found in results.items() if not isinstance(found, float)}
        if failed or len(results) < len(daemons):
            log.warning("probing a collective among %d daemons failed (%s); collectives keep the link latency",
                        len(daemons), failed or "no answer")  # fmt: skip
            return None
        latency = max(results.values())
        log.info("probed a collective among %d daemons: %.1f us", len(daemons), latency * 1e6)
        return latency

    def tcp_link(self, daemons: Sequence[coordinator_pb2.DaemonInfo]) -> Link | None:
        """The slowest probed link among the hosts of `daemons` (a ring of host pairs), or None when they are all
        on one host or no probe succeeded."""
        from tessel.compiler.parallel.search import Link

        first: dict[str, coordinator_pb2.DaemonInfo] = {}
        for d in daemons:
            first.setdefault(_host(d), d)
        hosts = list(first.values())
        if len(hosts) < 2:
            return None
        pairs = [(hosts[i], hosts[(i + 1) % len(hosts)]) for i in range(len(hosts) if len(hosts) > 2 else 1)]
        found = [link for a, b in pairs[:MAX_PROBED_PAIRS] if (link := self.probe(a, b)) is not None]
        if not found:
            return None
        return Link(max(link.latency for link in found), min(link.bandwidth for link in found))

    def probe(self, source: coordinator_pb2.DaemonInfo, target: coordinator_pb2.DaemonInfo) -> Link | None:
        """The link from `source`'s data plane to `target`'s, probed by `source` (None when that failed: logged, and
        tried again after RETRY_FAILED_PROBE_S)."""
        from tessel.compiler.parallel.search import Link

        key = (source.address, target.data_address)
        with self._probing:
            if key in self._known:
                link, when = self._known[key]
                if link is not None or time.monotonic() - when < RETRY_FAILED_PROBE_S:
                    self._known.move_to_end(key)
                    return link
            client = rpc.Client(source.address, daemon_pb2_grpc.DaemonStub, self.token, self.timeout_s)
            try:
                reply = client.ProbeLink(daemon_pb2.ProbeLinkRequest(data_address=target.data_address))
                link = Link(reply.latency_s, reply.bandwidth)
                log.info("probed TCP %s -> %s: %.1f us, %.2f GB/s", source.daemon_id, target.daemon_id,
                         link.latency * 1e6, link.bandwidth / 1e9)  # fmt: skip
            except (errors.TesselError, KeyError) as exc:
                log.warning("probing the link %s -> %s failed (%s); TCP keeps its default figures",
                            source.daemon_id, target.daemon_id, exc)  # fmt: skip
                link = None
            finally:
                client.close()
            self._known[key] = (link, time.monotonic())
            self._known.move_to_end(key)
            while len(self._known) > KEEP_PROBES:
                self._known.popitem(last=False)
            return link
