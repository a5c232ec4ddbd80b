"""Hosts made of Linux network namespaces, so one machine can test and measure tessel across hosts.

    with Testbed(2, rate="1gbit") as bed:
        a, b = bed.hosts                               # Host("h0", "tessel-tb-4242-9f3c01-h0", "10.77.35.2"), ...
        bed.run(a, ["ip", "-brief", "addr"])           # a command inside host a's namespace
        proc = bed.popen(b, [sys.executable, "-c", "..."])

A tessel cluster on it (a coordinator on the switch, daemons in the hosts, ranks inside their daemon's host) is
testbed_cluster.TestbedCluster.

Topology: a *switch* namespace holds a bridge (`br0`, address .1 of the run's private /24, where the coordinator
listens) and one veth port per host; every host namespace has `lo` and one veth `eth0` (address .2, .3, ...) to its
port. `rate` (tc tbf, e.g. "1gbit", "10gbit"; None = unlimited) limits both directions of every host's link, like
a switch port: host egress on `eth0`, host ingress on the switch side. Every host reaches every other host and the
switch; nothing is routed out of the test bed, and the root namespace is not touched. Since the namespaces are
private, concurrent test beds may even use the same addresses; their names carry the creating pid and a nonce.

A daemon's host identity is its network namespace (tessel.daemon.core.host_id), so daemons in one host share
memory and daemons in two hosts talk TCP, exactly as on real machines.

Cleanup: `close()` (also from `with`, and atexit) stops every process started here, then deletes the namespaces,
which takes their veths and bridge with them. `remove_stale()` (run by every new test bed) deletes namespaces with
this prefix whose creator pid is gone and that hold no process.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tessel.core.process import pid_alive

PREFIX = "tessel-tb"
_NAME = re.compile(rf"^{PREFIX}-(\d+)-([0-9a-f]+)-(\w+)$")
REPO = Path(__file__).resolve().parents[2]
_COMMAND_TIMEOUT_S = 15.0  # one `ip` / `tc` call
_STOP_GRACE_S = 5.0
# Environment variables that would send gRPC or anything else through a proxy outside the test bed.
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "grpc_proxy", "no_proxy")
_PR_SET_PDEATHSIG = 1


class TestbedUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no `ip`/`tc`, or the kernel refuses); says why."""


@dataclass(frozen=True)
class Host:
    """One "machine": a network namespace with its own address."""

    name: str  # "h0", "h1", ... or "switch"
    namespace: str  # the `ip netns` name
    address: str  # its IPv4 address in the test bed's subnet
    port: str = ""  # its link's interface name in the switch namespace ("" for the switch itself)


def available() -> tuple[bool, str]:
    """Whether this process can build a test bed, with the reason when it cannot."""
    if not sys.platform.startswith("linux"):
        return False, "network namespaces are Linux only"
    if os.geteuid() != 0:
        return False, "creating network namespaces needs root (run the tests as root, or in a privileged container)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return False, f"{' and '.join(missing)} not found (apt-get install iproute2)"
    probe = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}-probe"
    made = _ip(f"ip netns add {probe}", check=False)
    if made.returncode != 0:
        return False, f"`ip netns add` failed: {made.stderr.strip()} (a container needs CAP_SYS_ADMIN)"
    _ip(f"ip netns delete {probe}", check=False)
    return True, ""


