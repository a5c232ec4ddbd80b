"""Run under `tessel run -n N`: every functional collective on this rank's daemon, checked against numpy.

Inputs are a deterministic function of (rank, case), so every rank recomputes all ranks' inputs and the exact
numpy reference itself. Prints `matrix ok: <checks> checks` or the failures, and exits non-zero on any failure.
"""

import sys
import zlib

import numpy as np

from tessel.communication import comm_func, create_group, get_group_size, get_rank, init

init()
rank, size = get_rank(), get_group_size()
SIZES = [int(s) for s in (sys.argv[1].split(",") if len(sys.argv) > 1 else ["0", "1", "7", "1000", "262147"])]
DTYPES = ["float32", "float64", "float16", "int32", "int64", "bool"]
failures: list[str] = []
checks = 0


def make(r: int, case: str, dtype: str, shape) -> np.ndarray:
    rng = np.random.default_rng([r, zlib.crc32(f"{case}/{dtype}/{shape}".encode())])
    if dtype == "bool":
        return rng.random(shape) > 0.5
    if dtype.startswith("int"):
        return rng.integers(-3, 4, size=shape).astype(dtype)
    return rng.uniform(-2, 2, size=shape).astype(dtype)


def check(name: str, got, want, exact: bool) -> None:
    global checks
    checks += 1
    got, want = np.asarray(got), np.asarray(want)
    ok = got.shape == want.shape and got.dtype == want.dtype
    if ok:
        if exact or got.dtype.kind in "biu":
            ok = np.array_equal(got, want)
        else:
            tol = {"float16": 2e-2, "float32": 1e-5, "float64": 1e-12}[str(got.dtype)]
            ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    if not ok:
        failures.append(
            f"{name}: got {got.dtype}{got.shape} {got.ravel()[:4]} want {want.dtype}{want.shape} {want.ravel()[:4]}"
        )


def reference_reduce(parts, op, dtype):
    if dtype == "bool":
        fn = {"sum": np.logical_or, "max": np.logical_or, "prod": np.logical_and, "min": np.logical_and}[op]
        out = parts[0]
        for p in parts[1:]:
            out = fn(out, p)
        return out
    wide = np.stack([p.astype(np.float64) for p in parts])
    out = {"sum": wide.sum(0), "prod": wide.prod(0), "max": wide.max(0), "min": wide.min(0), "mean": wide.mean(0)}[op]
    return out.astype(dtype)


for dtype in DTYPES:
    for n in SIZES:
        ops = ["sum", "prod", "max", "min"] + (["mean"] if dtype.startswith("float") else [])
        for op in ops:
            if op == "prod" and dtype == "float16" and n > 1000:
                continue
            parts = [make(r, "ar" + op, dtype, (n,)) for r in range(size)]
            check(
                f"all_reduce {op} {dtype} n={n}",
                comm_func.all_reduce(parts[rank], op)[0],
                reference_reduce(parts, op, dtype),
                exact=op in ("max", "min") or size == 1,
            )
        parts = [make(r, "ag", dtype, (n, 3)) for r in range(size)]
        check(
            f"all_gather {dtype} n={n}",
            comm_func.all_gather_into_tensor(parts[rank])[0],
            np.concatenate(parts),
            exact=True,
        )
        parts = [make(r, "rs", dtype, (size * n, 2)) for r in range(size)]
        want = reference_reduce(parts, "sum", dtype)[rank * n : (rank + 1) * n]
        check(f"reduce_scatter {dtype} n={n}", comm_func.reduce_scatter_tensor(parts[rank])[0], want, exact=size == 1)
        root = size - 1
        parts = [make(r, "bc", dtype, (n,)) for r in range(size)]
        check(f"broadcast {dtype} n={n}", comm_func.broadcast(parts[rank], src=root), parts[root], exact=True)
        parts = [make(r, "a2a", dtype, (2, size * n)) for r in range(size)]
        want = np.concatenate([np.split(parts[r], size, axis=1)[rank] for r in range(size)], axis=0)
        check(
            f"all_to_all {dtype} n={n}",
            comm_func.all_to_all(parts[rank], split_dim=1, concat_dim=0)[0],
            want,
            exact=True,
        )

