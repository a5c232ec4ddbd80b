"""tessel.coordinator: the cluster's registry of daemons, jobs and their rendezvous, and failure propagation.

Example (embedded, as the launcher does):
    from tessel.coordinator import CoordinatorClient, format_status, serve
    with serve(port=0, token="secret") as server:
        client = CoordinatorClient(server.address, token="secret")
        print(format_status(client.cluster_status()))
"""

from tessel.coordinator.cli import main
from tessel.coordinator.service import CoordinatorServer, serve
from tessel.coordinator.state import CoordinatorState
from tessel.coordinator.status import format_status, status_main
from tessel.core.coordinator_client import COORDINATOR_LOST, DEFAULT_PORT, CoordinatorClient, HeartbeatHandle

__all__ = [
    "COORDINATOR_LOST",
    "DEFAULT_PORT",
    "CoordinatorClient",
    "CoordinatorServer",
    "CoordinatorState",
    "HeartbeatHandle",
    "format_status",
    "main",
    "serve",
    "status_main",
]
