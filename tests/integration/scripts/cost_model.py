"""Run on the multi-host test bed (one rank per daemon): join the job, ask the coordinator for the job's cost model
(the TCP link between the hosts probed by the daemons) and print it as JSON on the last line."""

import json
import os

from tessel.communication import get_rank, init
from tessel.core.coordinator_client import CoordinatorClient

init()
with CoordinatorClient(os.environ["TESSEL_COORDINATOR"]) as client:
    model = client.cost_model(os.environ["TESSEL_JOB_ID"])
link = {"latency_s": model.tcp.latency_s, "bandwidth": model.tcp.bandwidth, "measured": model.tcp.measured}
print(json.dumps({"rank": get_rank(), "tcp": link, "hosts": list(model.hosts)}), flush=True)
