"""No option is ignored in silence: each set_context / set_auto_parallel_context option tessel accepts is in README's
option table with the status the code gives it, and behaves so — "working" options take other values, "no effect on
CPU" ones are accepted and logged once, "not supported yet" ones accept only their default."""

from __future__ import annotations

import json
import logging
import re

import pytest

import tessel as ms
from tessel import context
from tessel.core import options as support
from tessel.core.errors import ConfigurationError, NotSupportedYetError
from tests.conftest import ROOT

ROW = re.compile(r"^\| `(\w+)` \| (set_context|set_auto_parallel_context) \| `(.*?)` \| ([^|]+?) \| ([^|]*) \|$")
# A value other than the default for every option: accepted when the option works, refused when not supported yet.
OTHER_VALUE = {
    "mode": ms.PYNATIVE_MODE,
    "device_target": "CPU",  # the default; GPU is checked against the daemons below
    "device_id": 1,
    "save_graphs": True,
    "save_graphs_path": "graphs",
    "max_call_depth": 2000,
    "deterministic": "ON",
    "jit_level": "O1",
    "runtime_num_threads": 4,
    "inter_op_parallel_num": 2,
    "jit_config": {"jit_level": "O2"},
    "print_file_path": "print.log",
    "env_config_path": "env.json",
    "precompile_only": True,
    "check_bprop": True,
    "enable_compile_cache": True,
    "compile_cache_path": "cache",
    "enable_graph_kernel": True,
    "graph_kernel_flags": "--opt_level=2",
    "max_device_memory": "2GB",
    "mempool_block_size": "2GB",
    "variable_memory_max_size": "1GB",
    "enable_reduce_precision": False,
    "pynative_synchronize": True,
    "memory_optimize_level": "O1",
    "ascend_config": {"precision_mode": "force_fp16"},
    "gpu_config": {"conv_fprop_algo": "normal"},
    "op_timeout": 600,
    "aoe_tune_mode": "online",
    "aoe_config": {"job_type": "2"},
    "grad_for_scalar": True,
    "exec_order": "dfs",
    "enable_profiling": True,
    "profiling_options": '{"output": "timelines"}',
    "parallel_mode": ms.ParallelMode.DATA_PARALLEL,
    "gradients_mean": True,
    "full_batch": True,
    "dataset_strategy": ((2, 1), (2,)),
    "search_mode": "sharding_propagation",
    "device_num": 4,
    "global_rank": 1,
    "pipeline_stages": 2,
    "pipeline_result_broadcast": True,
    "gradient_fp32_sync": False,
    "loss_repeated_mean": False,
    "parameter_broadcast": True,
    "enable_parallel_optimizer": True,
    "parallel_optimizer_config": {"optimizer_level": "level3", "parallel_optimizer_threshold": 0},
    "strategy_ckpt_load_file": "strategy.ckpt",
    "strategy_ckpt_save_file": "strategy.ckpt",
    "strategy_ckpt_config": {"load_file": "", "save_file": "strategy.json", "only_trainable_params": False},
    "all_reduce_fusion_config": [20, 35],
    "grad_accumulation_step": 4,
    "comm_fusion": {"allreduce": {"mode": "size", "config": 32}},
    "batch_split": "speed",
    "pipeline_config": {"pipeline_scheduler": "1f1b"},
    "auto_pipeline": True,
    "force_fp32_communication": True,
    "enable_alltoall": False,
    "group_ckpt_save_file": "groups.ckpt",
    "dump_local_norm": True,
    "dump_local_norm_path": "norms",
    "dump_device_local_norm": True,
}


@pytest.fixture(autouse=True)
def own_context(monkeypatch, tmp_path):
    """Each test changes a copy of the context: what it sets, logs or binds does not reach other tests (and what it
    writes, such as a timeline, lands in its own folder)."""
    from tessel import profiler

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(context, "_context", dict(context._context))
    monkeypatch.setattr(context, "_explicit_context", set())
    monkeypatch.setattr(support, "_logged", set())
    monkeypatch.setattr(context, "_bound_daemon", None)
    monkeypatch.setenv("TESSEL_PLUGIN", "cpu")  # set_context(device_target=...) must not pick another plugin here
    yield
    profiler.stop()
    ms.reset_auto_parallel_context()


def readme_table() -> dict[str, tuple[str, str, str]]:
    rows = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        found = ROW.match(line)
        if found:
            name, of, default, status, _ = found.groups()
            rows[name] = (of, default, status)
    return rows


def all_options() -> dict[str, tuple[str, object]]:
    """option -> (the function that sets it, its default)."""
    options = {name: ("set_context", default) for name, default in context._IGNORED.items()}
    options.update({name: ("set_context", default) for name, default in context._CONTEXT_DEFAULTS.items()})
    options.update({name: ("set_auto_parallel_context", d) for name, d in context._PARALLEL_DEFAULTS.items()})
    return options


def setter(of: str):
    return ms.set_context if of == "set_context" else ms.set_auto_parallel_context