def _ip(line: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run one `ip` / `tc` command line (the test bed's names and addresses never contain spaces)."""
    command = line.split()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise TestbedUnavailable(f"`{' '.join(command)}` did not finish within {_COMMAND_TIMEOUT_S:g} s") from None
    if check and done.returncode != 0:
        raise TestbedUnavailable(f"`{' '.join(command)}` failed: {done.stderr.strip() or done.stdout.strip()}")
    return done


def _namespaces() -> list[str]:
    listing = _ip("ip netns list", check=False).stdout
    return [line.split()[0] for line in listing.splitlines() if line.strip()]


def _pids_in(namespace: str) -> list[int]:
    listing = _ip(f"ip netns pids {namespace}", check=False).stdout
    return [int(p) for p in listing.split() if p.isdigit()]


def remove_stale() -> list[str]:
    """Delete test-bed namespaces whose creator is gone and that hold no process; returns their names."""
    removed = []
    for namespace in _namespaces():
        match = _NAME.match(namespace)
        if match is None or pid_alive(int(match.group(1))) or _pids_in(namespace):
            continue
        if _ip(f"ip netns delete {namespace}", check=False).returncode == 0:
            removed.append(namespace)
    return removed


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the process that started it dies, so a killed test run leaves
    no daemon behind in a namespace (the signal survives `ip netns exec`, which execs without forking)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def bed_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default os.environ) without proxy settings: traffic stays on the test bed's addresses."""
    env = dict(os.environ if base is None else base)
    for name in _PROXY_VARIABLES:
        env.pop(name, None)
        env.pop(name.upper(), None)
    return env


def _tbf(rate: str) -> str:
    """tbf with a bucket of 4 ms at `rate` (at least 256 KiB: veth hands over 64 KiB GSO packets) and 20 ms of
    queue, which keeps a TCP stream at the rate instead of dropping it into slow start."""
    bits = rate_bits(rate)
    burst = max(256 * 1024, bits // 8 // 250)
    return f"tbf rate {rate} burst {burst} latency 20ms"


def rate_bits(rate: str) -> int:
    """Bits per second of a tc rate such as "100mbit", "1gbit" or "10gbit"."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)bit", rate.strip().lower())
    if match is None:
        raise ValueError(f"link rate {rate!r} is not like '100mbit', '1gbit' or '10gbit'")
    return int(float(match.group(1)) * {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[match.group(2)])


@dataclass
class Testbed:
    """`hosts_count` network namespaces on a switch, each link limited to `rate` (None: unlimited). See the module
    doc."""

    __test__ = False  # not a pytest test class

    hosts_count: int = 2
    rate: str | None = "10gbit"
    hosts: list[Host] = field(default_factory=list, init=False)
    switch: Host | None = field(default=None, init=False)
    processes: list[subprocess.Popen] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.hosts_count <= 200:
            raise ValueError(f"a test bed has 1 to 200 hosts, not {self.hosts_count}")
        if self.rate is not None:
            rate_bits(self.rate)
        nonce = secrets.token_hex(3)
        self.tag = f"{PREFIX}-{os.getpid()}-{nonce}"
        # Namespaces are private, so any subnet works; one per run still makes captures and logs unambiguous.
        self.subnet = f"10.77.{int(nonce, 16) % 250 + 1}"
        self._lock = threading.Lock()
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------------------------------

    def __enter__(self) -> Testbed:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.close()

    def up(self) -> Testbed:
        """Create the namespaces and links; on any failure remove what was made and raise TestbedUnavailable."""
        ok, why = available()
        if not ok:
            raise TestbedUnavailable(why)
        remove_stale()
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        switch = Host("switch", f"{self.tag}-sw", f"{self.subnet}.1")
        self._add_namespace(switch.namespace)
        self.switch = switch
        on_switch = f"ip -n {switch.namespace}"
        _ip(f"{on_switch} link add br0 type bridge")
        _ip(f"{on_switch} addr add {switch.address}/24 dev br0")
        _ip(f"{on_switch} link set br0 up")
        for index in range(self.hosts_count):
            host = Host(f"h{index}", f"{self.tag}-h{index}", f"{self.subnet}.{index + 2}", port=f"p{index}")
            self._add_namespace(host.namespace)
            self.hosts.append(host)
            # Both ends are created inside the test bed's namespaces: nothing appears in the root namespace.
            _ip(f"{on_switch} link add {host.port} type veth peer name eth0 netns {host.namespace}")
            _ip(f"{on_switch} link set {host.port} master br0")
            _ip(f"{on_switch} link set {host.port} up")
            _ip(f"ip -n {host.namespace} addr add {host.address}/24 dev eth0")
            _ip(f"ip -n {host.namespace} link set eth0 up")
        self.set_rate(self.rate)
        self._wait_for_links()

    def _add_namespace(self, namespace: str) -> None:
        _ip(f"ip netns add {namespace}")
        _ip(f"ip -n {namespace} link set lo up")

    def _wait_for_links(self, timeout_s: float = 10.0) -> None:
        """Until every link is up (veth carrier and bridge port forwarding take a moment)."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = [_ip(f"ip -n {h.namespace} -brief link show eth0", check=False).stdout for h in self.hosts]
            if all(" UP " in s or "LOWER_UP" in s for s in states):
                return
            if time.monotonic() > deadline:
                raise TestbedUnavailable(f"the test bed's links did not come up within {timeout_s:g} s: {states}")
            time.sleep(0.05)

    def close(self) -> None:
        """Stop the processes started here, then delete the namespaces (with their links). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        stop(self.processes)
        namespaces = [h.namespace for h in self.hosts] + ([self.switch.namespace] if self.switch else [])
        for namespace in namespaces:
            # Only processes started by this test bed (or their children) can be inside its namespaces.
            for pid in _pids_in(namespace):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for namespace in namespaces:
            _ip(f"ip netns delete {namespace}", check=False)

    # -- links ------------------------------------------------------------------------------------------------

    def set_rate(self, rate: str | None) -> None:
        """Limit every host's link to `rate` in both directions (None: remove the limit)."""
        for host in self.hosts:
            for namespace, device in ((host.namespace, "eth0"), (self.switch.namespace, host.port)):
                _ip(f"tc -n {namespace} qdisc del dev {device} root", check=False)
                if rate is not None:
                    _ip(f"tc -n {namespace} qdisc add dev {device} root {_tbf(rate)}")
        self.rate = rate

    def partition(self, a: Host, b: Host) -> None:
        """Cut the path between hosts a and b (both directions) while both still reach the switch: packets to the
        other host go to a next hop that does not exist, so they vanish like on a dead link."""
        dead_hop = f"{self.subnet}.254"
        for here, there in ((a, b), (b, a)):
            _ip(f"ip -n {here.namespace} route replace {there.address}/32 via {dead_hop} dev eth0")

    def heal(self, a: Host, b: Host) -> None:
        """Undo `partition(a, b)`."""
        for here, there in ((a, b), (b, a)):
            _ip(f"ip -n {here.namespace} route del {there.address}/32", check=False)

    def link_bytes(self, host: Host) -> tuple[int, int]:
        """(sent, received) bytes on the host's link so far."""
        base = "/sys/class/net/eth0/statistics"
        done = self.run(host, ["cat", f"{base}/tx_bytes", f"{base}/rx_bytes"], timeout_s=_COMMAND_TIMEOUT_S)
        sent, received = done.stdout.split()
        return int(sent), int(received)

    # -- processes --------------------------------------------------------------------------------------------

    def command(self, host: Host, argv: list[str]) -> list[str]:
        """`argv` as run inside `host`."""
        return ["ip", "netns", "exec", host.namespace, *argv]

    def popen(self, host: Host, argv: list[str], env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
        """Start `argv` inside `host`; it is stopped by close() and gets SIGTERM if this process dies."""
        if self._closed:
            raise TestbedUnavailable("the test bed is closed")
        kwargs.setdefault("cwd", REPO)
        proc = subprocess.Popen(
            self.command(host, argv), env=bed_environment(env), preexec_fn=_die_with_parent, **kwargs
        )
        self.processes.append(proc)
        return proc

    def run(self, host: Host, argv: list[str], timeout_s: float = 60.0, **kwargs) -> subprocess.CompletedProcess:
        """Run `argv` inside `host` to completion (killed after `timeout_s`), capturing its output as text."""
        kwargs.setdefault("cwd", REPO)
        return subprocess.run(
            self.command(host, argv),
            env=bed_environment(kwargs.pop("env", None)),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            preexec_fn=_die_with_parent,
            **kwargs,
        )

    def describe(self) -> str:
        lines = [f"test bed {self.tag}: {len(self.hosts)} hosts, links {self.rate or 'unlimited'}"]
        lines += [f"  {h.name:7} {h.address:15} netns {h.namespace}" for h in [self.switch, *self.hosts] if h]
        return "\n".join(lines)


def stop(processes: list[subprocess.Popen], grace_s: float = _STOP_GRACE_S) -> None:
    """SIGTERM every running process, then SIGKILL those still running after `grace_s`."""
    for proc in processes:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in processes:
        try:
            proc.wait(max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(_STOP_GRACE_S)
