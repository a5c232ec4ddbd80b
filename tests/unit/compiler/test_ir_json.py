"""The IR on the wire (compiler/ir_json.py) and strategies on the wire (compiler/parallel/strategy_json.py): every
graph the tracer makes comes back with the same hash and the same bytes; every strategy form comes back equal;
malformed documents are GraphDecodeErrors naming the node and the rule."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessel.compiler.builder import apply, apply_all
from tessel.compiler.dtypes import DType
from tessel.compiler.ir import ConstArray
from tessel.compiler.ir_json import GraphDecodeError, graph_from_json, graph_to_json
from tessel.compiler.parallel import Layout, Strategy, parallelize
from tessel.compiler.parallel.strategy_json import strategies_from_json, strategies_to_json
from tessel.compiler.tracer import TensorSpec, trace

B, F = 2, 4
finite = st.floats(-4, 4, allow_nan=False, width=32)
any_float = st.floats(allow_nan=True, allow_infinity=True, width=32)


def _moves(draw, symbolic: bool):
    """One step of a random net: an op (with attributes of every kind the registry uses) applied to tensors of
    shape (B, F), giving another (B, F) float32 tensor."""
    reshaping = [] if symbolic else ["reshape", "pad", "conv", "pool", "concat_slice"]
    return draw(
        st.sampled_from(
            [
                "unary",
                "binary",
                "scalar",
                "constant",
                "matmul",
                "softmax",
                "reduce",
                "transpose",
                "cast",
                "dropout",
                "onehot",
                "layernorm",
                "where",
                "split",
                *reshaping,
            ]
        )
    )


def _pick(draw, pool: list):
    return pool[draw(st.integers(0, len(pool) - 1))]


def _step(draw, kind: str, pool: list, w, gamma, beta):
    out = _apply_step(draw, kind, pool, w, gamma, beta)
    return out[0] if isinstance(out, tuple) else out


def _apply_step(draw, kind: str, pool: list, w, gamma, beta):
    x = _pick(draw, pool)
    if kind == "unary":
        op = draw(st.sampled_from(["ReLU", "Tanh", "Exp", "Sigmoid", "Neg", "Abs", "Sin", "Softplus", "Erf"]))
        return apply(op, x)
    if kind == "binary":
        op = draw(st.sampled_from(["Add", "Mul", "Sub", "Maximum", "Minimum", "Div"]))
        return apply(op, x, _pick(draw, pool))
    if kind == "scalar":
        return apply(draw(st.sampled_from(["Add", "Mul"])), x, draw(any_float))  # weak scalars: NaN and inf too
    if kind == "constant":
        values = draw(st.lists(any_float, min_size=F, max_size=F))
        return apply("Add", x, np.asarray(values, np.float32))
    if kind == "matmul":
        if draw(st.booleans()):
            return apply("MatMul", x, w, transpose_b=True)
        return apply("GELU", apply("MatMul", x, w), approximate=draw(st.sampled_from(["tanh", "none"])))
    if kind == "softmax":
        return apply(draw(st.sampled_from(["Softmax", "LogSoftmax"])), x, axis=draw(st.sampled_from([-1, 1])))
    if kind == "reduce":
        op = draw(st.sampled_from(["ReduceSum", "ReduceMean", "ReduceMax"]))
        axis = draw(st.sampled_from([None, 1, (1,), (0, 1)]))
        return apply("Add", x, apply(op, x, axis=axis, keep_dims=True))
    if kind == "transpose":
        return apply("Transpose", apply("Transpose", x, perm=(1, 0)), perm=(1, 0))
    if kind == "cast":
        dtype = draw(st.sampled_from([DType.float16, DType.float64]))
        return apply("Cast", apply("Cast", x, dtype=dtype), dtype=DType.float32)
    if kind == "dropout":
        return apply("Dropout", x, p=draw(st.floats(0.0, 0.9)), seed=draw(st.integers(0, 2**40)), training=True)
    if kind == "onehot":
        index = apply("Argmax", x, axis=-1, output_type=draw(st.sampled_from([DType.int32, DType.int64])))
        on = draw(finite)
        return apply("OneHot", index, depth=F, on_value=on, off_value=draw(finite), dtype=DType.float32)
    if kind == "layernorm":
        return apply("LayerNorm", x, gamma, beta, epsilon=draw(st.sampled_from([1e-5, 1e-7, 0.5])))
    if kind == "where":
        return apply("Select", apply("Greater", x, 0.0), x, _pick(draw, pool))
    if kind == "split":
        a, b = apply_all("Split", x, axis=1, output_num=2, sizes=None)
        return apply("Concat", a, b, axis=1)
    if kind == "reshape":
        return apply("Reshape", apply("Reshape", x, shape=(B * F,)), shape=(B, F))
    if kind == "pad":
        padded = apply("Pad", x, paddings=((0, 0), (1, 2)), value=draw(finite))
        return apply("StridedSlice", padded, begin=(0, 1), end=(B, 1 + F), strides=(1, 1))
    if kind == "conv":
        image = apply("Reshape", x, shape=(B, 1, 2, 2))
        kernel = np.asarray(draw(st.lists(finite, min_size=1, max_size=1)), np.float32).reshape(1, 1, 1, 1)
        out = apply("Conv2D", image, kernel, pad_mode=draw(st.sampled_from(["same", "valid"])), stride=1)
        return apply("Reshape", out, shape=(B, F))
    if kind == "pool":
        image = apply("Reshape", x, shape=(B, 1, 2, 2))
        pooled = apply("MaxPool", image, kernel_size=(1, 1), strides=(1, 1), pad_mode="valid")
        return apply("Reshape", pooled, shape=(B, F))
    if kind == "concat_slice":
        both = apply("Concat", x, _pick(draw, pool), axis=0)
        return apply("StridedSlice", both, begin=(B, 0), end=(2 * B, F), strides=(1, 1))
    raise AssertionError(kind)


@st.composite
def random_graphs(draw):
    symbolic = draw(st.booleans())
    batch = "N" if symbolic else B
    steps = draw(st.integers(1, 8))

    def net(x, y, w, gamma, beta):
        pool = [x, y]
        for _ in range(steps):
            pool.append(_step(draw, _moves(draw, symbolic), pool, w, gamma, beta))
        chosen = draw(st.lists(st.integers(0, len(pool) - 3), min_size=1, max_size=2, unique=True))
        outputs = [pool[2 + k] for k in chosen]
        return tuple(o.mean() if draw(st.booleans()) else o for o in outputs)

    specs = [TensorSpec((batch, F)), TensorSpec((batch, F)), TensorSpec((F, F)), TensorSpec((F,)), TensorSpec((F,))]
    return trace(net, *specs).graph


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(random_graphs())
def test_every_traced_graph_comes_back_with_its_hash_and_its_bytes(graph):
    data = graph_to_json(graph)
    again = graph_from_json(data)
    assert again.hash == graph.hash
    assert again.dump() == graph.dump()  # the user's file:line travels too
    assert graph_to_json(again) == data == graph_to_json(graph)
    json.loads(data)  # strict JSON: no NaN literals


def test_constants_travel_bit_for_bit():
    weird = np.array([np.nan, -0.0, np.inf, 1e-45], np.float32)
    graph = trace(lambda x: x + weird, TensorSpec((4,))).graph
    (const,) = [n for n in graph_from_json(graph_to_json(graph)).nodes if n.op == "Constant"]
    assert const.attrs["value"].data == weird.tobytes()


def test_a_parallel_rank_graph_with_layouts_and_collectives_round_trips():
    def mlp(x, w1, w2):
        return apply("MatMul", apply("ReLU", apply("MatMul", x, w1)), w2).mean()

    graph = trace(mlp, TensorSpec((8, 4), name="x"), TensorSpec((4, 8), name="w1"), TensorSpec((8, 2), name="w2")).graph
    plan = parallelize(graph, {0: ((1, 1), (1, 2)), 2: ((1, 2), (2, 1))}, 2, parameters=["w1", "w2"])
    rank = plan.rank_graph(0)
    assert any(n.op == "AllReduce" for n in rank.nodes)
    again = graph_from_json(graph_to_json(rank))
    assert again.hash == rank.hash and again.dump() == rank.dump()


def _doc(graph):
    return json.loads(graph_to_json(graph))


def _small():
    return trace(lambda x, w: apply("ReLU", apply("MatMul", x, w)), TensorSpec((2, 3)), TensorSpec((3, 4))).graph


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["nodes"][0].update(op="Matmul"), "node 0 (Matmul): unknown op 'Matmul'; similar registered ops"),
        (lambda d: d["nodes"][0]["attrs"].append(["alpha", 1]), "MatMul has no attribute 'alpha'"),
        (lambda d: d["nodes"][1].update(inputs=[7]), "node 1 (ReLU) input 0 refers to value 7"),
        (lambda d: d["nodes"][0]["outputs"][0].update(shape=[2, 5]), "shape inference gives [f32[2,4]]"),
        (lambda d: d["nodes"][0]["outputs"][0].update(dtype="float8"), "'float8' is not a dtype"),
        (lambda d: d.update(format="tessel.graph/0"), "format is 'tessel.graph/0'"),
        (lambda d: d["nodes"][0]["attrs"][0].__setitem__(1, {"pickle": "x"}), "unknown tagged value 'pickle'"),
        (lambda d: d["outputs"].append({"value": -1, "name": None}), "output 1 refers to value -1"),
    ],
)
def test_malformed_graphs_are_clear_errors(edit, message):
    document = _doc(_small())
    edit(document)
    with pytest.raises(GraphDecodeError) as err:
        graph_from_json(json.dumps(document).encode())
    assert message in str(err.value)


def test_bad_bytes_limits_and_bad_arrays_are_clear_errors():
    with pytest.raises(GraphDecodeError, match="not JSON"):
        graph_from_json(b"\x80\x04pickle")
    with pytest.raises(GraphDecodeError, match="has 2 nodes, more than the 1 accepted"):
        graph_from_json(graph_to_json(_small()), max_nodes=1)
    graph = trace(lambda x: x + np.arange(3, dtype=np.float32), TensorSpec((3,))).graph
    document = _doc(graph)
    const = next(n for n in document["nodes"] if n["op"] == "Constant")
    const["attrs"][0][1]["array"]["data"] = base64.b64encode(b"\0" * 8).decode()
    with pytest.raises(GraphDecodeError, match=r"needs 12 bytes, got 8"):
        graph_from_json(json.dumps(document))


def test_check_types_off_accepts_what_inference_would_not():
    document = _doc(_small())
    document["nodes"][1]["outputs"][0]["shape"] = [2, 9]
    graph = graph_from_json(json.dumps(document), check_types=False)
    assert graph.nodes[1].output.shape == (2, 9)


# --- strategies -----------------------------------------------------------------------------------------------------


def _mlp():
    def mlp(x, w1, b1, w2):
        return apply("MatMul", apply("ReLU", apply("BiasAdd", apply("MatMul", x, w1), b1)), w2).mean()

    specs = [TensorSpec((8, 4), name="x"), TensorSpec((4, 8), name="w1"), TensorSpec((8,), name="b1")]
    return trace(mlp, *specs, TensorSpec((8, 2), name="w2")).graph


def test_every_strategy_form_round_trips_keyed_by_node():
    graph = _mlp()
    n = graph.nodes
    layout = Layout((2, 1), (1, -1))
    given = {
        n[0]: ((1, 1), (1, 2)),
        n[1]: "data_parallel",
        2: Strategy(((1, 2),), ((2, 1),)),
        n[3]: Strategy(None, None, (layout, None), (Layout((2, 1), (1, 0), (), "sum"),)),
        n[4]: (None, (2,)),
    }
    data = strategies_to_json(graph, given)
    back = strategies_from_json(graph, data)
    assert back == {n[0]: ((1, 1), (1, 2)), n[1]: "data_parallel", n[2]: given[2], n[3]: given[n[3]], n[4]: given[n[4]]}
    assert strategies_to_json(graph, back) == data


def test_a_tuple_of_layouts_comes_back_and_a_sharded_primitive_arrives_as_a_strategy():
    graph = _mlp()

    class Sharded:  # what a Primitive after .shard() looks like to the planner
        in_strategy, out_strategy = ((2, 1), (1, 1)), None

    layouts = (Layout((2,), (0, -1)), Layout((2,), (-1, -1)))
    back = strategies_from_json(graph, strategies_to_json(graph, {0: layouts, 3: Sharded()}))
    assert back[graph.nodes[0]] == layouts and back[graph.nodes[3]] == Strategy(((2, 1), (1, 1)))


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.sampled_from([1, 2, 3]), min_size=1, max_size=3).flatmap(
        lambda matrix: st.tuples(st.just(tuple(matrix)), st.permutations(range(-1, len(matrix))))
    ),
    st.sampled_from(["sum", "max", "min"]),
)
def test_layouts_round_trip(matrix_and_axes, partial_op):
    matrix, axes = matrix_and_axes
    tensor_map = tuple(axes[:2]) if len(axes) > 1 else (axes[0],)
    used = {a for a in tensor_map if a != -1}
    partial = tuple(a for a in range(len(matrix)) if a not in used)[:1]
    layout = Layout(matrix, tensor_map, partial, partial_op)
    graph = _mlp()
    back = strategies_from_json(graph, strategies_to_json(graph, {0: Strategy(None, None, (layout, None))}))
    assert back[graph.nodes[0]].in_layouts[0] == layout


def test_strategies_for_another_graph_or_node_are_clear_errors():
    graph = _mlp()
    data = strategies_to_json(graph, {0: ((1, 1), (1, 2))})
    with pytest.raises(GraphDecodeError, match="planned for graph hash"):
        strategies_from_json(_small(), data)
    document = json.loads(data)
    document["strategies"] = [[99, "data_parallel"]]
    with pytest.raises(GraphDecodeError, match="node 99, but graph"):
        strategies_from_json(graph, json.dumps(document))


def test_const_array_attrs_keep_dtype_and_shape():
    value = ConstArray.of(np.arange(6, dtype=np.int64).reshape(2, 3))
    graph = trace(lambda x: apply("Add", x, value.numpy()), TensorSpec((2, 3), DType.int64)).graph
    const = next(n for n in graph_from_json(graph_to_json(graph)).nodes if n.op == "Constant")
    assert const.attrs["value"] == value


def test_a_whole_train_step_with_gradients_and_adam_round_trips():
    from tessel.compiler.optimizers import Adam
    from tessel.compiler.train_step import build_train_step

    def mlp(x, y, w1, b1, w2):
        h = apply("ReLU", apply("MatMul", x, w1, transpose_b=True) + b1)
        return apply("SparseSoftmaxCrossEntropy", apply("MatMul", h, w2, transpose_b=True), y).mean()

    specs = [TensorSpec(("N", 6)), TensorSpec(("N",), "int32"), TensorSpec((8, 6)), TensorSpec((8,))]
    forward = trace(mlp, *specs, TensorSpec((3, 8))).graph
    graph = build_train_step(forward, ["w1", "b1", "w2"], Adam(learning_rate=0.01)).graph
    assert "Assign" in {n.op for n in graph.nodes}
    again = graph_from_json(graph_to_json(graph))
    assert again.hash == graph.hash and graph_to_json(again) == graph_to_json(graph)
