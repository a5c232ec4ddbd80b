"""Under `tessel run -n 4`: comm_func.all_reduce of float16 values, plain and under force_fp32_communication (summed in
float32, rounded once); rank 0 holds 2048 and the others 1, so a float16 sum rounds back to 2048 at every addition."""

from __future__ import annotations

import numpy as np

import tessel as ms
from tessel.communication import comm_func, get_rank, init

init()
x = ms.Tensor(np.array([2048.0 if get_rank() == 0 else 1.0, 0.25], np.float16))
plain, _ = comm_func.all_reduce(x)
ms.set_auto_parallel_context(force_fp32_communication=True)
wide, _ = comm_func.all_reduce(x)
try:
    comm_func.all_reduce(x, async_op=True)
    refused = "no"
except NotImplementedError as exc:
    refused = "yes" if "async_op=True) of float16 under force_fp32_communication" in str(exc) else str(exc)
half = plain.dtype == wide.dtype == ms.float16
print(f"rank {get_rank()}: plain {plain.asnumpy().tolist()} wide {wide.asnumpy().tolist()} float16 {half}")
print(f"rank {get_rank()}: async refused {refused}")
