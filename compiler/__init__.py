"""tessel's compiler: the IR, the op registry, tracing, autodiff, ONNX lowering and the fused train step.

    >>> from tessel.compiler import TensorSpec, apply, grad_graph, trace, to_onnx
    >>> traced = trace(lambda x, w: apply("MatMul", x, w).sum(), TensorSpec(("N", 4)), TensorSpec((4, 2)))
    >>> print(traced.graph.dump())
    >>> model = to_onnx(grad_graph(traced.graph, wrt=["w"]))

Every op is defined once in `tessel.compiler.ops` (see `registry.OpDef`); everything else is generic over it.
"""

from tessel.compiler.autodiff import GradContext, expand_gradients, grad_graph, gradients
from tessel.compiler.buckets import (
    DEFAULT_BUCKET_BYTES,
    Bucket,
    bucket_allreduce,
    data_parallel_train_step,
    mirror_parameters,
    plan_buckets,
)
from tessel.compiler.builder import AS_BOOL, GraphBuilder, SymbolicTensor, apply, apply_all
from tessel.compiler.dtypes import DType, as_dtype, promote
from tessel.compiler.eager import EagerExecutor
from tessel.compiler.errors import DataDependentError, GradientError, ShapeInferenceError, TraceError
from tessel.compiler.ir import Attrs, ConstArray, Graph, Node, TensorType, Value
from tessel.compiler.lower_onnx import OPSET, assign_output_name, model_bytes, output_names, to_onnx
from tessel.compiler.optimizers import SGD, Adam, AdamWeightDecay, Momentum, Optimizer
from tessel.compiler.rank_program import RankProgram, RankSegment, group_name, lower_rank_program
from tessel.compiler.rank_simulator import run_graphs, simulate
from tessel.compiler.registry import REQUIRED, ZERO_GRAD, Cost, OpDef, register
from tessel.compiler.registry import get as get_op
from tessel.compiler.registry import names as op_names
from tessel.compiler.tracer import TensorSpec, Trace, Traced, current_trace_builder, trace
from tessel.compiler.train_step import StateSpec, TrainProgram, TrainStep, build_train_step

__all__ = [
    "AS_BOOL",
    "DEFAULT_BUCKET_BYTES",
    "OPSET",
    "REQUIRED",
    "SGD",
    "ZERO_GRAD",
    "Adam",
    "AdamWeightDecay",
    "Attrs",
    "Bucket",
    "ConstArray",
    "Cost",
    "DType",
    "DataDependentError",
    "EagerExecutor",
    "GradContext",
    "GradientError",
    "Graph",
    "GraphBuilder",
    "Momentum",
    "Node",
    "OpDef",
    "Optimizer",
    "RankProgram",
    "RankSegment",
    "ShapeInferenceError",
    "StateSpec",
    "SymbolicTensor",
    "TensorSpec",
    "TensorType",
    "Trace",
    "TraceError",
    "Traced",
    "TrainProgram",
    "TrainStep",
    "Value",
    "apply",
    "apply_all",
    "as_dtype",
    "assign_output_name",
    "bucket_allreduce",
    "build_train_step",
    "current_trace_builder",
    "data_parallel_train_step",
    "expand_gradients",
    "get_op",
    "grad_graph",
    "gradients",
    "group_name",
    "lower_rank_program",
    "mirror_parameters",
    "model_bytes",
    "op_names",
    "output_names",
    "plan_buckets",
    "promote",
    "register",
    "run_graphs",
    "simulate",
    "to_onnx",
    "trace",
]
