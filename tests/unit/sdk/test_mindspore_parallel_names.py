"""Every name MindSpore's `mindspore.parallel` exports (its __all__) and every one of them its top-level package
re-exports resolves through `import tessel as ms`, without importing tessel.parallel first, to something that
works or to a function that raises NotSupportedYetError naming what and why; never an AttributeError."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import tessel as ms
from tessel.core.errors import ConfigurationError, NotSupportedYetError

# Copied from MindSpore 2.7.0's sources: mindspore/parallel/__init__.py (__all__) and mindspore/__init__.py (the
# names it imports from mindspore.parallel and mindspore.parallel.function, then `__all__.extend(parallel.__all__)`).
MINDSPORE_VERSION = "2.7.0"
PARALLEL_ALL = [
    "set_algo_parameters", "reset_algo_parameters", "get_algo_parameters", "rank_list_for_transform",
    "transform_checkpoint_by_rank", "transform_checkpoints", "merge_pipeline_strategys", "shard",
    "sync_pipeline_shared_parameters", "Layout", "parameter_broadcast", "load_segmented_checkpoints",
    "unified_safetensors", "load_distributed_checkpoint", "merge_sliced_parameter", "restore_group_info_list",
    "build_searched_strategy", "set_op_strategy_config", "rank_list_for_convert", "convert_checkpoint_by_rank",
    "convert_checkpoints",
]  # fmt: skip
TOP_LEVEL_IMPORTS = [
    "set_algo_parameters", "get_algo_parameters", "reset_algo_parameters", "rank_list_for_transform",
    "transform_checkpoint_by_rank", "transform_checkpoints", "merge_pipeline_strategys", "shard", "Layout",
    "sync_pipeline_shared_parameters", "parameter_broadcast", "load_segmented_checkpoints", "unified_safetensors",
    "load_distributed_checkpoint", "merge_sliced_parameter", "restore_group_info_list", "build_searched_strategy",
    "reshard",
]  # fmt: skip
TOP_LEVEL = sorted(set(PARALLEL_ALL) | set(TOP_LEVEL_IMPORTS))
NOT_SUPPORTED = {
    "unified_safetensors": ("src", "strategy.json", "dst"),
    "restore_group_info_list": ("group_info.pb",),
    "set_op_strategy_config": ("SAVE", "/tmp/ops.json"),
}


def test_every_name_resolves_on_a_fresh_import_without_importing_tessel_parallel_first():
    names, parallel = TOP_LEVEL, PARALLEL_ALL
    code = (
        "import json, sys, tessel as ms\n"
        "assert 'tessel.parallel' not in sys.modules\n"
        f"top = {{n: callable(getattr(ms, n)) for n in {names!r}}}\n"
        f"par = {{n: callable(getattr(ms.parallel, n)) for n in {parallel!r}}}\n"
        "fn = callable(ms.parallel.function.reshard)\n"
        "print(json.dumps([top, par, fn]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    top, par, fn = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(top.values()) and all(par.values()) and fn, (top, par)
    assert set(top) == set(names) and set(par) == set(parallel)


def _strategy_file(path, parameters: dict, graphs: dict | None = None) -> None:
    from tessel.parallel.planning import FORMAT

    path.write_text(json.dumps({"format": FORMAT, "parameters": parameters, "graphs": graphs or {}}))


def test_merge_pipeline_strategys_merges_the_stages_files_and_refuses_what_does_not_fit(tmp_path):
    stage0 = {"w0": {"shape": [4, 6], "device_matrix": [2], "tensor_map": [-1, 0]}}
    stage1 = {"w1": {"shape": [6, 2], "device_matrix": [2], "tensor_map": [0, -1]}}
    src = tmp_path / "strategies"
    src.mkdir()
    _strategy_file(src / "strategy_stage0.json", stage0, {"net": {"ops": [1]}})
    _strategy_file(src / "strategy_stage1.json", stage1, {"net": {"ops": [1]}})
    dst = tmp_path / "merged" / "strategy.json"
    ms.merge_pipeline_strategys(str(src), str(dst))
    merged = json.loads(dst.read_text())
    assert merged["parameters"] == stage0 | stage1 and merged["graphs"] == {"net": {"ops": [1]}}
    assert ms.parallel.merge_pipeline_strategys is ms.merge_pipeline_strategys
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        ms.merge_pipeline_strategys(str(dst), str(tmp_path / "out.json"))
    with pytest.raises(TypeError, match="'src_strategy_dirs' should be str"):
        ms.merge_pipeline_strategys(3, str(dst))
    _strategy_file(src / "strategy_stage2.json", {"w1": {"shape": [6, 2], "device_matrix": [2], "tensor_map": [-1, 0]}})
    with pytest.raises(ConfigurationError, match=r"parameter 'w1' is recorded differently in .*stage1.* and .*stage2"):
        ms.merge_pipeline_strategys(str(src), str(dst))
    (src / "strategy_stage2.json").write_text("not json")
    with pytest.raises(ConfigurationError, match=r"is not a strategy file tessel wrote.*Fix"):
        ms.merge_pipeline_strategys(str(src), str(dst))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigurationError, match="holds no strategy files"):
        ms.merge_pipeline_strategys(str(empty), str(dst))


def test_sync_pipeline_shared_parameters_takes_a_cell_and_without_stages_has_nothing_to_sync():
    net = ms.nn.Dense(3, 2)
    before = net.weight.asnumpy().copy()
    assert ms.sync_pipeline_shared_parameters(net) is None  # one rank, no stages: nothing is shared
    np.testing.assert_array_equal(net.weight.asnumpy(), before)
    with pytest.raises(TypeError, match="'net' should be a Cell"):
        ms.parallel.sync_pipeline_shared_parameters(lambda x: x)


@pytest.mark.parametrize("name", sorted(NOT_SUPPORTED))
def test_names_not_supported_yet_say_so_at_the_call(name):
    with pytest.raises(NotSupportedYetError, match=f"not supported yet: {name}"):
        getattr(ms, name)(*NOT_SUPPORTED[name])


def test_algo_parameters_accept_what_the_search_does_and_refuse_the_rest():
    defaults = {
        "fully_use_devices": False,
        "elementwise_op_strategy_follow": False,
        "enable_algo_approxi": False,
        "algo_approxi_epsilon": 0.1,
        "tensor_slice_align_enable": False,
        "tensor_slice_align_size": 16,
    }
    ms.set_algo_parameters(**defaults)
    assert {k: ms.get_algo_parameters(k) for k in defaults} == defaults
    for key, value in (("fully_use_devices", True), ("enable_algo_approxi", True), ("tensor_slice_align_size", 8)):
        with pytest.raises(NotSupportedYetError, match=f"set_algo_parameters\\({key}="):
            ms.set_algo_parameters(**{key: value})
    with pytest.raises(ValueError, match="Align_size must be in"):
        ms.set_algo_parameters(tensor_slice_align_size=2048)
    with pytest.raises(TypeError, match="must be bool"):
        ms.set_algo_parameters(fully_use_devices=1)
    with pytest.raises(ValueError, match="keyword speed is not recognized"):
        ms.set_algo_parameters(speed=True)
    with pytest.raises(ValueError, match="keyword speed is not recognized"):
        ms.get_algo_parameters("speed")
    ms.reset_algo_parameters()
    assert ms.get_algo_parameters("algo_approxi_epsilon") == 0.1


def test_the_checkpoint_names_work(tmp_path):
    from tessel.parallel.checkpoint import STRATEGY_FORMAT

    assert ms.rank_list_for_convert(0) == ms.rank_list_for_transform(0) == [0]
    assert ms.convert_checkpoint_by_rank is ms.transform_checkpoint_by_rank
    assert ms.convert_checkpoints is ms.transform_checkpoints
    strategy_file = tmp_path / "strategy.json"
    record = {"shape": [4, 6], "device_matrix": [2], "tensor_map": [-1, 0]}  # dim 1 cut in two
    strategy_file.write_text(json.dumps({"format": STRATEGY_FORMAT, "parameters": {"w": record}}))
    strategy = ms.build_searched_strategy(str(strategy_file))
    assert strategy == {"w": record}
    whole = np.arange(24, dtype=np.float32).reshape(4, 6)
    slices = [ms.Parameter(ms.Tensor(whole[:, :3]), "w"), ms.Parameter(ms.Tensor(whole[:, 3:]), "w")]
    np.testing.assert_array_equal(ms.merge_sliced_parameter(slices, strategy).asnumpy(), whole)
    rows = [ms.Parameter(ms.Tensor(whole[:2]), "w"), ms.Parameter(ms.Tensor(whole[2:]), "w")]
    np.testing.assert_array_equal(ms.merge_sliced_parameter(rows).asnumpy(), whole)
    with pytest.raises(KeyError, match="should be a key in the 'strategy'"):
        ms.merge_sliced_parameter([ms.Parameter(ms.Tensor(whole), "v")], strategy)
    with pytest.raises(TypeError, match="should be list"):
        ms.merge_sliced_parameter(tuple(slices))
    folder = tmp_path / "segments"
    folder.mkdir()
    ms.save_checkpoint([{"name": "a", "data": ms.Tensor(whole)}], str(folder / "part0.ckpt"))
    ms.save_checkpoint([{"name": "b", "data": ms.Tensor(whole * 2)}], str(folder / "part1.ckpt"))
    loaded = ms.load_segmented_checkpoints(str(folder))
    assert sorted(loaded) == ["a", "b"]
    np.testing.assert_array_equal(loaded["b"].asnumpy(), whole * 2)
    with pytest.raises(ValueError, match="doesn't exist"):
        ms.load_segmented_checkpoints(str(tmp_path / "missing"))


def test_slices_of_pipeline_stages_merge_from_the_ranks_of_the_stage_that_holds_each(tmp_path):
    """Under pipeline parallel each rank's file holds its stage's parameters only, each layout over the stage's
    ranks (its "ranks"): every parameter is assembled from those ranks' files, whichever stage."""
    from tessel.train.serialization import write_checkpoint

    a, b = np.arange(24, dtype=np.float32).reshape(4, 6), np.arange(5, dtype=np.float32)
    cut = {"shape": [4, 6], "device_matrix": [2], "tensor_map": [-1, 0]}  # dim 1 cut over the stage's 2 ranks
    whole_b = {"shape": [5], "device_matrix": [2], "tensor_map": [-1]}
    files = []
    for rank in range(4):
        stage0 = rank < 2
        record = dict(cut if stage0 else whole_b, ranks=[0, 1] if stage0 else [2, 3])
        tensors = {"a": np.ascontiguousarray(a[:, 3 * rank : 3 * rank + 3])} if stage0 else {"b": b}
        name = "a" if stage0 else "b"
        metadata = {"layouts": json.dumps({name: record}), "rank": str(rank), "world": "4"}
        files.append(str(tmp_path / f"rank_{rank}.ckpt"))
        write_checkpoint({**tensors, "step": np.array([3.0], np.float32)}, files[-1], metadata)
    loaded = ms.load_distributed_checkpoint(None, files[::-1], return_param_dict=True)
    assert sorted(loaded) == ["a", "b", "step"]
    np.testing.assert_array_equal(loaded["a"].asnumpy(), a)
    np.testing.assert_array_equal(loaded["b"].asnumpy(), b)
    # rank 3 holds what rank 2 holds ('b' whole on both): its file is not needed; rank 1's piece of 'a' is
    without_3 = ms.load_distributed_checkpoint(None, files[:3], return_param_dict=True)
    np.testing.assert_array_equal(without_3["b"].asnumpy(), b)
    with pytest.raises(ConfigurationError, match=r"'a' is cut over ranks \[0, 1\].*ranks \[1\]"):
        ms.load_distributed_checkpoint(None, [files[0], *files[2:]], return_param_dict=True)


def test_reshard_and_parameter_broadcast_on_one_device():
    x = ms.Tensor(np.ones((4, 4), np.float32))
    layout = ms.Layout((2, 2), ("dp", "mp"))
    assert ms.reshard(x, layout("dp", "mp")) is x  # one device: nothing to lay out
    assert ms.parameter_broadcast(ms.nn.Dense(2, 2), {"weight": ([1], [-1, -1], [2, 2])}) is None
