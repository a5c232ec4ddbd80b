"""The settings of MindSpore's startup methods, read without starting anything: rank tables (both layouts of
`rank_table.md`, and the field a malformed one gets wrong), the dynamic-networking variables, and msrun's rules."""

from __future__ import annotations

import copy
import json
import sys

import pytest

from tessel import msrun
from tessel.communication import rank_table
from tessel.communication.dynamic_cluster import DynamicCluster
from tessel.core.errors import ConfigurationError, NotSupportedYetError


def server(server_id: str, first_rank: int, devices: int = 2, **extra) -> dict:
    listed = [
        {"device_id": str(d), "device_ip": f"192.{d}.0.6", "rank_id": str(first_rank + d)} for d in range(devices)
    ]
    return {"server_id": server_id, "device": listed, "host_nic_ip": "reserve", **extra}


SERVER_LIST = {  # rank_table_16pcs.json's layout, 2 devices a server
    "version": "1.0",
    "server_count": "2",
    "server_list": [server("10.0.0.1", 0), server("10.0.0.2", 2)],
    "status": "completed",
}
CROSS_CLUSTER = {  # rank_table_cross_cluster_16pcs.json's layout: server_id is a name, server_ip the address
    "version": "1.0",
    "server_count": "2",
    "server_list": [
        server("server_0", 0, server_ip="10.0.0.1", pod_ip="127.0.0.1"),
        server("server_1", 2, server_ip="10.0.1.1", pod_ip="127.0.0.1"),
    ],
    "cluster_list": [
        {"cluster_id": "cluster_0", "network_type": "ROCE", "server_list": [{"server_id": "server_0"}]},
        {"cluster_id": "cluster_1", "network_type": "ROCE", "server_list": [{"server_id": "server_1"}]},
    ],
    "status": "completed",
}


def write(tmp_path, table) -> str:
    path = tmp_path / "rank_table.json"
    path.write_text(table if isinstance(table, str) else json.dumps(table))
    return str(path)


def test_both_layouts_place_every_rank(tmp_path):
    table = rank_table.load(write(tmp_path, SERVER_LIST))
    assert table.size == 4 and [s.host for s in table.servers] == ["10.0.0.1", "10.0.0.2"]
    where, device = table.place(3)
    assert (where.server_id, device.device_id, device.rank) == ("10.0.0.2", 1, 3)

    table = rank_table.load(write(tmp_path, CROSS_CLUSTER))
    where, device = table.place(2)
    assert (where.server_id, where.host, where.cluster_id, device.device_id) == ("server_1", "10.0.1.1", "cluster_1", 0)
    with pytest.raises(ConfigurationError, match=r"no device has rank_id 4; its ranks are 0..3"):
        table.place(4)


def broken(edit) -> dict:
    table = copy.deepcopy(SERVER_LIST)
    edit(table)
    return table


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("{not json", r"not valid JSON"),
        (broken(lambda t: t.pop("server_list")), r": server_list is missing"),
        (broken(lambda t: t["server_list"][1].pop("device")), r"server_list\[1\]\.device is missing"),
        (broken(lambda t: t["server_list"][0]["device"][1].pop("rank_id")), r"server_list\[0\]\.device\[1\]\.rank_id"),
        (broken(lambda t: t["server_list"][0]["device"][0].update(rank_id="x")), r"rank_id must be an integer"),
        (broken(lambda t: t["server_list"][1]["device"][0].update(rank_id="0")), r"repeated \[0\], missing \[2\]"),
        (broken(lambda t: t["server_list"][0]["device"][1].update(device_id="0")), r"device_id \[0\] more than once"),
        (broken(lambda t: t.update(server_count="3")), r"server_count is '3' but server_list has 2 servers"),
        (broken(lambda t: t.update(status="initializing")), r"status is 'initializing'"),
        (broken(lambda t: t.update(server_list=[])), r"server_list must be a non-empty list"),
    ],
)
def test_a_malformed_table_names_the_field(tmp_path, table, message):
    with pytest.raises(ConfigurationError, match=message):
        rank_table.load(write(tmp_path, table))


def test_a_cluster_list_must_name_servers_of_the_table(tmp_path):
    table = copy.deepcopy(CROSS_CLUSTER)
    table["cluster_list"][1]["server_list"][0]["server_id"] = "server_9"
    with pytest.raises(ConfigurationError, match=r"cluster_list\[1\]\.server_list\[0\]\.server_id 'server_9' is not"):
        rank_table.load(write(tmp_path, table))


