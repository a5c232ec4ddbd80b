"""Every rank contributes its rank id; collectives run on the daemons; each rank checks the results.

tessel run -n 4 examples/hello_collectives.py
python examples/hello_collectives.py            # a world of 1, no launcher needed
"""

import numpy as np

from tessel.communication import comm_func, create_group, get_group_size, get_rank, init

init()
rank, size = get_rank(), get_group_size()

x = np.full(4, rank, dtype=np.float32)
total = comm_func.all_reduce(x)[0].asnumpy()
gathered = comm_func.all_gather_into_tensor(x[None])[0].asnumpy()
chunk = comm_func.reduce_scatter_tensor(np.arange(size * 2, dtype=np.float64))[0].asnumpy()
root_value = comm_func.broadcast(np.array([rank * 10], dtype=np.int64), src=size - 1).asnumpy()

assert np.array_equal(total, np.full(4, size * (size - 1) / 2, np.float32)), total
assert np.array_equal(gathered[:, 0], np.arange(size, dtype=np.float32)), gathered
assert np.array_equal(chunk, np.arange(size * 2)[2 * rank : 2 * rank + 2] * size), chunk
assert root_value[0] == (size - 1) * 10, root_value

if size >= 2:
    evens = [r for r in range(size) if r % 2 == 0]
    if rank in evens:
        create_group("evens", evens)
        assert comm_func.all_reduce(np.array([rank]), group="evens")[0].asnumpy()[0] == sum(evens)

print(
    f"rank {rank}/{size}: all_reduce={total[0]:g} all_gather={gathered[:, 0].tolist()} "
    f"reduce_scatter={chunk.tolist()} broadcast={int(root_value[0])} — ok",
    flush=True,
)
