"""MindSpore arguments that tessel's APIs once swallowed through **kwargs or accepted unread: each now works, is
logged once as having no effect (the same results either way), or raises at the call. A misspelt option is a
TypeError, never silently dropped."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import tessel as ms
import tessel.dataset as ds
from tessel import nn, train
from tessel.core.errors import ConfigurationError, NotSupportedYetError
from tessel.core.options import keyword_options
from tessel.train.serialization import write_checkpoint


@pytest.fixture(autouse=True)
def fresh_log_once(monkeypatch):
    from tessel.core import options

    monkeypatch.setattr(options, "_logged", set())


def test_keyword_options_passes_off_values_logs_hints_once_and_refuses_the_rest(caplog):
    unsupported = {"offload": ((None, False), "no offload here")}
    hints = {"python_multiprocessing": "rows are the same"}
    keyword_options("Api", {"offload": False}, hints, unsupported)
    keyword_options("Api", {"offload": None}, hints, unsupported)
    with pytest.raises(NotSupportedYetError, match=r"not supported yet: Api\(offload=True\), no offload here"):
        keyword_options("Api", {"offload": True}, hints, unsupported)
    with pytest.raises(NotSupportedYetError, match=r"offload=0"):  # 0 is not False: MindSpore's type is bool
        keyword_options("Api", {"offload": 0}, hints, unsupported)
    with caplog.at_level(logging.INFO, logger="tessel"):
        keyword_options("Api", {"python_multiprocessing": True}, hints, unsupported)
        keyword_options("Api", {"python_multiprocessing": False}, hints, unsupported)
    assert [r.getMessage() for r in caplog.records] == [
        "Api: python_multiprocessing=True has no effect in tessel; rows are the same"
    ]
    with pytest.raises(TypeError, match=r"Api\(\) got an unexpected keyword argument 'ofload'; its keyword options "):
        keyword_options("Api", {"ofload": True}, hints, unsupported)


def _rows():
    return ds.NumpySlicesDataset({"a": np.arange(8, dtype=np.int32)}, shuffle=False)


def test_dataset_map_and_batch_worker_options_change_nothing_and_the_rest_is_refused():
    hinted = _rows().map(lambda a: a * 2, num_parallel_workers=4, python_multiprocessing=True, max_rowsize=8)
    hinted = hinted.batch(4, num_parallel_workers=2, python_multiprocessing=False)
    assert [r[0].tolist() for r in hinted.create_tuple_iterator(output_numpy=True)] == [[0, 2, 4, 6], [8, 10, 12, 14]]
    _rows().map(lambda a: a, offload=False, cache=None, callbacks=None)
    for options, message in (
        ({"cache": object()}, "Dataset.map(cache="),
        ({"offload": True}, "Dataset.map(offload=True)"),
        ({"callbacks": [object()]}, "Dataset.map(callbacks="),
        ({"column_order": ["a"]}, "Dataset.project()"),
    ):
        with pytest.raises(NotSupportedYetError, match=message.replace("(", r"\(").replace(")", r"\)")):
            _rows().map(lambda a: a, **options)
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_workers'"):
        _rows().map(lambda a: a, num_workers=2)
    for options in ({"per_batch_map": lambda *c: c}, {"input_columns": ["a"]}, {"pad_info": {"a": ([4], 0)}}):
        with pytest.raises(NotSupportedYetError, match=r"Dataset\.batch\("):
            _rows().batch(2, **options)
    for workers in (0, -1, 1.5, True):
        with pytest.raises(ConfigurationError, match="num_parallel_workers must be an int >= 1 or None"):
            _rows().batch(2, num_parallel_workers=workers)
    with pytest.raises(ConfigurationError, match="NumpySlicesDataset: num_parallel_workers"):
        ds.NumpySlicesDataset({"a": np.arange(4)}, num_parallel_workers=0)


def test_a_dataset_cache_is_refused_by_the_sources(tmp_path):
    with pytest.raises(NotSupportedYetError, match=r"MnistDataset\(cache="):
        ds.MnistDataset(str(tmp_path), cache=object())


def test_jit_checks_mindspores_options_and_compiles_the_same_function():
    def double(x):
        return x * 2

    x = ms.Tensor(np.arange(3, dtype=np.float32))
    for options in ({}, {"capture_mode": "trace", "jit_level": "O1", "dynamic": 1, "fullgraph": True},
                    {"backend": "ms_backend", "infer_boost": "on"}):  # fmt: skip
        np.testing.assert_array_equal(ms.jit(double, **options)(x).asnumpy(), [0, 2, 4])
    for options, message in (
        ({"capture_mode": "graph"}, "capture_mode must be one of 'ast', 'bytecode', 'trace'"),
        ({"jit_level": "O2"}, "jit_level must be one of 'O0', 'O1'"),
        ({"dynamic": True}, "dynamic must be one of 0, 1"),
        ({"fullgraph": 1}, "fullgraph must be one of False, True"),
        ({"backend": "tvm"}, "backend must be one of"),
    ):
        with pytest.raises(ConfigurationError, match=message):
            ms.jit(double, **options)


def test_tensor_takes_mindspores_other_arguments_and_refuses_a_device_placement():
    np.testing.assert_array_equal(ms.Tensor([1, 2], const_arg=True, device="CPU", internal=False).asnumpy(), [1, 2])
    with pytest.raises(NotSupportedYetError, match=r"Tensor\(device='Ascend'\)"):
        ms.Tensor([1], device="Ascend")
    with pytest.raises(TypeError, match="unexpected keyword argument 'dtpye'"):
        ms.Tensor([1], dtpye=ms.float32)


def test_pooling_cells_take_a_one_element_tuple_as_its_element():
    """MindSpore 2.7.0 on arange(16).reshape(1, 1, 4, 4): MaxPool2d((2,), 2) and MaxPool2d(2, (2,)) give
    [5, 7, 13, 15], MaxPool2d((2,), (1,)) [5, 6, 7, 9, 10, 11, 13, 14, 15], AvgPool2d((2,), 2) and AvgPool2d(2, (2,))
    [2.5, 4.5, 10.5, 12.5]; a three-element kernel_size is an error."""
    x = ms.Tensor(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    cases = [
        (nn.MaxPool2d((2,), 2), [5, 7, 13, 15]),
        (nn.MaxPool2d(2, (2,)), [5, 7, 13, 15]),
        (nn.MaxPool2d((2,), (1,)), [5, 6, 7, 9, 10, 11, 13, 14, 15]),
        (nn.AvgPool2d((2,), 2), [2.5, 4.5, 10.5, 12.5]),
        (nn.AvgPool2d(2, (2,)), [2.5, 4.5, 10.5, 12.5]),
    ]
    for cell, want in cases:
        np.testing.assert_allclose(cell(x).asnumpy().ravel(), want)
    with pytest.raises(ConfigurationError, match=r"kernel_size must be a positive int or a pair of them"):
        nn.MaxPool2d((2, 2, 2), 2)


def test_pooling_cells_refuse_the_options_they_lack():
    nn.MaxPool2d(2, 2, dilation=1, return_indices=False, ceil_mode=False)
    x = ms.Tensor(np.arange(1, 17, dtype=np.float32).reshape(1, 1, 4, 4))
    corner = {}
    for include in (True, False):
        pooled = nn.AvgPool2d(2, 2, pad_mode="pad", padding=1, count_include_pad=include)(x).asnumpy()
        corner[include] = pooled[0, 0, 0, 0]  # the corner window holds one real element, 1.0, and 3 of padding
    assert corner == {True: pytest.approx(0.25), False: pytest.approx(1.0)}
    for include in (True, False):  # pad_mode='same': MindSpore's AvgPool never counts its padding
        pooled = nn.AvgPool2d(3, 1, pad_mode="same", count_include_pad=include)(x).asnumpy()
        assert pooled[0, 0, 0, 0] == pytest.approx((1 + 2 + 5 + 6) / 4), include
    for cell, options in (
        (nn.MaxPool2d, {"ceil_mode": True}),
        (nn.MaxPool2d, {"return_indices": True}),
        (nn.MaxPool2d, {"dilation": 2}),
        (nn.AvgPool2d, {"divisor_override": 3}),
    ):
        with pytest.raises(NotSupportedYetError, match=f"{cell.__name__}\\({next(iter(options))}="):
            cell(2, 2, **options)
    with pytest.raises(NotSupportedYetError, match=r"nn.AvgPool2d\(data_format='NHWC'\).*only data_format='NCHW'"):
        nn.AvgPool2d(2, 2, data_format="NHWC")
    with pytest.raises(NotSupportedYetError, match=r"nn.Conv2d\(data_format='NHWC'\)"):
        nn.Conv2d(1, 1, 3, data_format="NHWC")
    with pytest.raises(ConfigurationError, match=r"nn\.MaxPool2d: data_format must be 'NCHW' or 'NHWC', got 'CHW'"):
        nn.MaxPool2d(2, 2, data_format="CHW")


@pytest.mark.parametrize("mode", ["PYNATIVE_MODE", "GRAPH_MODE"])
def test_pooling_cells_take_mindsporess_positional_order_and_an_unbatched_input(mode):
    """MaxPool2d(kernel, stride, pad_mode, padding, dilation, return_indices, ceil_mode, data_format) and
    AvgPool2d(kernel, stride, pad_mode, padding, ceil_mode, count_include_pad, divisor_override, data_format), as
    MindSpore 2.7.0; a (C, H, W) input pools as a batch of one (outputs checked equal to MindSpore's)."""
    ms.set_context(mode=getattr(ms, mode))
    x = (np.arange(2 * 7 * 7, dtype=np.float32).reshape(1, 2, 7, 7) % 11) - 3
    batched = nn.MaxPool2d(3, 2, "pad", 1, 1)(ms.Tensor(x)).asnumpy()
    assert batched.shape == (1, 2, 4, 4)
    np.testing.assert_array_equal(nn.MaxPool2d(3, 2, "pad", 1, 1)(ms.Tensor(x[0])).asnumpy(), batched[0])
    excluded = nn.AvgPool2d(3, 2, "pad", 1, False, False)(ms.Tensor(x[0])).asnumpy()
    included = nn.AvgPool2d(3, 2, "pad", 1, False, True)(ms.Tensor(x)).asnumpy()[0]
    padded = np.pad(x[0], ((0, 0), (1, 1), (1, 1)))
    counts = np.pad(np.ones((7, 7)), 1)
    window = np.s_[:, 0:3, 2:5]  # output (0, 1): rows -1..1, columns 1..3 of the input
    np.testing.assert_allclose(included[:, 0, 1], padded[window].sum((1, 2)) / 9, rtol=1e-6)
    np.testing.assert_allclose(excluded[:, 0, 1], padded[window].sum((1, 2)) / counts[0:3, 2:5].sum(), rtol=1e-6)


def test_save_checkpoint_takes_trainable_params_choice_func_and_format(tmp_path):
    ms.set_seed(1)
    net = nn.SequentialCell(nn.Dense(3, 2), nn.ReLU(), nn.Dense(2, 1))
    ms.save_checkpoint(net.trainable_params(), str(tmp_path / "all"), crc_check=True)
    assert sorted(ms.load_checkpoint(str(tmp_path / "all.ckpt"), crc_check=True)) == sorted(
        p.name for p in net.trainable_params()
    )
    ms.save_checkpoint(net, str(tmp_path / "weights"), choice_func=lambda name: name.endswith("weight"),
                       format="safetensors")  # fmt: skip
    loaded = ms.load_checkpoint(str(tmp_path / "weights.safetensors"), format="safetensors")
    assert sorted(loaded) == sorted(p.name for p in net.trainable_params() if p.name.endswith("weight"))
    with pytest.raises(NotSupportedYetError, match=r"save_checkpoint\(enc_key=...\), tessel does not encrypt"):
        ms.save_checkpoint(net, str(tmp_path / "x"), enc_key=b"0" * 16)
    with pytest.raises(ConfigurationError, match="enc_mode/dec_mode must be one of"):
        ms.save_checkpoint(net, str(tmp_path / "x"), enc_mode="ROT13")
    with pytest.raises(ConfigurationError, match="format must be one of"):
        ms.save_checkpoint(net, str(tmp_path / "x"), format="mindir")
    with pytest.raises(NotSupportedYetError, match=r"save_checkpoint options \['incremental'\]"):
        ms.save_checkpoint(net, str(tmp_path / "x"), incremental=True)
    assert not list(tmp_path.glob("x*"))  # nothing written by a refused call
    path = str(tmp_path / "all.ckpt")
    for options, message in (
        ({"dec_key": b"0" * 16}, r"load_checkpoint\(dec_key=...\)"),
        ({"strict": True}, r"load_checkpoint options \['strict'\]"),
    ):
        with pytest.raises(NotSupportedYetError, match=message):
            ms.load_checkpoint(path, **options)
    # one device holds no value twice: remove_redundancy saves and loads everything
    ms.save_checkpoint(net, str(tmp_path / "single"), remove_redundancy=True)
    single = ms.load_checkpoint(str(tmp_path / "single.ckpt"), net, remove_redundancy=True)
    assert sorted(single) == sorted(p.name for p in net.trainable_params())
    assert ms.load_param_into_net(net, single, remove_redundancy=True) == ([], [])
    # a rank's share of a 4-rank job that holds no value (more ranks than values): still a share, not a checkpoint
    empty = str(tmp_path / "empty.ckpt")
    write_checkpoint({}, empty, {"remove_redundancy": "true", "rank": "2", "world": "4", "layouts": "{}"})
    assert isinstance(ms.load_checkpoint(empty), dict) and ms.load_checkpoint(empty).saved_by == (2, 4)
    with pytest.raises(ConfigurationError, match="holds rank 2's share of a 4-rank job"):
        ms.load_param_into_net(net, ms.load_checkpoint(empty))
    with pytest.raises(ConfigurationError, match="remove_redundancy must be a bool"):
        ms.save_checkpoint(net, str(tmp_path / "x"), remove_redundancy="yes")
    with pytest.raises(ConfigurationError, match="remove_redundancy must be a bool"):
        ms.load_checkpoint(path, remove_redundancy=1)


def test_checkpoint_config_append_info_is_written_into_every_file(tmp_path):
    ms.set_seed(3)
    net = nn.Dense(6, 3)
    model = ms.Model(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.1))
    data = ds.NumpySlicesDataset({"x": np.ones((8, 6), np.float32), "y": np.zeros(8, np.int32)}, shuffle=False).batch(4)
    config = train.CheckpointConfig(save_checkpoint_steps=2, append_info=["epoch_num", "step_num", {"lr": 0.1}])
    model.train(2, data, callbacks=[train.ModelCheckpoint("net", str(tmp_path), config)])
    saved = ms.load_checkpoint(str(tmp_path / "net-2_2.ckpt"))
    assert int(saved["epoch_num"].asnumpy()) == 2 and int(saved["step_num"].asnumpy()) == 4
    assert float(saved["lr"].asnumpy()) == pytest.approx(0.1)
    for options, error, message in (
        ({"append_info": {"lr": 0.1}}, ConfigurationError, "append_info must be a list"),
        ({"append_info": ["epoch"]}, ConfigurationError, "append_info entry 'epoch'"),
        ({"keep_checkpoint_per_n_minutes": 5}, NotSupportedYetError, "keep_checkpoint_per_n_minutes=5"),
        ({"exception_save": True}, NotSupportedYetError, "exception_save=True"),
        ({"enc_key": b"0" * 16}, NotSupportedYetError, "enc_key"),
        ({"remove_redundancy": "yes"}, ConfigurationError, "remove_redundancy must be a bool"),
        (
            {"remove_redundancy": True, "save_checkpoint_steps": 0, "save_checkpoint_seconds": 5},
            ConfigurationError,
            "use save_checkpoint_steps",
        ),
        ({"save_dir": "x"}, NotSupportedYetError, r"CheckpointConfig options \['save_dir'\]"),
    ):
        with pytest.raises(error, match=message):
            train.CheckpointConfig(**options)
    safetensors = train.CheckpointConfig(format="safetensors", crc_check=True)
    model.train(1, data, callbacks=[train.ModelCheckpoint("st", str(tmp_path), safetensors)])
    assert (tmp_path / "st-1_2.safetensors").is_file()