def test_dynamic_networking_variables(monkeypatch):
    for name in ("MS_ROLE", "MS_SCHED_HOST", "MS_SCHED_PORT", "MS_WORKER_NUM", "MS_NODE_ID", "MS_TOPO_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    assert DynamicCluster.from_environ() is None
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    with pytest.raises(ConfigurationError, match="MS_SCHED_HOST is not set"):
        DynamicCluster.from_environ()
    monkeypatch.setenv("MS_SCHED_HOST", "127.0.0.1")
    monkeypatch.setenv("MS_SCHED_PORT", "8118")
    with pytest.raises(ConfigurationError, match=r"MS_WORKER_NUM='' must be an integer >= 1"):
        DynamicCluster.from_environ()
    monkeypatch.setenv("MS_WORKER_NUM", "4")
    cluster = DynamicCluster.from_environ()
    assert (cluster.rank(), cluster.timeout_s, cluster.job_id) == (-1, 1800.0, "ms-127.0.0.1-8118")
    monkeypatch.setenv("MS_NODE_ID", "3")
    monkeypatch.setenv("MS_TOPO_TIMEOUT", "300")
    cluster = DynamicCluster.from_environ()
    assert (cluster.rank(), cluster.timeout_s) == (3, 300.0)
    monkeypatch.setenv("MS_TOPO_TIMEOUT", "-1")  # msrun --cluster_time_out=-1: MindSpore waits for ever
    assert DynamicCluster.from_environ().timeout_s == 7 * 24 * 3600.0  # the longest any wait may be here
    monkeypatch.setenv("MS_TOPO_TIMEOUT", "300")
    monkeypatch.setenv("MS_NODE_ID", "worker-a")  # a name, not a rank: ranks go in order of arrival
    assert DynamicCluster.from_environ().rank() == -1
    monkeypatch.setenv("MS_ROLE", "MS_PSERVER")
    with pytest.raises(NotSupportedYetError, match="not supported yet: MS_ROLE=MS_PSERVER"):
        DynamicCluster.from_environ()


def test_msrun_runs_python_on_the_script_unless_it_is_python_or_pytest():
    assert msrun.task_command("train.py", ["--lr", "1"]) == [sys.executable, "train.py", "--lr", "1"]
    assert msrun.task_command("python3", ["-u", "train.py"]) == [sys.executable, "-u", "train.py"]
    assert msrun.task_command("pytest", ["-s", "train.py"]) == [sys.executable, "-m", "pytest", "-s", "train.py"]


def test_msrun_defaults_and_node_ranks_are_msruns():
    args = msrun.parse_args(["train.py"])
    assert (args.worker_num, args.local_worker_num, args.master_addr, args.master_port) == (8, 8, "127.0.0.1", 8118)
    assert (args.node_rank, args.log_dir, args.join, args.cluster_time_out) == (-1, "", False, 600)
    args = msrun.parse_args(["--worker_num=8", "--local_worker_num=4", "--node_rank=1", "--join=True", "train.py"])
    assert msrun.Msrun(args).placement == [(str(r), d) for r, d in zip(range(4, 8), range(4), strict=True)]
    args = msrun.parse_args(["--worker_num=8", "--local_worker_num=4", "train.py"])  # node_rank -1: by arrival
    assert msrun.Msrun(args).placement == [(None, d) for d in range(4)]


def test_msrun_binds_cores_as_asked():
    assert msrun._core_sets("False", 2) is None
    assert msrun._core_sets('{"device0": ["0-1"], "device1": ["2", "3-3"]}', 2) == [[0, 1], [2, 3]]
    with pytest.raises(ConfigurationError, match=r'no cores for worker 1; give "device1"'):
        msrun._core_sets('{"device0": ["0-1"]}', 2)


def test_msrun_tails_only_workers_of_its_node():
    args = msrun.parse_args(
        ["--worker_num=4", "--local_worker_num=2", "--node_rank=1", "--tail_worker_log=2,5", "x.py"]
    )
    with pytest.raises(
        ConfigurationError, match=r"--tail_worker_log 2,5: no worker of this node is 5; its workers are 2, 3"
    ):
        msrun.Msrun(args)


def test_rank_zeros_address_file_is_private_and_a_dead_publishers_is_ignored(tmp_path):
    import os
    import socket
    import time

    from tessel.communication.discovery import FileExchange
    from tessel.core.errors import RendezvousTimeoutError

    exchange = FileExchange("job-1", tmp_path / "rendezvous")
    exchange.publish({"address": "127.0.0.1:1234", "token": "t"})
    assert oct((tmp_path / "rendezvous" / "job-1.json").stat().st_mode & 0o777) == "0o600"
    found = FileExchange("job-1", tmp_path / "rendezvous").lookup(time.monotonic() + 1, "rank 1")
    assert (found["address"], found["token"], found["pid"]) == ("127.0.0.1:1234", "t", os.getpid())
    exchange.remove()

    dead = {"address": "127.0.0.1:1", "token": "t", "pid": 2**22 + 7, "host": socket.gethostname()}
    (tmp_path / "rendezvous" / "job-2.json").write_text(json.dumps(dead))  # left by a rank 0 that crashed
    with pytest.raises(RendezvousTimeoutError, match="rank 0 did not publish its coordinator"):
        FileExchange("job-2", tmp_path / "rendezvous").lookup(time.monotonic() + 0.3, "rank 1")

    (tmp_path / "rendezvous").chmod(0o777)
    with pytest.raises(ConfigurationError, match="is not this user's own"):
        FileExchange("job-3", tmp_path / "rendezvous").publish({"address": "x", "token": "t"})


def test_a_mindspore_variable_without_effect_is_named_in_a_warning_not_read_silently(monkeypatch, caplog):
    from tessel import communication

    for name in communication.NO_EFFECT_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(communication, "_warned_env", set())
    monkeypatch.setenv("MS_COMM_COMPILER_OPT", "3")
    monkeypatch.setenv("MS_DISABLE_HEARTBEAT", "1")
    with caplog.at_level("WARNING", logger="tessel"):
        assert communication._warn_no_effect_env() == ["MS_COMM_COMPILER_OPT", "MS_DISABLE_HEARTBEAT"]
        assert communication._warn_no_effect_env() == []  # once per process
    assert "MS_COMM_COMPILER_OPT=3 is not supported yet and has no effect" in caplog.text
    assert "MS_DISABLE_HEARTBEAT=1 is not supported yet and has no effect: tessel's liveness checks" in caplog.text
    monkeypatch.delenv("MS_COMM_COMPILER_OPT")
    monkeypatch.delenv("MS_DISABLE_HEARTBEAT")
    monkeypatch.setattr(communication, "_warned_env", set())
    assert communication._warn_no_effect_env() == []
