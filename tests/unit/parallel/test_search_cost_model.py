"""The α–β cost model: construction from measurements, collective prices after the CPU plugin's algorithms,
redistribution prices, and the search objective agreeing with predict_step_time on real plans."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from search_testkit import NETS, cheap_links

from tessel.compiler.parallel import Layout, parallelize
from tessel.compiler.parallel.redistribution import allowed_steps
from tessel.compiler.parallel.search import CostModel, DeviceMeasurement, Link, predict_step_time
from tessel.compiler.parallel.search.problem import Problem
from tessel.core.errors import ConfigurationError

MiB = 1 << 20


def test_from_measurements_keeps_the_slowest_device_and_numbers_the_hosts():
    devices = [
        DeviceMeasurement("host-a", 4e10, 1.2e10, 16 << 30),
        DeviceMeasurement("host-a", 3e10, 2e10, 8 << 30),
        DeviceMeasurement("host-b", 5e10, 1e10, 32 << 30),
    ]
    links = {"shared_memory": Link(1e-5, 9e9), "tcp": Link(6e-5, 1e9)}
    model = CostModel.from_measurements(devices, links, op_overhead=1e-6)
    assert (model.flops_per_second, model.memory_bandwidth, model.memory_bytes) == (3e10, 1e10, 8 << 30)
    assert model.hosts == (0, 0, 1) and model.tcp == Link(6e-5, 1e9) and model.op_overhead == 1e-6
    one_host = CostModel.from_measurements(devices[:2], {"shared_memory": Link(1e-5, 9e9)})
    assert one_host.hosts == () and one_host.tcp == CostModel.default_cpu().tcp
    with pytest.raises(ConfigurationError, match=r"unknown link kinds \['infiniband'\]"):
        CostModel.from_measurements(devices, {"infiniband": Link(1e-6, 1e10)})
    with pytest.raises(ConfigurationError, match="at least one device"):
        CostModel.from_measurements([], links)
    with pytest.raises(ConfigurationError, match="rank 3 is outside the 3 ranks"):
        model.collective_time("all_reduce", (0, 3), 1024)


def test_collectives_are_priced_after_the_algorithms_the_cpu_plugin_runs():
    tcp, shm = Link(1e-4, 1e9), Link(1e-5, 1e10)
    model = CostModel(1e10, 1e10, 1 << 30, shm, tcp, hosts=(0, 0, 1, 1))
    b = 8 * MiB
    # Across hosts, ring all-reduce: the agreement (ceil(log2 n) rounds), 2(n-1) steps, 2(n-1)/n of the buffer.
    assert model.collective_time("all_reduce", (0, 2), b) == pytest.approx(3 * 1e-4 + b / 1e9)
    assert model.collective_time("all_reduce", (0, 1, 2, 3), b) == pytest.approx(8 * 1e-4 + 1.5 * b / 1e9)
    assert model.collective_time("all_gather", (0, 1, 2, 3), b) == pytest.approx(5 * 1e-4 + 3 * b / 1e9)
    assert model.collective_time("reduce_scatter", (0, 1, 2, 3), b) == pytest.approx(5 * 1e-4 + 0.75 * b / 1e9)
    # Small data rides with the agreement's Bruck rounds: every member receives every other member's block.
    assert model.collective_time("all_reduce", (0, 1, 2, 3), 1024) == pytest.approx(2 * 1e-4 + 3 * 1024 / 1e9)
    # Within a host, shared memory: the pipelined all-reduce takes a round per segment of n * 512 KiB.
    assert model.collective_time("all_reduce", (0, 1), b) == pytest.approx(9 * 1e-5 + b / 1e10)
    assert model.collective_time("all_gather", (0, 1), b) == pytest.approx(2 * 1e-5 + b / 1e10)
    assert model.collective_time("all_reduce", (2,), b) == 0.0


def test_redistribution_prices_the_collective_each_move_needs():
    model = CostModel.default_cpu(4)
    shape, ranks = (64, 32), (0, 1, 2, 3)
    rows, cols = Layout.from_strategy((4, 1), 4), Layout.from_strategy((1, 4), 4)
    whole, partial = Layout.replicated(2, 4), Layout((4,), (-1, -1), partial=(0,))
    local, full = 16 * 32 * 4, 64 * 32 * 4

    def price(a, b):
        return model.redistribution_time(a, b, shape, 4)

    assert price(rows, Layout((2, 2), ((1, 0), -1))) == 0.0  # the same blocks on another device matrix
    assert price(rows, whole) == pytest.approx(model.collective_time("all_gather", ranks, local))
    assert price(whole, rows) == pytest.approx(model.copy_time(local))
    assert price(rows, cols) == pytest.approx(model.collective_time("all_to_all", ranks, local))
    assert price(partial, whole) == pytest.approx(model.collective_time("all_reduce", ranks, full))
    assert price(partial, rows) == pytest.approx(model.collective_time("reduce_scatter", ranks, full))
    # Rows split over (2, 2) in the other order put the blocks on other ranks: they must move.
    assert price(Layout((2, 2), ((1, 0), -1)), Layout((2, 2), ((0, 1), -1))) > 0
    # Without AlltoAll (enable_alltoall=False) rows become columns by gathering the rows and slicing the columns.
    gathered = dataclasses.replace(model, alltoall=False).redistribution_time(rows, cols, shape, 4)
    assert gathered == pytest.approx(model.collective_time("all_gather", ranks, local) + model.copy_time(local))


@pytest.mark.parametrize("net", sorted(NETS))
@pytest.mark.parametrize(
    "devices, model",
    [
        (2, CostModel.default_cpu(2)),
        (4, CostModel.default_cpu(4, devices_per_host=2)),
        (4, cheap_links()),
        (4, dataclasses.replace(cheap_links(), alltoall=False)),
    ],
)
def test_the_search_objective_is_the_step_time_predicted_for_the_plan(net, devices, model):
    """problem.evaluate(choice) == predict_step_time(parallelize(strategies(choice))): the modes minimise exactly
    what the predictor reports, redistributions as the pass really inserts them."""
    graph, params = NETS[net]()
    problem = Problem(graph, devices, {}, params, "data_parallel", model)
    rng = random.Random(devices)
    for _ in range(12):
        choice = [rng.randrange(len(v.options)) for v in problem.variables]
        time, memory = problem.evaluate(choice)
        if math.isinf(time):
            continue
        plan = parallelize(graph, problem.strategies(choice), devices, params, steps=allowed_steps(model.alltoall))
        step = predict_step_time(plan, model)
        assert step.total == pytest.approx(time, rel=1e-12) and step.memory_bytes == pytest.approx(memory)


def test_step_time_prediction_counts_gradients_of_replicated_parameters_and_the_loss_all_reduce():
    graph, params = NETS["mlp"]()
    model = CostModel.default_cpu(4, devices_per_host=2)
    data_parallel = predict_step_time(parallelize(graph, {}, 4, params), model)
    # The only move: the loss, a partial sum on every rank, all-reduced across the hosts, forward only (the gradient
    # starts from the partial sums: no collective of the seed).
    assert data_parallel.redistribution == pytest.approx(model.collective_time("all_reduce", (0, 1, 2, 3), 4))
    assert data_parallel.gradients > 0 and "ms" in repr(data_parallel)
    matmul = graph.nodes[0]
    split = predict_step_time(parallelize(graph, {matmul: ((1, 1), (1, 4))}, 4, params), model)
    assert split.gradients < data_parallel.gradients  # w1 is cut, not replicated: no all-reduce of its gradient


def test_slicing_a_replicated_tensor_is_a_local_copy_not_communication():
    """A whole (full_batch) input read in any cut: a StridedSlice on each rank, priced as a copy; the search counts
    it as compute, not communication (sharding_propagation ranks candidates by communication first)."""
    from search_testkit import stacked_layers

    from tessel.compiler.parallel.search.cost_model import is_local_slice

    model = CostModel.default_cpu(4)
    whole, rows = Layout.from_axes((4,), ((), ())), Layout.from_axes((4,), ((0,), ()))
    for strategy in [(4, 1), (1, 4), (2, 2)]:
        want = Layout.from_strategy(strategy, 4)
        assert is_local_slice(whole, want), strategy
        assert is_local_slice(rows, want) == (strategy == (4, 1)), strategy
        copy = model.copy_time(16 * 2048 * 4 / math.prod(strategy))
        assert model.redistribution_time(whole, want, (16, 2048), 4) == pytest.approx(copy), strategy
    graph, params = stacked_layers(1, 16, 2048)
    row = {}
    for dataset in ("full_batch", "data_parallel"):
        problem = Problem(graph, 4, {}, params, dataset, model)
        first = problem.variables[problem.node_var[graph.nodes[0]]]
        row[dataset] = next(o for o in first.options if o.placement.strategy == ((4, 1), (1, 1)))
    # the same cut of the batch: sliced in place from the whole batch, taken as it comes from the data-parallel one
    assert row["full_batch"].communication == pytest.approx(row["data_parallel"].communication)
    assert row["full_batch"].communication > 0  # the replicated weight's gradient all-reduce
    assert row["full_batch"].time > row["data_parallel"].time  # the slice's copy