def test_profiler_analyse_writes_pretty_json_and_refuses_offline_analysis(tmp_path):
    for options, message in (
        ({"offline_path": str(tmp_path)}, r"Profiler.analyse\(offline_path="),
        ({"step_list": [1]}, r"Profiler.analyse\(step_list=\[1\]\)"),
    ):
        profiler = ms.Profiler(output_path=str(tmp_path / "refused"))
        with pytest.raises(NotSupportedYetError, match=message):
            profiler.analyse(**options)
        profiler.stop()
    profiler = ms.Profiler(output_path=str(tmp_path / "run"))
    ms.Tensor(np.ones(2, np.float32)) + 1
    with pytest.raises(ConfigurationError, match="mode must be 'sync' or 'async'"):
        profiler.analyse(mode="later")
    profiler.analyse(pretty=True, mode="async")
    written = next((tmp_path / "run").glob("timeline_rank*.json")).read_text()
    assert written.startswith("{\n") and "traceEvents" in json.loads(written)


def test_load_distributed_checkpoint_checks_its_file_options_and_embedding_its_ids_dtype():
    from tessel.parallel import load_distributed_checkpoint

    net = nn.Dense(2, 2)
    for options, error, message in (
        ({"dec_key": b"0" * 16}, NotSupportedYetError, r"load_distributed_checkpoint\(dec_key=...\)"),
        ({"format": "mindir"}, ConfigurationError, "format must be one of"),
        ({"output_format": "npz"}, ConfigurationError, "output_format must be 'ckpt' or 'safetensors'"),
        ({"unified_safetensors_dir": "x"}, NotSupportedYetError, "unified_safetensors_dir"),
    ):
        with pytest.raises(error, match=message):
            load_distributed_checkpoint(net, ["a.ckpt"], **options)
    nn.Embedding(4, 2, dtype=ms.float32)  # MindSpore's default: the one-hot path's on/off values
    nn.Embedding(4, 2, dtype=ms.int64)
    with pytest.raises(ConfigurationError, match="dtype must be a number type"):
        nn.Embedding(4, 2, dtype=ms.bool_)
