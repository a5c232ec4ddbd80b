"""Every mode's plan computes what one device computes: for an MLP, a conv net and a net using one parameter in two
ops, on 2 and 4 simulated ranks, the loss and every parameter's gradient equal the single-device result to float32
rounding. Two cost models steer the search to different plans: the default one (data parallel wins) and one whose
links are nearly free (weights get split, partial sums appear)."""

from __future__ import annotations

import pytest
from par_testkit import close, parallel_forward, parallel_grads, reference_grads
from search_testkit import MODES, NETS, cheap_links, feeds_for

from tessel.compiler.parallel import parallelize
from tessel.compiler.parallel.search import CostModel, plan_strategies

MODELS = {"default": CostModel.default_cpu, "cheap links": lambda devices: cheap_links()}


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("net", sorted(NETS))
def test_every_modes_plan_equals_one_device(net, devices, model):
    graph, params = NETS[net]()
    feeds = feeds_for(graph)
    loss, grads = reference_grads(graph, feeds, params)
    for mode in MODES:
        cost_model = MODELS[model](devices)
        strategies = plan_strategies(graph, mode=mode, device_num=devices, parameters=params, cost_model=cost_model)
        plan = parallelize(graph, strategies, devices, params)
        what = f"{net} on {devices} ranks, {mode}, {model} model"
        (forward,) = parallel_forward(plan, feeds)
        close(forward, loss, what=f"{what}: loss")
        losses, _, full = parallel_grads(plan, feeds, params)
        for rank_loss in losses:
            close(rank_loss, loss, what=f"{what}: loss on a rank")
        for name in params:
            close(full[name], grads[name], what=f"{what}: gradient of {name}")


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("net", ["mlp", "shared"])
def test_plans_around_a_configured_column_split_equal_one_device(net, devices):
    """The first MatMul configured to split its weight's columns: the search plans the rest around it (in the
    shared net the second MatMul must then cut the same weight alike)."""
    graph, params = NETS[net]()
    feeds = feeds_for(graph, seed=1)
    loss, grads = reference_grads(graph, feeds, params)
    first = next(node for node in graph.nodes if node.op == "MatMul")
    for mode in MODES:
        strategies = plan_strategies(
            graph, mode=mode, device_num=devices, fixed={first: ((1, 1), (1, devices))}, parameters=params
        )
        plan = parallelize(graph, strategies, devices, params)
        (forward,) = parallel_forward(plan, feeds)
        close(forward, loss, what=f"{net}, {mode}: loss")
        _, _, full = parallel_grads(plan, feeds, params)
        for name in params:
            close(full[name], grads[name], what=f"{net} on {devices} ranks, {mode}: gradient of {name}")


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("net", sorted(NETS))
def test_every_modes_plan_from_a_full_batch_equals_one_device(net, model):
    """full_batch=True: every rank holds the whole batch and each plan slices it where its ops want (the cheap-links
    model steers the search to other cuts of the data than the batch dim); loss and gradients stay those of one
    device."""
    graph, params = NETS[net]()
    feeds = feeds_for(graph, seed=2)
    loss, grads = reference_grads(graph, feeds, params)
    for mode in MODES:
        strategies = plan_strategies(
            graph, mode=mode, device_num=4, parameters=params, dataset="full_batch", cost_model=MODELS[model](4)
        )
        plan = parallelize(graph, strategies, 4, params, "full_batch")
        what = f"{net}, {mode}, {model} model, full_batch"
        data = [v for v in graph.inputs if v.name not in params]
        assert all(plan.input_layout(v.name).replicas == 4 for v in data), what  # every rank the whole batch
        losses, _, full = parallel_grads(plan, feeds, params)
        for rank_loss in losses:
            close(rank_loss, loss, what=f"{what}: loss on a rank")
        for name in params:
            close(full[name], grads[name], what=f"{what}: gradient of {name}")