def test_the_readme_lists_every_option_with_its_status():
    table, options = readme_table(), all_options()
    assert sorted(table) == sorted(options), "README's option table and the code list different options"
    for name, (of, default) in options.items():
        status = context.option_status(name).split(":")[0]
        assert table[name] == (of, repr(default), status), f"README's row of {name!r} is out of date"


@pytest.mark.parametrize("name", sorted(all_options()))
def test_each_option_behaves_as_its_status_says(name, caplog):
    of, default = all_options()[name]
    status = context.option_status(name)
    value = OTHER_VALUE[name]
    with caplog.at_level(logging.WARNING, logger="tessel"):
        setter(of)(**{name: default})  # the default is always accepted
        if status == "no effect on CPU":
            setter(of)(**{name: value})
    if status == "working":
        setter(of)(**{name: value})
        getter = ms.get_context if of == "set_context" else ms.get_auto_parallel_context
        assert getter(name) == value
    elif status == "no effect on CPU":  # said once, whatever the value
        said = [r.getMessage() for r in caplog.records if name in r.getMessage()]
        assert said == [f"set_context({name}={default!r}): no effect on CPU; tessel does not use it"]
        assert ms.get_context(name) == value
    else:
        assert status.startswith("not supported yet: ")
        with pytest.raises(NotSupportedYetError, match=re.escape(f"not supported yet: {name}={value!r}, ")):
            setter(of)(**{name: value})


def test_the_unsupported_parts_of_comm_fusion_are_refused():
    for fusion, error, message in [
        ({"allgather": {"mode": "size", "config": 32}}, NotSupportedYetError, "not supported yet: comm_fusion 'allg"),
        ({"allreduce": {"mode": "index", "config": [20]}}, NotSupportedYetError, "not supported yet: comm_fusion 'all"),
        ({"openstate": False}, NotSupportedYetError, "not supported yet: comm_fusion openstate=False"),
        ({"allreduce_x": {}}, ConfigurationError, "comm_fusion must be a dict with keys among"),
    ]:
        with pytest.raises(error, match=re.escape(message)):
            ms.set_auto_parallel_context(comm_fusion=fusion)
    ms.set_auto_parallel_context(comm_fusion={"openstate": True, "allreduce": {"mode": "auto"}})


def test_batch_split_takes_even_speed_or_one_weight_per_rank():
    ms.set_auto_parallel_context(batch_split=[1, 2.5])
    assert ms.get_auto_parallel_context("batch_split") == (1.0, 2.5)
    for bad in ("fast", (1, 0), (), (1, True), (1, float("nan"))):
        with pytest.raises(ConfigurationError, match="batch_split must be 'even', 'speed' or one positive weight"):
            ms.set_auto_parallel_context(batch_split=bad)


def test_a_device_target_no_daemon_provides_is_an_error_naming_their_plugins():
    ms.set_context(device_target="GPU")
    with pytest.raises(ConfigurationError, match=r"no daemon of this job provides it; .* plugin\(s\) \['cpu'\]"):
        context._bind_daemon(["cpu", "cpu"], "cpu", 0, 2)
    ms.set_context(device_target="CPU")
    context._bind_daemon(["cpu", "gpu"], "gpu", 1, 2)  # a mixed job: some daemon provides it


def test_unset_device_options_report_the_daemons_and_set_ones_must_match_the_job():
    context._bind_daemon(["gpu", "gpu"], "gpu", 1, 2)
    assert ms.get_context("device_target") == "GPU" and ms.get_context("device_id") == 1
    with pytest.raises(ConfigurationError, match=r"device_id=3\): this rank's daemon runs device 1"):
        ms.set_context(device_id=3)
    assert ms.get_context("device_id") == 1  # the refused value is not kept
    with pytest.raises(ConfigurationError, match=r"device_num=4\): the job has 2 ranks"):
        ms.set_auto_parallel_context(device_num=4)
    assert ms.get_auto_parallel_context("device_num") == 1  # the refused value is not kept
    context._bind_daemon(["cpu"], "cpu", 0, 1)
    ms.set_auto_parallel_context(device_num=4)  # a world of 1 may plan for 4 devices (tessel.parallel.explain)
    with pytest.raises(ConfigurationError, match=r"device_num=4\): the job has 2 ranks"):
        context._bind_daemon(["cpu", "cpu"], "cpu", 0, 2)


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("grad_for_scalar", 0, "grad_for_scalar must be True or False, got 0"),
        ("check_bprop", "yes", "check_bprop must be True or False"),
        ("exec_order", "xyz", "exec_order must be 'bfs', 'dfs' or 'gpto', got 'xyz'"),
        ("aoe_tune_mode", "onlin", "aoe_tune_mode must be 'online' or 'offline', got 'onlin'"),
        ("aoe_config", {"job_type": "3"}, r"job_type must be '1' \(subgraph tuning\) or '2' \(operator tuning\)"),
        ("aoe_config", {"job": "2"}, r"aoe_config must be a dict like \{'job_type': '2'\}"),
        ("aoe_config", "2", r"aoe_config must be a dict like"),
    ],
)
def test_a_value_mindspore_would_refuse_is_an_error_not_the_default(option, value, says):
    with pytest.raises(ConfigurationError, match=says):
        ms.set_context(**{option: value})


