"""Run under `tessel run -n 2 dp_errors.py CASE`: the data-parallel error paths. Prints `caught: <message>`.

CASE: unsharded (a dataset without num_shards: a warning, training still runs), differs (rank 1 starts from other
parameters: an error naming the parameter and the ranks), count (rank 1 has one more parameter), mean (gradients_mean
with HYBRID_PARALLEL: a clear error), pipeline (pipeline_stages=2 under DATA_PARALLEL: an error, not the whole model on
every rank).
"""

import sys
import warnings

import numpy as np

import tessel as ms
import tessel.dataset as ds
from tessel import nn
from tessel.communication import get_rank, init
from tessel.core.errors import ConfigurationError

CASE = sys.argv[1]
init()
rank = get_rank()
mode = ms.ParallelMode.HYBRID_PARALLEL if CASE == "mean" else ms.ParallelMode.DATA_PARALLEL
ms.set_auto_parallel_context(parallel_mode=mode, gradients_mean=True)
if CASE == "pipeline":
    ms.set_auto_parallel_context(pipeline_stages=2)
ms.set_seed(1 + (rank if CASE == "differs" else 0))
net = nn.Dense(4, 3) if not (CASE == "count" and rank == 1) else nn.SequentialCell(nn.Dense(4, 3), nn.Dense(3, 3))
x = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
shards = {} if CASE == "unsharded" else {"num_shards": 2, "shard_id": rank}
dataset = ds.NumpySlicesDataset({"x": x, "y": np.zeros(16, np.int32)}, shuffle=False, **shards).batch(4)
model = ms.Model(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.1))
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    try:
        model.train(1, dataset)
    except ConfigurationError as error:
        print(f"caught: {error}", flush=True)
        sys.exit(0)
for warning in seen:
    print(f"warned: {warning.message}", flush=True)
print("trained", flush=True)
