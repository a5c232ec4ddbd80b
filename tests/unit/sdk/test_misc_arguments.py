"""MindSpore arguments that work as documented or are refused by name: grad/value_and_grad(return_ids),
GeneratorDataset(schema, python_multiprocessing), communication local ranks of a group and init(backend_name),
AutoParallel.comm_fusion(openstate), Parameter.init_data(layout, set_sliced) and load_param_into_net(strict_load)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest
from sdk_testkit import rand

import tessel as ms
import tessel.dataset as ds
from tessel import communication, nn, ops
from tessel.communication import runtime as rt
from tessel.core import options
from tessel.core.errors import ConfigurationError, NotSupportedYetError
from tessel.parallel.auto_parallel import AutoParallel

X, Y, Z = rand(3, 2), rand(3, 2, seed=1), rand(3, 2, seed=2)


# --- grad / value_and_grad(return_ids) ----------------------------------------------------------------------------


def _xyz(x, y, z):
    return (x * y * z).sum()


def _close(got, want):
    np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-5)


def test_return_ids_pairs_each_input_gradient_with_its_position():
    args = (ms.Tensor(X), ms.Tensor(Y), ms.Tensor(Z))
    plain = ms.grad(_xyz, grad_position=(1, 2))(*args)
    with_ids = ms.grad(_xyz, grad_position=(1, 2), return_ids=True)(*args)
    assert [i for i, _ in with_ids] == [1, 2]
    _close(with_ids[0][1], X * Z)  # d/dy, by hand
    _close(with_ids[1][1], X * Y)
    for (_, got), want in zip(with_ids, plain):
        np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())
    position, dx = ms.grad(_xyz, return_ids=True)(*args)  # an int position: one (position, grad) pair
    assert position == 0
    _close(dx, Y * Z)
    last, dz = ms.grad(_xyz, grad_position=2, return_ids=True)(*args)
    assert last == 2
    _close(dz, X * Y)


def test_return_ids_pairs_each_weight_gradient_with_its_name_in_value_and_grad_too():
    w = ms.Parameter(ms.Tensor(rand(2, 4, seed=3)), name="w")
    b = ms.Parameter(ms.Tensor(np.zeros(4, np.float32)), name="b")

    def forward(x):
        out = ops.matmul(x, w) + b
        return out.sum(), out

    x = ms.Tensor(X)
    (loss, _), ((position, dx), ((w_name, dw), (b_name, db))) = ms.value_and_grad(
        forward, 0, [w, b], has_aux=True, return_ids=True
    )(x)
    _, (dx_plain, (dw_plain, db_plain)) = ms.value_and_grad(forward, 0, [w, b], has_aux=True)(x)
    _close(loss, (X @ w.asnumpy()).sum())
    assert (position, w_name, b_name) == (0, "w", "b")
    _close(dw, np.repeat(X.sum(0)[:, None], 4, 1))
    _close(db, np.full(4, 3.0))
    for got, want in ((dx, dx_plain), (dw, dw_plain), (db, db_plain)):
        np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())
    (name, grad), aux = ms.grad(forward, None, w, has_aux=True, return_ids=True)(x)  # one Parameter: one pair
    assert name == "w" and len(aux) == 1
    np.testing.assert_array_equal(grad.asnumpy(), dw.asnumpy())
    only_weights = ms.grad(forward, None, (w,), has_aux=True, return_ids=True)(x)[0]
    assert [n for n, _ in only_weights] == ["w"]


def test_return_ids_must_be_a_bool():
    with pytest.raises(ConfigurationError, match="return_ids must be a bool"):
        ms.grad(_xyz, return_ids="yes")


# --- GeneratorDataset(schema, python_multiprocessing) -------------------------------------------------------------


def _pairs():
    return [(np.array([i], np.int32), np.array([i * i], np.int32)) for i in range(4)]


def test_generator_schema_is_refused_by_name():
    with pytest.raises(NotSupportedYetError, match=r"GeneratorDataset\(schema=\.\.\.\).*column_names"):
        ds.GeneratorDataset(_pairs(), column_names=["x", "y"], schema="schema.json")


def test_generator_python_multiprocessing_changes_no_row_and_is_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(options, "_logged", set())

    def rows(**given):
        data = ds.GeneratorDataset(_pairs(), column_names=["x", "y"], shuffle=False, **given)
        return [tuple(int(c[0]) for c in row) for row in data.create_tuple_iterator(output_numpy=True)]

    with caplog.at_level(logging.INFO, logger="tessel"):
        default = rows()
        assert not caplog.records
        assert rows(python_multiprocessing=False) == default == [(i, i * i) for i in range(4)]
        assert rows(python_multiprocessing=False) == default
        assert rows(python_multiprocessing=True) == default
    assert [r.getMessage() for r in caplog.records] == [
        "GeneratorDataset: python_multiprocessing=False has no effect in tessel; tessel reads and maps rows in the "
        "process that consumes them, with the same rows as a run with workers"
    ]
    assert caplog.records[0].levelno == logging.INFO
    with pytest.raises(ConfigurationError, match="python_multiprocessing must be a bool"):
        ds.GeneratorDataset(_pairs(), column_names=["x", "y"], python_multiprocessing="no")


# --- communication: local ranks of a group, init(backend_name) ----------------------------------------------------


@pytest.fixture
def four_ranks_on_two_hosts(monkeypatch):
    """Rank 3 of a world of 4: ranks 0, 1 on host "a", ranks 2, 3 on host "b" (no daemon is needed)."""
    fake = rt.Runtime("job", 3, 4, 1, 2, daemon=None, session_id="s", hosts=("a", "a", "b", "b"))
    fake.groups.update({"mixed": (1, 3, 2), "spread": (0, 3), "host_a": (0, 1)})
    monkeypatch.setattr(rt, "_runtime", fake)
    return fake


def test_local_rank_of_a_group_counts_its_ranks_on_this_host(four_ranks_on_two_hosts):
    assert (communication.get_local_rank(), communication.get_local_rank_size()) == (1, 2)  # the world's
    assert (communication.get_local_rank("mixed"), communication.get_local_rank_size("mixed")) == (0, 2)
    assert (communication.get_local_rank("spread"), communication.get_local_rank_size("spread")) == (0, 1)
    assert communication.get_rank("mixed") == 1  # its group rank differs from its local rank in the group
    with pytest.raises(ConfigurationError, match=r"rank 3 is not in group 'host_a'"):
        communication.get_local_rank("host_a")
    with pytest.raises(ConfigurationError, match="unknown group 'nope'"):
        communication.get_local_rank_size("nope")


def test_local_rank_of_a_group_is_refused_where_hosts_are_unknown(four_ranks_on_two_hosts):
    four_ranks_on_two_hosts.hosts = ()
    assert communication.get_local_rank() == 1  # the world's still comes from the coordinator
    for call in (communication.get_local_rank, communication.get_local_rank_size):
        with pytest.raises(NotSupportedYetError, match=rf"{call.__name__}\(group='mixed'\)"):
            call("mixed")


def test_hosts_come_from_the_members_of_the_job():
    members = [SimpleNamespace(rank=r, host_id=h) for r, h in ((1, "a"), (0, "b"), (2, "a"))]
    assert rt.hosts_of(members, 3) == ("b", "a", "a")
    assert rt.hosts_of(members, 4) == ()  # a rank missing: unknown, never guessed


def test_init_takes_mindspores_backend_names_and_refuses_others():
    for name in (None, "hccl", "nccl", "mccl"):
        communication.init(name)
        assert communication.GlobalComm.INITED
    assert len(rt.current().hosts) == rt.current().world_size
    for bad in ("HCCL", "ncl", "gloo", 1):
        with pytest.raises(ConfigurationError, match=r"backend_name must be None or one of 'hccl', 'nccl', 'mccl'"):
            communication.init(bad)


# --- AutoParallel.comm_fusion(openstate) --------------------------------------------------------------------------


def test_comm_fusion_forwards_openstate_as_the_context_does():
    parallel = AutoParallel(nn.Dense(4, 2))
    with pytest.raises(NotSupportedYetError, match="comm_fusion openstate=False"):
        parallel.comm_fusion({"openstate": False, "allreduce": {"mode": "size", "config": 32}})
    with pytest.raises(NotSupportedYetError, match="comm_fusion openstate=False"):
        ms.set_auto_parallel_context(comm_fusion={"openstate": False})  # the reference behaviour
    config = {"openstate": True, "allreduce": {"mode": "size", "config": 32}}
    parallel.comm_fusion(config)
    assert ms.get_auto_parallel_context("comm_fusion") == config


# --- Parameter.init_data(layout, set_sliced) ----------------------------------------------------------------------


def test_init_data_refuses_mindspores_own_slicing():
    w = ms.Parameter(ms.Tensor(np.ones((2, 2), np.float32)), name="w")
    assert w.init_data() is w and w.init_data(None, False) is w
    with pytest.raises(NotSupportedYetError, match=r"init_data\(layout=.*tessel slices parameters by its own plan"):
        w.init_data(layout=([2], [0, -1]))
    with pytest.raises(NotSupportedYetError, match=r"init_data\(set_sliced=True\).*by its own plan"):
        w.init_data(set_sliced=True)


# --- load_param_into_net(strict_load) -----------------------------------------------------------------------------


class Inner(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 2)
        self.head = nn.Dense(2, 1)

    def construct(self, x):
        return self.head(self.fc(x))


class Wrapped(nn.Cell):
    def __init__(self):
        super().__init__()
        self.network = Inner()

    def construct(self, x):
        return self.network(x)


def _values(net):
    return {p.name: np.array(p.asnumpy()) for p in net.get_parameters()}


def test_strict_load_false_loads_a_checkpoint_saved_with_a_prefix(tmp_path):
    ms.set_seed(1)
    source = Wrapped()
    saved = _values(source)
    assert sorted(saved) == ["network.fc.bias", "network.fc.weight", "network.head.bias", "network.head.weight"]
    ms.save_checkpoint(source, str(tmp_path / "wrapped.ckpt"))
    ms.set_seed(2)
    target = Inner()
    checkpoint = ms.load_checkpoint(str(tmp_path / "wrapped.ckpt"))
    checkpoint["extra"] = ms.Parameter(ms.Tensor(np.zeros(1, np.float32)), name="extra")
    not_loaded, unused = ms.load_param_into_net(target, checkpoint)
    assert not_loaded == [] and unused == ["extra"]
    for name, value in _values(target).items():
        np.testing.assert_array_equal(value, saved["network." + name])
    x = ms.Tensor(rand(4, 3))
    np.testing.assert_array_equal(target(x).asnumpy(), source(x).asnumpy())


def test_prefix_matching_repeats_for_each_prefix_and_strict_load_matches_exact_names_only():
    ms.set_seed(3)
    target = Inner()
    before = _values(target)
    fc_weight, head_bias = rand(2, 3, seed=4), rand(1, seed=5)
    checkpoint = {
        "fc.bias": ms.Tensor(rand(2, seed=6)),  # exact
        "a.fc.weight": ms.Tensor(fc_weight),  # prefix "a."
        "bb.head.bias": ms.Tensor(head_bias),  # prefix "bb."
    }
    not_loaded, unused = ms.load_param_into_net(Inner(), dict(checkpoint), strict_load=True)
    assert not_loaded == ["fc.weight", "head.weight", "head.bias"]  # returned, not raised (MindSpore's way)
    assert unused == ["a.fc.weight", "bb.head.bias"]
    not_loaded, unused = ms.load_param_into_net(target, checkpoint)
    assert not_loaded == ["head.weight"] and unused == []
    after = _values(target)
    np.testing.assert_array_equal(after["fc.weight"], fc_weight)
    np.testing.assert_array_equal(after["head.bias"], head_bias)
    np.testing.assert_array_equal(after["head.weight"], before["head.weight"])


def test_strict_load_keeps_dtypes_and_the_default_casts():
    net = nn.Dense(3, 2)
    weight = rand(2, 3, dtype=np.float64)
    with pytest.raises(ConfigurationError, match=r"strict_load=True.*'weight' is float64.*pass strict_load=False"):
        ms.load_param_into_net(net, {"weight": ms.Tensor(weight)}, strict_load=True)
    assert ms.load_param_into_net(net, {"weight": ms.Tensor(weight)})[0] == ["bias"]
    np.testing.assert_array_equal(net.weight.asnumpy(), weight.astype(np.float32))
    with pytest.raises(ConfigurationError, match="strict_load must be a bool"):
        ms.load_param_into_net(net, {}, strict_load="yes")
