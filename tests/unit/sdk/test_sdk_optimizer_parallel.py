"""Optimizer parallel and gradient accumulation through the SDK on one rank: the options are checked as MindSpore
checks them, AutoParallel.hsdp and its disable_* companions set the job's context, and GradAccumulation returns the
sum of its micro-batches' losses while a train step over it takes one update equal to the whole batch's."""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
from tessel import context, nn
from tessel.core.errors import ConfigurationError
from tessel.parallel.auto_parallel import AutoParallel
from tessel.parallel.nn import GradAccumulation


def test_parallel_optimizer_config_is_checked_as_mindspore_checks_it():
    ms.set_auto_parallel_context(enable_parallel_optimizer=True)
    assert context.optimizer_shard_config() == ("level1", 64, -1)
    ms.set_auto_parallel_context(parallel_optimizer_config={"gradient_accumulation_shard": True})
    assert context.optimizer_shard_config() == ("level2", 64, -1)
    config = {"optimizer_level": "level3", "parallel_optimizer_threshold": 0, "optimizer_weight_shard_size": 2}
    ms.set_auto_parallel_context(parallel_optimizer_config=config)
    assert context.optimizer_shard_config() == ("level3", 0, 2)
    for bad, message in [
        ({"optimizer_level": "level4"}, "optimizer_level should be in"),
        ({"parallel_optimizer_threshold": -1}, "parallel_optimizer_threshold must be an int >= 0"),
        ({"optimizer_weight_shard_size": 0}, "optimizer_weight_shard_size must be a positive int or -1"),
        ({"gradient_accumulation_shard": True, "optimizer_level": "level1"}, "which is optimizer_level 'level2'"),
        ({"shard": 1}, r"unknown key\(s\) \['shard'\]"),
    ]:
        with pytest.raises(ConfigurationError, match=message):
            ms.set_auto_parallel_context(parallel_optimizer_config=bad)
    ms.set_auto_parallel_context(enable_parallel_optimizer=False)
    assert context.optimizer_shard_config() is None


def test_hsdp_and_its_companions_set_the_context():
    net = AutoParallel(nn.Dense(4, 2))
    net.hsdp(shard_size=2, threshold=8, optimizer_level="level2")
    assert ms.get_auto_parallel_context("enable_parallel_optimizer") is True
    assert context.optimizer_shard_config() == ("level2", 8, 2)
    net.disable_gradient_fp32_sync()
    net.disable_loss_repeated_mean()
    assert ms.get_auto_parallel_context("gradient_fp32_sync") is False
    assert ms.get_auto_parallel_context("loss_repeated_mean") is False
    ms.reset_auto_parallel_context()
    net._apply()  # the wrapper's configuration is the job's again whenever it runs
    assert context.optimizer_shard_config() == ("level2", 8, 2)
    other = AutoParallel(nn.Dense(4, 2))  # an eval network: none of the first wrapper's settings
    other._apply()
    assert ms.get_auto_parallel_context("enable_parallel_optimizer") is False
    assert ms.get_auto_parallel_context("gradient_fp32_sync") is True
    assert ms.get_auto_parallel_context("loss_repeated_mean") is True
    net._apply()
    assert ms.get_auto_parallel_context("gradient_fp32_sync") is False
    for kwargs, message in [
        ({"shard_size": 0}, "shard_size must be a positive integer or -1"),
        ({"threshold": -1}, "threshold must be a positive integer or 0"),
        ({"optimizer_level": "level0"}, "Optimizer level should in"),
    ]:
        with pytest.raises(ValueError, match=message):
            net.hsdp(**kwargs)


def test_grad_accumulation_checks_its_arguments():
    with pytest.raises(TypeError, match="must cell type"):
        GradAccumulation(lambda x: x, 2)
    with pytest.raises(TypeError, match="must be integer"):
        GradAccumulation(nn.Dense(2, 2), 2.0)
    with pytest.raises(ValueError, match="must be large than 0"):
        GradAccumulation(nn.Dense(2, 2), 0)
    assert ms.nn.GradAccumulation is ms.nn.GradAccumulationCell is GradAccumulation


class OwnStep(nn.TrainOneStepCell):
    """A construct of its own (MindSpore's pattern for gradient clipping and the like): not the fused step."""

    def construct(self, *inputs):
        return super().construct(*inputs)


def _train(network_of, steps: int = 3, kind: str = "fused") -> tuple[list[float], np.ndarray]:
    ms.set_seed(4)
    dense = nn.Dense(6, 3)
    network = network_of(nn.WithLossCell(dense, nn.CrossEntropyLoss()))
    optimizer = nn.Momentum(dense.trainable_params(), 0.1, 0.9)
    if kind == "own":
        step = OwnStep(network, optimizer)
    else:
        step = nn.TrainOneStepCell(network, optimizer, return_grad=kind == "return_grad")
    rng = np.random.default_rng(2)
    losses = []
    for _ in range(steps):
        x = rng.standard_normal((8, 6)).astype(np.float32)
        y = rng.integers(0, 3, 8).astype(np.int32)
        out = step(ms.Tensor(x), ms.Tensor(y))
        losses.append(float((out[0] if kind == "return_grad" else out).asnumpy()))
    return losses, dense.weight.asnumpy()


@pytest.mark.parametrize("kind", ["fused", "return_grad", "own"])
@pytest.mark.parametrize("by_context", [False, True])
def test_accumulated_micro_batches_are_one_step_on_the_whole_batch(by_context, kind):
    # fused or not (return_grad=True, a construct of its own), a train step scales the gradients by 1/micro_size
    want_losses, want = _train(lambda net: net)
    if by_context:
        ms.set_auto_parallel_context(grad_accumulation_step=4)
        losses, got = _train(lambda net: net, kind=kind)
    else:
        losses, got = _train(lambda net: GradAccumulation(net, 4), kind=kind)
    # the logged loss sums the 4 micro-batches' mean losses; the update is the whole batch's
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert losses[0] == pytest.approx(4 * want_losses[0], rel=1e-5)


def test_a_train_step_is_built_again_when_gradients_mean_changes():
    # under DATA_PARALLEL the mean or sum of the ranks' gradients is part of the step's graph: a cached step built
    # with the other setting would reduce N times too much or too little
    from tessel.nn.wrap import _step_settings

    ms.set_auto_parallel_context(gradients_mean=False)
    summed = _step_settings()
    ms.set_auto_parallel_context(gradients_mean=True)
    assert _step_settings() != summed


def test_the_context_accumulation_wraps_a_network_once():
    # a wrapper made anew for every step would be traced and compiled anew, and cached without bound
    from tessel.nn.wrap import accumulated

    ms.set_auto_parallel_context(grad_accumulation_step=4)
    net = nn.WithLossCell(nn.Dense(6, 3), nn.CrossEntropyLoss())
    first, micro = accumulated(net)
    assert micro == 4 and isinstance(first, GradAccumulation) and accumulated(net)[0] is first