def test_the_last_device_target_picks_the_plugin_unless_a_launcher_chose(monkeypatch):
    import os

    monkeypatch.delenv("TESSEL_PLUGIN")
    monkeypatch.setattr(context, "_plugin_chosen", None)
    ms.set_context(device_target="GPU")
    ms.set_context(device_target="CPU")  # the first value used to stick for good
    assert os.environ["TESSEL_PLUGIN"] == "cpu"
    monkeypatch.setenv("TESSEL_PLUGIN", "gpu")  # a launcher's choice
    ms.set_context(device_target="CPU")
    assert os.environ["TESSEL_PLUGIN"] == "gpu"


def test_profiling_options_alone_start_and_stop_nothing(tmp_path):
    from tessel import profiler

    recorder = profiler.start(str(tmp_path / "timeline"))
    ms.set_context(profiling_options=json.dumps({"output": str(tmp_path / "other")}))
    assert profiler.active() is recorder  # MindSpore only checks and stores them
    for bad in ("[]", "null", '"abc"'):
        with pytest.raises(ConfigurationError, match="profiling_options must be a JSON object"):
            ms.set_context(profiling_options=bad)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("memory_optimize_level", "O9"),
        ("op_timeout", -3),
        ("enable_graph_kernel", "yes"),
        ("pynative_synchronize", "yes"),
        ("max_device_memory", 5),
        ("ascend_config", "x"),
        ("save_graphs", 7),
        ("device_id", 4096),
        ("mode", True),
        ("save_graphs_path", ""),
    ],
)
def test_values_mindspore_refuses_are_refused_even_where_the_option_has_no_effect(option, value):
    with pytest.raises(ConfigurationError, match=f"set_context: {option} must be"):
        ms.set_context(**{option: value})
    with pytest.raises(ConfigurationError, match="all_reduce_fusion_config must be a list"):
        ms.set_auto_parallel_context(all_reduce_fusion_config=5)


def test_strategy_file_names_are_one_setting_as_in_mindspore():
    ms.set_auto_parallel_context(strategy_ckpt_config={"save_file": "a.json"})
    assert ms.get_auto_parallel_context("strategy_ckpt_config") == {
        "load_file": "",
        "save_file": "a.json",
        "only_trainable_params": True,
    }
    assert ms.get_auto_parallel_context("strategy_ckpt_save_file") == "a.json"
    ms.set_auto_parallel_context(strategy_ckpt_save_file="b.json")  # the last one set wins
    assert ms.get_auto_parallel_context("strategy_ckpt_config")["save_file"] == "b.json"
    assert ms.get_auto_parallel_context("auto_parallel_search_mode") == ms.get_auto_parallel_context("search_mode")
    with pytest.raises(ConfigurationError, match="load_file must be a str path, got 5"):
        ms.set_auto_parallel_context(strategy_ckpt_config={"load_file": 5})
    with pytest.raises(ConfigurationError, match="only_trainable_params must be a bool"):
        ms.set_auto_parallel_context(strategy_ckpt_config={"only_trainable_params": "no"})


def test_uneven_batch_split_turns_spmd_scheduling_off():
    # a graph traced with a rank's own batch size has other static shapes on other ranks: the schedule's cost
    # estimates could then start an SPMD block's collectives in another order on another rank
    from tessel.common import engine

    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL)
    assert engine._spmd()
    ms.set_auto_parallel_context(batch_split="speed")
    assert not engine._spmd()


def test_set_device_is_set_context_of_target_and_id():
    """MindSpore 2.5+'s ms.set_device(device_target, device_id=None)."""
    ms.set_device("CPU")
    assert ms.get_context("device_target") == "CPU"
    context._bind_daemon(["cpu", "gpu"], "gpu", 1, 2)  # a mixed job: this rank's daemon runs GPU 1
    ms.set_device("GPU", 1)
    assert ms.get_context("device_id") == 1
    with pytest.raises(ConfigurationError, match=r"device_id=0\): this rank's daemon runs device 1"):
        ms.set_device("GPU", 0)
    with pytest.raises(ConfigurationError, match=r"set_device: device_target must be one of \[.Ascend."):
        ms.set_device("NPU")
    with pytest.raises(ConfigurationError, match="set_device: device_id must be an int >= 0, got -1"):
        ms.set_device("GPU", -1)


def test_run_check_multiplies_and_reports_as_mindspore_and_set_deterministic_is_the_context_option(capsys):
    ms.run_check()
    out = capsys.readouterr().out.splitlines()
    # MindSpore 2.7.0: "MindSpore version:  2.7.0", then the same sentence with its name
    assert out[0].startswith("tessel version:  ") and out[0].endswith("(MindSpore 2.7.0 API)")
    assert out[1] == (
        "The result of multiplication calculation is correct, tessel has been installed on platform [CPU] successfully!"
    )
    ms.set_deterministic(False)
    with pytest.raises(NotSupportedYetError, match="deterministic='ON'"):
        ms.set_deterministic(True)
    with pytest.raises(TypeError, match="must be a bool"):
        ms.set_deterministic("ON")
