"""Tables, targets and the JSON record of benchmarks/collectives.py (NCCL-tests conventions).

algbw = size / time; busbw = algbw x 2(n-1)/n for AllReduce, x (n-1)/n for AllGather and ReduceScatter, x 1 for
Broadcast. "size" is the AllReduce/Broadcast buffer, the AllGather output, the ReduceScatter input.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from _collectives_launch import Measurement

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
TITLES = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter"}
TITLES["broadcast"] = "Broadcast"
PEERS = ("gloo", "MPI")
# The tessel series compared with the peers, per collective: AllReduce shows each of its paths in its own table.
TESSEL_SERIES = {"all_reduce": ("tessel", "tessel zero-copy", "tessel tcp", "tessel tcp+tls")}
SERIES_TITLES = {
    "tessel": "numpy input, shared memory",
    "tessel zero-copy": "zero-copy input from comm.buffer(), shared memory",
    "tessel tcp": "numpy input, TCP transport (TESSEL_TRANSPORT=tcp)",
    "tessel tcp+tls": "numpy input, TCP transport encrypted (TESSEL_TRANSPORT=tcp TESSEL_DATA_TLS=on)",
}
MIB = 1 << 20


def bus_factor(op: str, ranks: int) -> float:
    if op == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if op in ("all_gather", "reduce_scatter"):
        return (ranks - 1) / ranks
    return 1.0


def busbw(measurement: Measurement) -> float:
    """Bus bandwidth in bytes/s."""
    return measurement.nbytes / measurement.seconds * bus_factor(measurement.op, measurement.ranks)


def size_label(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _time_label(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _cell(measurement: Measurement | None) -> str:
    if measurement is None:
        return "—"
    return f"{_time_label(measurement.seconds):>9} {busbw(measurement) / 1e9:6.2f} GB/s"


def _ratio(mine: Measurement | None, peer: Measurement | None) -> str:
    return "—" if mine is None or peer is None else f"{busbw(mine) / busbw(peer):.2f}×"


class Results:
    """Measurements indexed by (series, ranks, op, nbytes)."""

    def __init__(self, measurements: Iterable[Measurement]):
        self.index = {(m.series, m.ranks, m.op, m.nbytes): m for m in measurements}

    def get(self, series: str, ranks: int, op: str, nbytes: int) -> Measurement | None:
        return self.index.get((series, ranks, op, nbytes))

    def keys(self, op: str) -> list[tuple[int, int]]:
        """The (ranks, nbytes) measured for op by any series, sorted."""
        return sorted({(ranks, nbytes) for (_, ranks, o, nbytes) in self.index if o == op})


def table(results: Results, op: str, series: str) -> list[str]:
    """One table: rows (ranks, size); columns tessel | gloo | MPI | busbw ratios."""
    title = TITLES[op] + (f" — tessel: {SERIES_TITLES[series]}" if op == "all_reduce" else "")
    widths = (5, 8, 24, 24, 24, 11, 11)
    header = ("ranks", "size", "tessel", "gloo", "MPI", "tessel/gloo", "tessel/MPI")
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(header, widths))]
    for ranks, nbytes in results.keys(op):
        mine = results.get(series, ranks, op, nbytes)
        peers = [results.get(peer, ranks, op, nbytes) for peer in PEERS]
        row = (str(ranks), size_label(nbytes), _cell(mine), *map(_cell, peers), *(_ratio(mine, p) for p in peers))
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    return lines


def tls_cost(results: Results) -> list[str]:
    """What encrypting the TCP data plane costs: AllReduce over TCP with and without TLS, side by side."""
    widths = (5, 8, 24, 24, 12)
    header = ("ranks", "size", "tessel tcp", "tessel tcp+tls", "tls/plain")
    lines = ["AllReduce — cost of TLS on the TCP data plane", "  ".join(h.ljust(w) for h, w in zip(header, widths))]
    for ranks, nbytes in results.keys("all_reduce"):
        plain = results.get("tessel tcp", ranks, "all_reduce", nbytes)
        tls = results.get("tessel tcp+tls", ranks, "all_reduce", nbytes)
        ratio = "—" if plain is None or tls is None else f"{tls.seconds / plain.seconds:.2f}× time"
        row = (str(ranks), size_label(nbytes), _cell(plain), _cell(tls), ratio)
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    return lines


def tables(results: Results) -> list[str]:
    lines = ["Each cell: time per call (slowest rank, median of repetitions) and busbw; ratios are busbw tessel/peer."]
    for op in OPS:
        for series in TESSEL_SERIES.get(op, ("tessel",)):
            lines += ["", *table(results, op, series)]
    return [*lines, "", *tls_cost(results)]


@dataclass(frozen=True)
class Target:
    name: str
    verdict: str  # PASS | FAIL | NOT MEASURED
    detail: str


def _ratio_target(results: Results, series: str, peer: str, factor: float, skipped: dict[str, str]) -> Target:
    name = f"AllReduce busbw ≥ {f'{factor:g}× ' if factor != 1 else ''}{peer}'s at ≥ 4 MiB [{series}]"
    cells = []
    for ranks, nbytes in results.keys("all_reduce"):
        mine, theirs = results.get(series, ranks, "all_reduce", nbytes), results.get(peer, ranks, "all_reduce", nbytes)
        if nbytes >= 4 * MIB and mine and theirs:
            cells.append((busbw(mine) / busbw(theirs), ranks, nbytes))
    if not cells:
        why = skipped.get(peer) or skipped.get(series) or "no AllReduce size ≥ 4 MiB measured by both"
        return Target(name, "NOT MEASURED", why)
    worst = min(cells)
    verdict = "PASS" if worst[0] >= factor else "FAIL"
    failing = sum(ratio < factor for ratio, _, _ in cells)
    detail = f"worst {worst[0]:.2f}× ({worst[1]} ranks, {size_label(worst[2])}); {failing} of {len(cells)} cells below"
    return Target(name, verdict, detail)


def _latency_target(results: Results, series: str, skipped: dict[str, str]) -> Target:
    name = f"4 KiB AllReduce ≤ 50 µs at 2 ranks [{series}]"
    measured = results.get(series, 2, "all_reduce", 4096)
    if measured is None:
        return Target(name, "NOT MEASURED", skipped.get(series) or "4 KiB at 2 ranks was not in the run")
    verdict = "PASS" if measured.seconds <= 50e-6 else "FAIL"
    return Target(name, verdict, f"measured {_time_label(measured.seconds)}")


def targets(results: Results, skipped: dict[str, str]) -> list[Target]:
    """The issue's targets, judged on this run's measurements only."""
    judged = []
    for series in ("tessel", "tessel zero-copy"):
        judged.append(_ratio_target(results, series, "MPI", 1.0, skipped))
        judged.append(_ratio_target(results, series, "gloo", 3.0, skipped))
        judged.append(_latency_target(results, series, skipped))
    return judged


def summary(judged: list[Target]) -> list[str]:
    return ["Targets (this run's measurements):", *(f"  {t.verdict:<12} {t.name}: {t.detail}" for t in judged)]


def record(config: dict, environment: dict, launches: list, judged: list[Target]) -> dict:
    """Everything measured, as JSON-ready data (per-rank repetition times included)."""
    measurements = []
    for launch in launches:
        for m in launch.measurements:
            measurements.append(
                {
                    "series": m.series,
                    "ranks": m.ranks,
                    "op": m.op,
                    "bytes": m.nbytes,
                    "seconds": m.seconds,
                    "busbw_gbps": busbw(m) / 1e9,
                    "algbw_gbps": m.nbytes / m.seconds / 1e9,
                    "iterations": m.iterations,
                    "per_rank_seconds": [list(r) for r in m.per_rank_seconds],
                }
            )
    return {
        "config": config,
        "environment": environment,
        "launches": [
            {"backend": x.backend, "ranks": x.ranks, "wall_s": round(x.wall_s, 2), "skipped": x.skipped}
            for x in launches
        ],
        "measurements": measurements,
        "targets": [{"name": t.name, "verdict": t.verdict, "detail": t.detail} for t in judged],
    }
