"""ms.ckpt_to_safetensors / safetensors_to_ckpt, MindSpore 2.7's converters. A file MindSpore 2.7.0 saved
(sgd_step2.ckpt) goes to safetensors and back with a name_map; MindSpore 2.7.0 loaded both converted files with the
same values (checked when this test was written)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import tessel as ms

DATA = os.path.join(os.path.dirname(__file__), "data")


def test_a_file_converts_both_ways_with_renamed_parameters(tmp_path):
    source = os.path.join(DATA, "sgd_step2.ckpt")
    ms.ckpt_to_safetensors(source, str(tmp_path / "st"), name_map={"weight": "dense.weight"})
    ms.safetensors_to_ckpt(str(tmp_path / "st" / "sgd_step2.safetensors"), str(tmp_path / "back"))
    original = ms.load_checkpoint(source)
    back = ms.load_checkpoint(str(tmp_path / "back" / "sgd_step2.ckpt"))
    assert set(back) == (set(original) - {"weight"}) | {"dense.weight"}
    for name, value in original.items():
        np.testing.assert_array_equal(back["dense.weight" if name == "weight" else name].asnumpy(), value.asnumpy())


def test_a_directory_converts_each_rank_folder_and_checks_its_arguments(tmp_path):
    for rank in ("rank0", "rank1"):
        os.makedirs(tmp_path / "src" / rank)
        shutil.copy(os.path.join(DATA, "sgd_step2.ckpt"), tmp_path / "src" / rank / "keep.ckpt")
        shutil.copy(os.path.join(DATA, "sgd_step4.ckpt"), tmp_path / "src" / rank / "skip.ckpt")
    ms.ckpt_to_safetensors(str(tmp_path / "src"), str(tmp_path / "out"), file_name_regex="keep")
    assert sorted(os.listdir(tmp_path / "out")) == ["rank0", "rank1"]
    assert os.listdir(tmp_path / "out" / "rank1") == ["keep.safetensors"]
    with pytest.raises(ValueError, match="no directories starting with 'rank'"):
        ms.ckpt_to_safetensors(str(tmp_path / "out" / "rank0"))
    with pytest.raises(ValueError, match=r"must be a \.ckpt file"):
        ms.ckpt_to_safetensors(str(tmp_path / "out" / "rank0" / "keep.safetensors"))
    with pytest.raises(ValueError, match="save_path must be a directory"):
        ms.ckpt_to_safetensors(os.path.join(DATA, "sgd_step2.ckpt"), str(tmp_path / "x.safetensors"))
    with pytest.raises(ValueError, match="valid path or file"):
        ms.safetensors_to_ckpt(str(tmp_path / "missing"))
