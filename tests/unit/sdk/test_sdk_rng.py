"""MindSpore 2.7's RNG API (manual_seed, seed, initial_seed, get_rng_state, set_rng_state, Generator,
default_generator) on tessel's seed machinery: the contracts, not MindSpore's numbers."""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
from tessel import nn
from tessel.core.errors import NotSupportedYetError


def draws():
    """Host-side random draws of each kind the default generator holds: an unseeded Dropout mask (the next stream),
    a seeded one (its op stream) and a parameter initializer."""
    ones = ms.Tensor(np.ones(64, np.float32))
    net = nn.Dense(4, 3)
    return [ms.ops.dropout(ones, 0.5).asnumpy(), ms.ops.dropout(ones, 0.5, seed=3).asnumpy(), net.weight.asnumpy()]


def same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b))


def test_manual_seed_repeats_the_draws_and_returns_the_default_generator():
    # MindSpore 2.7.0 gives: manual_seed returns default_generator; initial_seed() then 13
    assert ms.manual_seed(13) is ms.default_generator
    assert ms.initial_seed() == 13
    first = draws()
    assert not same(first, draws())
    ms.manual_seed(13)
    assert same(first, draws())


def test_get_and_set_rng_state_replay_the_draws():
    ms.manual_seed(5)
    draws()
    state = ms.get_rng_state()
    after = draws()
    ms.set_rng_state(state)
    assert same(after, draws())
    assert ms.initial_seed() == 5


def test_the_state_is_mindspores_uint8_layout():
    # MindSpore 2.7.0 gives, after manual_seed(13): UInt8 (16,) [13 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0]
    ms.manual_seed(13)
    state = ms.get_rng_state()
    assert state.dtype == ms.uint8
    assert state.asnumpy().tolist() == [13] + [0] * 15
    # and a state of seed 9, offset 4 sets initial_seed() to 9 and reads back as given
    given = ms.Tensor(np.array([9, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0], np.uint8))
    ms.set_rng_state(given)
    assert ms.initial_seed() == 9
    assert ms.get_rng_state().asnumpy().tolist() == given.asnumpy().tolist()


def test_seed_draws_a_seed_that_initial_seed_returns():
    # MindSpore 2.7.0 gives: seed() returns an int equal to initial_seed()
    value = ms.seed()
    assert isinstance(value, int)
    assert ms.initial_seed() == value == ms.get_seed()


def test_a_generator_object_keeps_its_own_seed_and_offset():
    # MindSpore 2.7.0 gives: Generator() seed 0 and state all zeros; manual_seed(7) returns it, state [7 0 ...]
    generator = ms.Generator()
    assert generator.initial_seed() == 0
    assert generator.get_state().asnumpy().tolist() == [0] * 16
    assert generator.manual_seed(7) is generator
    assert generator.initial_seed() == 7
    assert generator.get_state().asnumpy().tolist() == [7] + [0] * 15
    # MindSpore 2.7.0 gives initial_seed() -5 and state [251 255 255 255 255 255 255 255 0 ...] for manual_seed(-5)
    generator.manual_seed(-5)
    assert generator.get_state().asnumpy().tolist() == [251] + [255] * 7 + [0] * 8
    other = ms.Generator()
    other.set_state(generator.get_state())
    assert other.initial_seed() == -5


def test_seed_checks():
    # MindSpore 2.7.0 gives TypeError "Seed must be an integer." for 1.0 and np.int64(3); True is seed 1
    for bad in (1.0, np.int64(3)):
        with pytest.raises(TypeError, match="Seed must be an integer"):
            ms.manual_seed(bad)
    assert ms.manual_seed(True).initial_seed() == 1
    # MindSpore takes any int64; tessel's global seed is set_seed's uint32
    with pytest.raises(NotSupportedYetError, match=r"manual_seed\(-1\).*seed % 2\*\*32"):
        ms.manual_seed(-1)
    # MindSpore 2.7.0 gives TypeError for a list or a numpy array as the state
    with pytest.raises(TypeError):
        ms.set_rng_state([1, 2])
    with pytest.raises(ValueError, match="uint8"):
        ms.set_rng_state(ms.Tensor(np.zeros(16, np.int64)))


def test_mint_draws_from_the_default_generator_and_refuses_another():
    from tessel import mint

    ms.manual_seed(5)
    first = mint.rand(3, generator=ms.default_generator).asnumpy()
    ms.manual_seed(5)
    np.testing.assert_array_equal(mint.rand(3).asnumpy(), first)
    with pytest.raises(NotSupportedYetError, match=r"mint\.randn\(generator=<a Generator of your own>\)"):
        mint.randn(3, generator=ms.Generator())
