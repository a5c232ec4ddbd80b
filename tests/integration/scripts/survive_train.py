"""Run under `tessel run -n N survive_train.py STEPS SLEEP_S`: data-parallel least squares with gradients and losses
all-reduced, slow enough (SLEEP_S per step) for a test to kill and restart the coordinator in the middle.

Prints "step i loss L" for every step, then "losses L0 ... Ln-1" (the same on every rank); any error raises.
"""

import sys
import time

import numpy as np

from tessel.communication import comm_func, get_group_size, get_rank, init

steps, sleep_s = int(sys.argv[1]), float(sys.argv[2])
init()
rank, world = get_rank(), get_group_size()
rng = np.random.default_rng(5)
x = rng.standard_normal((16 * world, 8)).astype(np.float32)
y = (x @ np.arange(1, 9, dtype=np.float32) + 0.5).astype(np.float32)
mine = slice(16 * rank, 16 * (rank + 1))
w = np.zeros(8, np.float32)


def reduced(value: np.ndarray) -> np.ndarray:
    out, _ = comm_func.all_reduce(value)
    return np.asarray(out.asnumpy() if hasattr(out, "asnumpy") else out, dtype=np.float32)


losses = []
for step in range(steps):
    error = x[mine] @ w - y[mine]
    total = reduced(np.array([error @ error, *(x[mine].T @ error)], np.float32))
    loss, grad = total[0] / len(x), total[1:] / len(x)
    w -= np.float32(0.05) * grad
    losses.append(float(loss))
    print(f"step {step} loss {loss:.9g}", flush=True)
    time.sleep(sleep_s)
print("losses " + " ".join(f"{v:.9g}" for v in losses), flush=True)
