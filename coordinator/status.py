"""`tessel status`: the cluster's daemons and jobs as a plain-text table."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tessel.coordinator.pace import steps_per_s
from tessel.coordinator.stalls import describe
from tessel.core import errors
from tessel.core.coordinator_client import CoordinatorClient, default_address
from tessel.v1 import coordinator_pb2


def _table(header: Sequence[str], rows: list[Sequence[str]]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    return ["  ".join(str(cell).ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [header, *rows]]


def _memory(n_bytes: int) -> str:
    if n_bytes <= 0:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n_bytes < 1024 or unit == "GiB":
            return f"{n_bytes:.0f} {unit}" if unit == "B" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1024
    raise AssertionError("unreachable")


def _daemon_row(info: coordinator_pb2.DaemonInfo) -> list[str]:
    device = f"{info.device_kind or info.plugin}:{info.device_id}"
    job = f"{info.job_id}/{info.rank}" if info.job_id else "-"
    beat = f"{info.heartbeat_age_s:.1f} s ago" if info.state != "dead" else "-"
    cores = str(info.cores) if info.cores else "-"
    return [info.daemon_id, info.address, info.plugin, device, cores, _memory(info.memory_bytes), info.state, job, beat]


def _job_row(job: coordinator_pb2.JobInfo) -> list[str]:
    return [job.job_id, str(job.world_size), job.state, f"{len(job.finished_ranks)}/{job.world_size}", job.cause]


def format_status(reply: coordinator_pb2.ClusterStatusReply) -> str:
    """A plain-text table of the daemons and jobs in a ClusterStatus reply.

    Example: print(format_status(CoordinatorClient().cluster_status()))
    """
    lines = [f"daemons ({len(reply.daemons)})"]
    if reply.daemons:
        header = ["ID", "ADDRESS", "PLUGIN", "DEVICE", "CORES", "MEMORY", "STATE", "JOB/RANK", "HEARTBEAT"]
        lines += _table(header, [_daemon_row(d) for d in reply.daemons])
    else:
        lines.append("  none registered: start `tessel daemon --coordinator ADDR`")
    lines += ["", f"jobs ({len(reply.jobs)})"]
    if reply.jobs:
        lines += _table(["ID", "WORLD", "STATE", "FINISHED", "CAUSE"], [_job_row(j) for j in reply.jobs])
    else:
        lines.append("  none")
    split = [j for j in reply.jobs if j.batch_split.shares]
    if split:
        lines += ["", "batch split (speed-aware data parallelism)"]
        header = ["JOB", "EPOCH", "GLOBAL BATCH", "SHARES", "SPEEDS", "FROM"]
        lines += _table(header, [_split_row(j.batch_split) for j in split])
    if reply.paces:  # running jobs whose ranks' daemons report their work (coordinator/pace.py)
        lines += ["", "rank pace (own work per step, last window; a straggler's others wait for it)"]
        header = ["JOB", "RANK", "OWN/STEP", "STEPS/S", "BLOCKED/STEP", "VS OTHERS", "STRAGGLER"]
        lines += _table(header, [_pace_row(p) for p in reply.paces])
    if reply.stalls:  # only while some collective is stalled
        lines += ["", f"stalls ({len(reply.stalls)})"]
        lines += [f"  {describe(stall)}" for stall in reply.stalls]
    return "\n".join(lines)


def _pace_row(pace: coordinator_pb2.RankPace) -> list[str]:
    rate = steps_per_s(pace.own_s_per_step) if pace.own_s_per_step > 0 else "-"
    verdict = "yes" if pace.straggler else (f"slow {pace.slow_windows} window(s)" if pace.slow_windows else "-")
    return [
        pace.job_id,
        str(pace.rank),
        f"{pace.own_s_per_step * 1e3:.3g} ms",
        rate,
        f"{pace.blocked_s_per_step * 1e3:.3g} ms",
        f"{pace.ratio:.2f}x",
        verdict,
    ]


def _split_row(split: coordinator_pb2.BatchSplit) -> list[str]:
    unit = " samples/s" if split.source.startswith("step times") else ""
    speeds = ":".join(f"{s:.3g}" for s in split.speeds) + unit if any(split.speeds) else "-"
    shares = ":".join(str(s) for s in split.shares)
    return [split.job_id, str(split.epoch), str(split.global_batch), shares, speeds, split.source]


def status_main(argv: Sequence[str] | None = None) -> int:
    """`tessel status [--coordinator ADDR]`: print the status table; exit 1 if unreachable, 2 on bad setup."""
    parser = argparse.ArgumentParser(prog="tessel status", description="Show the cluster's daemons and jobs.")
    parser.add_argument(
        "--coordinator", default=None, help="host:port (default: $TESSEL_COORDINATOR or 127.0.0.1:7070)"
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the coordinator")
    args = parser.parse_args(argv)
    address = args.coordinator or default_address()
    try:
        with CoordinatorClient(address, timeout_s=args.timeout, grace_s=0.0) as client:
            reply = client.cluster_status()
    except errors.ConfigurationError as exc:
        print(f"tessel status: {exc}", file=sys.stderr)
        return 2
    except errors.TesselError as exc:
        print(f"tessel status: cannot reach the coordinator at {address}: {exc}", file=sys.stderr)
        return 1
    print(format_status(reply))
    return 0
