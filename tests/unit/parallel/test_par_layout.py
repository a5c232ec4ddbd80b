"""Layouts and device meshes: MindSpore's device matrix + tensor map numbering, the Shard/Replicate/Partial view,
frozen hashable values with a one-line repr, pieces of a tensor per rank and their reassembly."""

from __future__ import annotations

import numpy as np
import pytest

from tessel.compiler.parallel import DeviceMesh, Layout, Partial, Replicate, Shard, assemble, piece, scatter
from tessel.core.errors import ConfigurationError


def test_tensor_map_counts_device_matrix_axes_from_the_right_as_mindspore_does():
    layout = Layout((2, 4), (1, -1))  # dim 0 over the axis of size 2 (index 1 from the right)
    assert layout.placements == (Shard(0), Replicate())
    assert layout.splits == (2, 1) and layout.replicas == 4
    assert Layout((2, 4), (0, 1)).placements == (Shard(1), Shard(0))
    assert Layout((2, 4), ((1, 0), -1)).splits == (8, 1)  # one dim over both axes, the size-2 axis major
    partial = Layout((2, 4), (-1, 0), partial=(1,))
    assert partial.placements == (Partial("sum"), Shard(1)) and partial.replicas == 1


def test_layouts_are_frozen_hashable_values_with_a_one_line_repr():
    a, b = Layout((2, 4), (1, -1)), Layout([2, 4], [1, -1])
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    with pytest.raises(AttributeError):
        a.tensor_map = (0, 0)
    assert repr(a) == "Layout((2, 4), (1, -1))"
    assert repr(Layout((2, 4), (-1, 0), partial=(1,), partial_op="max")) == "Layout((2, 4), (-1, 0), partial=1:max)"
    assert a.describe() == "[S(0), R] on 2x4"
    assert "\n" not in repr(Layout((2, 2, 2), ((2, 1), 0)))


@pytest.mark.parametrize(
    ("matrix", "tensor_map", "partial"),
    [((2, 4), (2, -1), ()), ((2, 4), (1, 1), ()), ((2, 4), (1, -1), (1,)), ((0, 4), (-1,), ())],
)
def test_invalid_layouts_are_rejected(matrix, tensor_map, partial):
    with pytest.raises(ValueError, match="invalid layout"):
        Layout(matrix, tensor_map, partial)


def test_strategy_layouts_put_copies_on_the_leading_axis():
    assert Layout.from_strategy((2, 1), 8) == Layout((4, 2), (0, -1))
    assert Layout.from_strategy((2, 4), 8) == Layout((2, 4), (1, 0))
    with pytest.raises(ConfigurationError, match="does not divide device_num 8"):
        Layout.from_strategy((3, 1), 8)


def test_the_same_data_written_on_different_device_matrices_is_the_same_layout():
    assert Layout((8,), (0,)).same_as(Layout((2, 4), ((1, 0),)))
    assert Layout((8,), (0,)).same_as(Layout((2, 2, 2), ((2, 1, 0),)))
    assert not Layout((8,), (0,)).same_as(Layout((2, 4), ((0, 1),)))  # minor axis first: another order
    assert Layout((4, 1, 2), (-1, 0)).refined == Layout((2, 2, 2), (-1, 0))


def test_mesh_groups_are_row_major_and_agree_between_members():
    mesh = DeviceMesh((2, 4))
    assert mesh.coords(6) == (1, 2) and mesh.rank((1, 2)) == 6
    assert mesh.group(6, (0,)) == (2, 6)
    assert mesh.group(6, (1,)) == (4, 5, 6, 7)
    assert mesh.group(6, (1, 0)) == (0, 4, 1, 5, 2, 6, 3, 7)  # axis 1 major when listed first
    for r in range(8):
        assert all(mesh.group(m, (1,)) == mesh.group(r, (1,)) for m in mesh.group(r, (1,)))


def test_pieces_tile_the_tensor_and_reassemble():
    full = np.arange(8 * 6).reshape(8, 6).astype(np.float64)
    layout = Layout((2, 4), ((0,), 1))  # dim 0 over the axis of 4, dim 1 over the axis of 2
    assert piece(full, layout, 0).shape == (2, 3)
    np.testing.assert_array_equal(piece(full, layout, 5), full[2:4, 3:6])  # rank 5 = (1, 1): row block 1, col 1
    np.testing.assert_array_equal(assemble([piece(full, layout, r) for r in range(8)], layout, full.shape), full)
    with pytest.raises(ConfigurationError, match="dim 0 of size 8 cannot be split into 3"):
        Layout((3,), (0,)).local_shape((8,))


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_partial_pieces_combine_to_the_tensor(op):
    full = np.random.default_rng(0).standard_normal((4, 4))
    layout = Layout((2, 2), (0, -1), partial=(1,), partial_op=op)
    pieces = scatter(full, layout, np.random.default_rng(1))
    assert not np.allclose(pieces[0], pieces[2][:, :])  # members of a partial group hold different parts
    np.testing.assert_allclose(assemble(pieces, layout, full.shape), full, rtol=1e-12, atol=1e-12)