# MindSpore 2.5's rooted collectives and all-to-alls with output shapes: the root is the last rank, the blocks of
# uneven sizes (rank r sends r + q + 1 rows to rank q).
root = size - 1
for dtype in ("float32", "int64"):
    parts = [make(r, "rooted", dtype, (2 * size, 3)) for r in range(size)]
    gathered = comm_func.gather_into_tensor(parts[rank], dst=root).asnumpy()
    check(f"gather_into_tensor {dtype}", gathered, np.concatenate(parts) if rank == root else np.zeros(1, dtype), True)
    check(
        f"scatter_tensor {dtype}",
        comm_func.scatter_tensor(parts[rank], src=root),
        np.split(parts[root], size)[rank],
        True,
    )
    reduced = comm_func.reduce(parts[rank], root)
    want = reference_reduce(parts, "sum", dtype) if rank == root else np.zeros(1, dtype)
    check(f"reduce {dtype}", reduced, want, exact=size == 1 or rank != root)
# A dtype the collectives cannot carry is refused on every rank (not only on the root), and the group goes on.
try:
    comm_func.gather_into_tensor(np.ones((2, 2), np.int8), dst=root)
    refused = "no error"
except Exception as exc:  # the daemon's error, raised here
    refused = str(exc)
check("gather_into_tensor of int8 refused", "do not support dtype int8" in refused, True, exact=True)
blocks = [[make(r, "a2a", "float32", (r + q + 1, 4)) for q in range(size)] for r in range(size)]  # [sender][receiver]
outs, _ = comm_func.all_to_all_with_output_shape([(r + rank + 1, 4) for r in range(size)], blocks[rank])
for r, out in enumerate(outs):
    check("all_to_all_with_output_shape", out, blocks[r][rank], exact=True)
single, handle = comm_func.all_to_all_single_with_output_shape(
    (sum(r + rank + 1 for r in range(size)), 4),
    np.concatenate(blocks[rank]),
    output_split_sizes=[r + rank + 1 for r in range(size)],
    input_split_sizes=[rank + q + 1 for q in range(size)],
    async_op=True,
)
handle.wait()
check("all_to_all_single_with_output_shape", single, np.concatenate([blocks[r][rank] for r in range(size)]), True)

# Ring neighbor exchange, send/recv pairs, async, and a subgroup of the odd ranks.
if size > 1:
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    parts = [make(r, "nx", "float32", (5, rank + 1 if r == rank else r + 1)) for r in range(size)]
    got, _ = comm_func.neighbor_exchange([make(rank, "nx", "float32", (5, rank + 1))], [nxt], [prv], [(5, prv + 1)])
    check("neighbor_exchange ring", got[0], make(prv, "nx", "float32", (5, prv + 1)), exact=True)
    if rank % 2 == 0 and nxt != rank and rank + 1 < size:
        comm_func.send(make(rank, "sr", "int64", (9,)), dst=rank + 1)
    elif rank % 2 == 1:
        check(
            "send/recv",
            comm_func.recv(np.zeros(9, np.int64), src=rank - 1),
            make(rank - 1, "sr", "int64", (9,)),
            exact=True,
        )
    # every rank isends to the next before it irecvs from the previous: the two progress together
    sent = comm_func.isend(make(rank, "ring", "float32", (6,)), dst=nxt)
    ring, received = comm_func.irecv(np.zeros(6, np.float32), src=prv)
    sent.wait()
    received.wait()
    check("isend/irecv ring", ring, make(prv, "ring", "float32", (6,)), exact=True)
    batch = comm_func.batch_isend_irecv(
        [
            comm_func.P2POp("isend", make(rank, "batch", "int32", (3,)), nxt),
            comm_func.P2POp(comm_func.irecv, (3,), prv, recv_dtype=np.int32),
        ]
    )
    check("batch_isend_irecv", batch[1], make(prv, "batch", "int32", (3,)), exact=True)
    check("batch_isend_irecv's send place", batch[0], np.zeros((), np.int32), exact=True)
    out, handle = comm_func.all_reduce(np.full(3, rank, np.float64), async_op=True)
    handle.wait()
    check("async all_reduce", out, np.full(3, sum(range(size)), np.float64), exact=True)
    odd = [r for r in range(size) if r % 2 == 1]
    if rank in odd:
        create_group("odd", odd)
        parts = [make(r, "grp", "float64", (11,)) for r in odd]
        check(
            "subgroup all_reduce",
            comm_func.all_reduce(parts[odd.index(rank)], group="odd")[0],
            reference_reduce(parts, "sum", "float64"),
            exact=len(odd) == 1,
        )
        check(
            "subgroup all_gather",
            comm_func.all_gather_into_tensor(parts[odd.index(rank)], group="odd")[0],
            np.concatenate(parts),
            exact=True,
        )

comm_func.barrier()
if failures:
    print(f"rank {rank}: {len(failures)} of {checks} checks failed:\n" + "\n".join(failures[:30]), flush=True)
    sys.exit(1)
print(f"matrix ok: {checks} checks on rank {rank} of {size}", flush=True)
