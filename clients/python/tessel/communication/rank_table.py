"""MindSpore's rank table (RANK_TABLE_FILE): which rank runs on which device of which server.

Two layouts are read, both from MindSpore's `rank_table.md`:

* the server list (version 1.0): `server_count`, `server_list: [{server_id, device: [{device_id, device_ip,
  rank_id}], host_nic_ip}]`, `status: "completed"`;
* the cross-cluster layout: the same plus `server_ip` (and `pod_ip`) per server — `server_id` is then a name — and
  `cluster_list: [{cluster_id, network_type, az_id, region_id, server_list: [{server_id}]}]`.

Numbers may be JSON strings ("0") or ints. A malformed table is a ConfigurationError naming the field, e.g.
`server_list[1].device[3].rank_id`.

    table = load("rank_table_8pcs.json")
    server, device = table.place(3)      # the server and device of rank 3
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from tessel.core.errors import ConfigurationError


@dataclass(frozen=True)
class Device:
    rank: int
    device_id: int
    device_ip: str


@dataclass(frozen=True)
class Server:
    server_id: str
    host: str  # where the server is reached: server_ip if given, else server_id
    devices: tuple[Device, ...]
    cluster_id: str = ""


@dataclass(frozen=True)
class RankTable:
    path: str
    servers: tuple[Server, ...]
    digest: str  # of the file's path and bytes: names the job the table describes

    @property
    def size(self) -> int:
        return sum(len(server.devices) for server in self.servers)

    def place(self, rank: int) -> tuple[Server, Device]:
        """The server and device of `rank`."""
        for server in self.servers:
            for device in server.devices:
                if device.rank == rank:
                    return server, device
        raise ConfigurationError(
            f"rank table {self.path}: no device has rank_id {rank}; its ranks are 0..{self.size - 1} "
            "(RANK_ID must be one of them)"
        )


class _Reader:
    """Field access that names the field on every error."""

    def __init__(self, path: str):
        self.path = path

    def fail(self, where: str, problem: str) -> ConfigurationError:
        return ConfigurationError(f"rank table {self.path}: {where} {problem}")

    def field(self, obj: dict, key: str, where: str, kind: type = str):
        if not isinstance(obj, dict):
            raise self.fail(where or "the top level", f"must be a JSON object, got {type(obj).__name__}")
        if key not in obj:
            raise self.fail(f"{where}.{key}" if where else key, "is missing")
        value = obj[key]
        name = f"{where}.{key}" if where else key
        if kind is int:
            return self.integer(value, name)
        if kind is list:
            if not isinstance(value, list) or not value:
                raise self.fail(name, f"must be a non-empty list, got {value!r}")
            return value
        if not isinstance(value, str):
            raise self.fail(name, f"must be a string, got {value!r}")
        return value

    def integer(self, value, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise self.fail(name, f"must be an integer (or a string of one), got {value!r}")
        try:
            number = int(value)
        except ValueError:
            raise self.fail(name, f"must be an integer (or a string of one), got {value!r}") from None
        if number < 0:
            raise self.fail(name, f"must not be negative, got {value!r}")
        return number


def load(path: str | Path) -> RankTable:
    """Read and check a rank table; every problem is a ConfigurationError naming the file and the field."""
    where = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"rank table {where} (RANK_TABLE_FILE) cannot be read: {exc}") from None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ConfigurationError(f"rank table {where}: not valid JSON: {exc}") from None
    reader = _Reader(where)
    status = data.get("status") if isinstance(data, dict) else None
    if status is not None and status != "completed":
        raise reader.fail("status", f'is {status!r}; a usable rank table says "completed"')
    servers = _servers(reader, data)
    _check_ranks(reader, servers)
    if "server_count" in data and reader.field(data, "server_count", "", int) != len(servers):
        raise reader.fail("server_count", f"is {data['server_count']!r} but server_list has {len(servers)} servers")
    if "cluster_list" in data:
        servers = _clusters(reader, data, servers)
    # The job's name on this host: the same table at the same path (the ranks of one launch), nothing else.
    digest = hashlib.sha256(str(Path(path).resolve()).encode() + b"\0" + raw).hexdigest()[:16]
    return RankTable(where, tuple(servers), digest)


def _servers(reader: _Reader, data) -> list[Server]:
    servers = []
    for i, entry in enumerate(reader.field(data, "server_list", "", list)):
        at = f"server_list[{i}]"
        server_id = reader.field(entry, "server_id", at)
        host = reader.field(entry, "server_ip", at) if "server_ip" in entry else server_id
        devices = []
        for j, device in enumerate(reader.field(entry, "device", at, list)):
            dat = f"{at}.device[{j}]"
            devices.append(
                Device(
                    rank=reader.field(device, "rank_id", dat, int),
                    device_id=reader.field(device, "device_id", dat, int),
                    device_ip=str(device.get("device_ip", "")),
                )
            )
        ids = [d.device_id for d in devices]
        repeated = sorted({d for d in ids if ids.count(d) > 1})
        if repeated:
            raise reader.fail(f"{at}.device", f"lists device_id {repeated} more than once on server {server_id!r}")
        servers.append(Server(server_id, host, tuple(devices)))
    names = [s.server_id for s in servers]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated and any(s.host != s.server_id for s in servers):
        raise reader.fail("server_list", f"names server_id {repeated} more than once")
    return servers


def _check_ranks(reader: _Reader, servers: list[Server]) -> None:
    ranks = [d.rank for s in servers for d in s.devices]
    expected = set(range(len(ranks)))
    repeated = sorted({r for r in ranks if ranks.count(r) > 1})
    missing = sorted(expected - set(ranks))
    if repeated or missing:
        raise reader.fail(
            "rank_id",
            f"values must be 0..{len(ranks) - 1}, each once: repeated {repeated}, missing {missing}",
        )


def _clusters(reader: _Reader, data, servers: list[Server]) -> list[Server]:
    known = {s.server_id: s for s in servers}
    cluster_of: dict[str, str] = {}
    for i, cluster in enumerate(reader.field(data, "cluster_list", "", list)):
        at = f"cluster_list[{i}]"
        cluster_id = reader.field(cluster, "cluster_id", at)
        for j, member in enumerate(reader.field(cluster, "server_list", at, list)):
            server_id = reader.field(member, "server_id", f"{at}.server_list[{j}]")
            if server_id not in known:
                raise reader.fail(
                    f"{at}.server_list[{j}].server_id", f"{server_id!r} is not a server_id of the server_list"
                )
            cluster_of[server_id] = cluster_id
    return [Server(s.server_id, s.host, s.devices, cluster_of.get(s.server_id, "")) for s in servers]
