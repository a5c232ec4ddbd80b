"""daemon.session.MeteredStore: its running byte count equals a walk over the store after any sequence of changes."""

import numpy as np
import pytest

from tessel.daemon.session import MeteredStore, TensorStore


def walk(store: dict) -> int:
    """The count by definition: each buffer once, at the largest of the names that view it."""
    largest: dict[int, int] = {}
    for value in store.values():
        array = value if type(value) is np.ndarray else np.asarray(value)
        key = id(array.base) if type(array.base) is np.ndarray else id(value)
        largest[key] = max(largest.get(key, 0), array.nbytes)
    return sum(largest.values())


def test_views_of_one_buffer_count_once_at_the_largest():
    flat = np.zeros(100, np.float32)
    store = MeteredStore({"whole": flat, "head": flat[:40], "tail": flat[40:], "lr": np.float32(0.1)})
    assert store.nbytes == 400 + 4
    del store["whole"]
    assert store.nbytes == 240 + 4  # the tail is now the largest view of the buffer
    store.pop("tail")
    assert store.nbytes == 160 + 4
    store["head"] = np.ones(3, np.float64)  # replaced by an array of its own
    assert store.nbytes == 24 + 4
    store.clear()
    assert store.nbytes == 0 and not store


def test_every_way_of_changing_the_store_keeps_the_count():
    rng = np.random.default_rng(0)
    buffers = [np.zeros(int(n), np.float32) for n in rng.integers(1, 50, 6)]
    store = MeteredStore()
    names = [f"t{i}" for i in range(8)]
    for _ in range(2000):
        name, op = names[rng.integers(len(names))], rng.integers(7)
        if op <= 1:  # a view of a shared buffer, or an array of its own
            b = buffers[rng.integers(len(buffers))]
            lo = int(rng.integers(0, b.size))
            store[name] = b[lo : int(rng.integers(lo, b.size + 1))] if op == 0 else np.ones(int(rng.integers(0, 9)))
        elif op == 2:
            store.pop(name, None)
        elif op == 3 and name in store:
            del store[name]
        elif op == 4:
            store.update({name: np.float32(1.0), names[0]: buffers[0]})
        elif op == 5:
            store.setdefault(name, buffers[1][:5])
        elif store:
            store.popitem()
        assert store.nbytes == walk(store), (op, name)
    store |= {"x": buffers[2]}
    assert store.nbytes == walk(store)


def test_missing_names_raise_as_a_dict_does_and_change_nothing():
    store = MeteredStore({"a": np.zeros(4, np.float32)})
    with pytest.raises(KeyError):
        del store["b"]
    with pytest.raises(KeyError):
        store.pop("b")
    assert store.nbytes == 16 and dict(store).keys() == {"a"}


def test_a_store_is_metered_in_place_for_a_recorded_step_and_plain_again_after():
    """The same object throughout: what another thread puts meanwhile stays in the store."""
    store = TensorStore({"a": np.zeros(4, np.float32)})
    with pytest.raises(RuntimeError, match="the step failed"), store.metered() as metered:
        assert metered is store and type(store) is MeteredStore and store.nbytes == 16
        store["b"] = np.zeros(2, np.float64)
        assert store.nbytes == 32
        raise RuntimeError("the step failed")
    assert type(store) is TensorStore and set(store) == {"a", "b"}
    with store.metered():
        assert store.nbytes == 32  # counted afresh each time
    import copy

    twin = copy.deepcopy(store)  # the contents; the lock is the store's own
    assert type(twin) is TensorStore and twin.keys() == store.keys() and twin.lock is not store.lock


def test_changes_from_two_threads_at_once_keep_the_count():
    """A put on the service's thread while the program's thread frees (PutTensors takes no session lock)."""
    import sys
    import threading

    store = MeteredStore()
    buffer = np.zeros(1000, np.float32)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can: every interleaving gets its turn
    try:

        def churn(offset: int) -> None:
            for i in range(20_000):
                name = f"t{(i + offset) % 5}"
                if i % 3:
                    store[name] = buffer[: (i % 7) * 10 + offset]
                else:
                    store.pop(name, None)

        threads = [threading.Thread(target=churn, args=(k,)) for k in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert store.nbytes == walk(store)


def test_puts_and_frees_from_another_thread_across_recorded_steps_land_whole():
    """DaemonCore.put/free on the service's thread while the program's thread starts and ends recorded steps:
    nothing raises, nothing is lost, and inside each step the count matches the store."""
    import sys
    import threading

    store = TensorStore({f"p{i}": np.zeros(8) for i in range(30)})
    buffer = np.zeros(1000, np.float32)
    errors: list[BaseException] = []
    stop = threading.Event()

    def service() -> None:
        i = 0
        try:
            while not stop.is_set():
                with store.lock:  # as DaemonCore.put / free
                    if i % 3:
                        store.update({f"t{i % 5}": buffer[: i % 50 + 1]})
                    else:
                        store.pop(f"t{i % 5}", None)
                i += 1
        except BaseException as error:
            errors.append(error)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=service)
    thread.start()
    try:
        wrong = 0
        for _ in range(300):
            with store.metered():
                store["step"] = np.ones(3)  # the program's own change
                with store.lock:
                    wrong += store.nbytes != walk(store)
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert not errors and wrong == 0 and type(store) is TensorStore
    assert all(f"p{i}" in store for i in range(30)) and "step" in store
