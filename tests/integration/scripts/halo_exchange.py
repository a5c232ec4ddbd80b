"""Run under `tessel run -n N halo_exchange.py ROWS COLS PADDING`: ops.NeighborExchangeV2 on a ROWS x COLS grid of
ranks (rank = i * COLS + j), each holding one spatial block of a global NCHW image, checked against numpy.

Every rank sends DOWN rows to the rank below, UP rows to the rank above, RIGHT / LEFT columns sideways, and the
corners to its diagonal neighbours. The float64 reference needs no model of the exchange: a rank's output is
the window of the global image (zero-padded on its outer edges) around its block, and the gradient of
sum_r <W_r, output_r> with respect to each input element is the sum of the W_r entries that element landed in.
PADDING: "fit" (recv_lens 0 where there is no neighbour, as MindSpore's docs do) or "zeros" (the same recv_lens
on every rank; sides without a neighbour come back as zeros).
Checks the eager call, a GRAPH_MODE Cell and the gradient (ms.grad); prints `halo ok on rank r of n: C checks`.
"""

import sys

import numpy as np

import tessel as ms
from tessel import nn, ops
from tessel.communication import get_group_size, get_rank, init

init()
rank, world = get_rank(), get_group_size()
ROWS, COLS, PADDING = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
assert world == ROWS * COLS, f"grid {ROWS}x{COLS} needs {ROWS * COLS} ranks, got {world}"
N, C, H, W = 2, 3, 5, 4
DOWN, UP, RIGHT, LEFT = 2, 1, 1, 2  # asymmetric, so a swapped border or direction shows


def neighbour(r: int, di: int, dj: int) -> int:
    i, j = divmod(r, COLS)
    i, j = i + di, j + dj
    return i * COLS + j if 0 <= i < ROWS and 0 <= j < COLS else -1


OFFSETS = [(-1, 0), (-1, 1), (0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1)]  # MindSpore's 8 directions


def config(r: int) -> tuple[list[int], list[int]]:
    """(rank ids of the 8 neighbours, recv_lens [top, bottom, left, right]) of rank r."""
    ids = [neighbour(r, di, dj) for di, dj in OFFSETS]
    recv = [DOWN, UP, RIGHT, LEFT]  # the rows the rank above sends down arrive on top, and so on
    if PADDING == "fit":
        recv = [n if ids[d] != -1 else 0 for n, d in zip(recv, (0, 4, 6, 2))]
    return ids, recv


def global_image() -> np.ndarray:
    return np.random.default_rng(7).uniform(-1, 1, (N, C, ROWS * H, COLS * W))


def block(image: np.ndarray, r: int) -> np.ndarray:
    i, j = divmod(r, COLS)
    return image[:, :, i * H : (i + 1) * H, j * W : (j + 1) * W]


def window(r: int) -> tuple[slice, slice]:
    """Rank r's output window in the global image zero-padded by the largest halo on every side."""
    i, j = divmod(r, COLS)
    top, bottom, left, right = config(r)[1]
    pad_h, pad_w = max(DOWN, UP), max(RIGHT, LEFT)
    rows = slice(pad_h + i * H - top, pad_h + (i + 1) * H + bottom)
    cols = slice(pad_w + j * W - left, pad_w + (j + 1) * W + right)
    return rows, cols


def padded(image: np.ndarray) -> np.ndarray:
    pad_h, pad_w = max(DOWN, UP), max(RIGHT, LEFT)
    return np.pad(image, ((0, 0), (0, 0), (pad_h, pad_h), (pad_w, pad_w)))


def weights(r: int, shape) -> np.ndarray:
    return np.random.default_rng([11, r]).uniform(-1, 1, shape)


def reference() -> tuple[np.ndarray, np.ndarray]:
    """This rank's output and the gradient of sum over ranks of <W_r, output_r> w.r.t. its block (float64)."""
    image = global_image()
    big = padded(image)
    rows, cols = window(rank)
    out = big[:, :, rows, cols]
    grad_big = np.zeros_like(big)
    for r in range(world):
        rows_r, cols_r = window(r)
        shape = big[:, :, rows_r, cols_r].shape
        grad_big[:, :, rows_r, cols_r] += weights(r, shape)
    pad_h, pad_w = max(DOWN, UP), max(RIGHT, LEFT)
    grad = grad_big[:, :, pad_h : pad_h + ROWS * H, pad_w : pad_w + COLS * W]
    return out, block(grad, rank)


ids, recv_lens = config(rank)
halo = ops.NeighborExchangeV2(
    send_rank_ids=ids, recv_rank_ids=ids, send_lens=[UP, DOWN, LEFT, RIGHT], recv_lens=recv_lens, data_format="NCHW"
)
x = ms.Tensor(block(global_image(), rank).astype(np.float32))
want_out, want_grad = reference()
checks = 0


def check(name: str, got, want) -> None:
    global checks
    got = np.asarray(got.asnumpy() if hasattr(got, "asnumpy") else got, np.float64)
    assert got.shape == want.shape, f"{name} on rank {rank}: shape {got.shape}, want {want.shape}"
    worst = float(np.abs(got - want).max())
    assert worst <= 1e-5, f"{name} on rank {rank}: differs from numpy by {worst:.2e}\n{got}\nwant\n{want}"
    checks += 1


class Halo(nn.Cell):
    def __init__(self):
        super().__init__()
        self.halo = halo

    def construct(self, x):
        return self.halo(x)


check("eager output", halo(x), want_out)
check("graph output", Halo()(x), want_out)
w = ms.Tensor(weights(rank, want_out.shape).astype(np.float32))


def loss(x):
    return (halo(x) * w).sum()


check("gradient", ms.grad(loss, grad_position=0)(x), want_grad)
print(f"halo ok on rank {rank} of {world}: {checks} checks", flush=True)
