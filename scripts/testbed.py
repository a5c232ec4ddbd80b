"""The multi-host test bed from the command line: network-namespace "hosts" on a switch, links limited by tc tbf.

    python scripts/testbed.py up  [--hosts 2] [--rate 1gbit] [--daemons-per-host 1] [--hold 3600]
        builds the test bed (and, with --daemons-per-host N > 0, a coordinator on the switch and N daemons per
        host), prints the namespaces, addresses and how to use them, and keeps it until Ctrl-C, SIGTERM or
        --hold seconds have passed.
    python scripts/testbed.py run [--hosts 2] [--rate 1gbit] [--daemons-per-host 1] [--timeout 600] script.py args…
        builds both, runs one rank of `python script.py args…` per daemon inside its daemon's host (rank r on
        daemon r, hosts in order), prints every rank's output and exits with the first non-zero exit code.
    python scripts/testbed.py clean
        removes namespaces of test beds whose creator died (and that hold no process).

Needs root and iproute2 (`ip`, `tc`). Everything is removed on exit, also after an error or a signal. The one
implementation lives in tests/integration/testbed.py (the pytest fixtures and benchmarks/multi_host.py use it).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))

from testbed import Testbed, TestbedUnavailable, remove_stale
from testbed_cluster import TestbedCluster, describe


def _rate(text: str) -> str | None:
    return None if text.lower() in ("none", "unlimited", "0") else text


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/testbed.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "run"):
        command = commands.add_parser(name)
        command.add_argument("--hosts", type=int, default=2, help="number of host namespaces (default 2)")
        command.add_argument("--rate", type=_rate, default="10gbit", help="per-link rate, e.g. 1gbit; none = off")
        command.add_argument("--daemons-per-host", type=int, default=1 if name == "run" else 0)
        command.add_argument("--threads", type=int, default=1, help="compute threads per daemon")
        command.add_argument("--workdir", type=Path, default=None, help="logs and TESSEL_HOME (default: a temp dir)")
        if name == "up":
            command.add_argument("--hold", type=float, default=3600.0, help="seconds to keep it (default 3600)")
        if name == "run":
            command.add_argument("--timeout", type=float, default=600.0, help="seconds before ranks are killed")
            command.add_argument("script", help="the rank script")
            command.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    commands.add_parser("clean")
    return parser.parse_args(argv)


def _usage(bed: Testbed, cluster: TestbedCluster | None) -> str:
    host = bed.hosts[0]
    lines = [bed.describe(), "", f"run a command in a host:  ip netns exec {host.namespace} COMMAND"]
    if cluster is not None:
        lines += [f"coordinator:  {cluster.address}   (TESSEL_TOKEN={cluster.token})"]
        lines += [f"daemon {d.daemon_id:4} on {d.host.name}: {d.address}" for d in cluster.daemons]
        lines += [
            "a rank:  ip netns exec NAMESPACE env TESSEL_COORDINATOR=… TESSEL_TOKEN=… TESSEL_JOB_ID=job "
            "TESSEL_RANK=r TESSEL_WORLD_SIZE=n TESSEL_DAEMON_ID=dR python script.py"
        ]
    return "\n".join(lines)


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "clean":
        removed = remove_stale()
        print(f"removed {len(removed)} stale namespaces" + "".join(f"\n  {n}" for n in removed))
        return 0
    if args.command == "run" and args.daemons_per_host < 1:
        print("scripts/testbed.py run: --daemons-per-host must be at least 1 (ranks run on daemons)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)  # like Ctrl-C: the finally blocks below remove everything
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tessel-testbed-"))
    try:
        with Testbed(args.hosts, args.rate) as bed:
            cluster = None
            try:
                if args.daemons_per_host > 0:
                    cluster = TestbedCluster(bed, workdir, args.daemons_per_host, args.threads)
                if args.command == "up":
                    print(_usage(bed, cluster), f"\n\nup for {args.hold:g} s; Ctrl-C removes it", flush=True)
                    threading.Event().wait(args.hold)
                    return 0
                results = cluster.run_ranks([args.script, *args.args], timeout_s=args.timeout)
                print(describe(results), flush=True)
                codes = [r.returncode for r in results]
                return next((c if c is not None else 124 for c in codes if c != 0), 0)
            finally:
                if cluster is not None:
                    cluster.close()
    except TestbedUnavailable as exc:
        print(f"scripts/testbed.py: cannot build the test bed: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
