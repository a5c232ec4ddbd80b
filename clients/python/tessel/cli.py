"""The `tessel` command: run | coordinator | daemon | status | timeline."""

from __future__ import annotations

import os
import sys

USAGE = """usage: tessel <command> [options]

commands:
  run          start N ranks of a script (tessel run -n 4 train.py)
  msrun        MindSpore's msrun: scheduler + workers, dynamic networking (tessel msrun --worker_num=4 ...)
  coordinator  serve the cluster's coordinator (tessel coordinator --port 7070)
  daemon       serve one device (tessel daemon --coordinator HOST:PORT --plugin cpu --device 0)
  status       print the cluster's daemons and jobs (tessel status --coordinator HOST:PORT)
  timeline     summarise per-rank timelines: communication hidden, step-time breakdown (tessel timeline DIR)

`tessel <command> --help` describes each command's options.
"""


def main(argv: list[str] | None = None) -> int:
    # The launcher forks children while gRPC threads run; gRPC's fork handlers only add noise there.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "run":
        from tessel.launcher import main as run
    elif command == "msrun":
        from tessel.msrun import main as run
    elif command == "coordinator":
        from tessel.coordinator import main as run
    elif command == "daemon":
        from tessel.daemon.main import main as run
    elif command == "status":
        from tessel.coordinator import status_main as run
    elif command == "timeline":
        from tessel.profiler.report import main as run
    else:
        print(f"tessel: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
