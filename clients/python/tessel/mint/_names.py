"""The public names of MindSpore 2.7's `mindspore.mint` modules (their `__all__` that exist as attributes, plus the
documented names they import; generated from the 2.7.0 wheel). A name listed here that tessel does not map raises
NotSupportedYetError; a name not listed is an AttributeError, as for any module."""

from __future__ import annotations

# mindspore.mint
MINT = frozenset(
    """
    abs acos acosh add addbmm addcdiv addcmul addmm addmv all allclose amax amin any arange arccos arccosh arcsin
    arcsinh arctan arctan2 arctanh argmax argmin argsort asin asinh atan atan2 atanh baddbmm batch_norm_elemt
    batch_norm_gather_stats_with_counts batch_norm_stats bernoulli bincount bitwise_and bitwise_not bitwise_or
    bitwise_xor bmm broadcast_to cat cdist ceil chunk clamp clip clone concat conv2d cos cosh count_nonzero cross
    cummax cummin cumprod cumsum diag diff div divide dot dstack einsum empty empty_like eq equal erf erfc erfinv
    exp exp2 expm1 eye fix flatten flip float_power floor floor_divide fmod frac full full_like gather gcd ge
    greater greater_equal gt histc hstack index_add index_select inverse isclose isfinite isinf isnan isneginf item
    kthvalue le lerp less less_equal linspace log log10 log1p log2 logaddexp logaddexp2 logical_and logical_not
    logical_or logical_xor logsumexp lt masked_select matmul max maximum mean median meshgrid min minimum mm mul
    multinomial mv nan_to_num nansum narrow ne neg negative nonzero norm normal not_equal ones ones_like outer
    permute polar pow prod rand rand_like randint randint_like randn randn_like randperm ravel reciprocal remainder
    repeat_interleave reshape roll round rsqrt scatter scatter_add searchsorted select sigmoid sign sin sinc sinh
    softmax sort split sqrt square squeeze stack std std_mean sub sum swapaxes t take tan tanh tile topk trace
    transpose triangular_solve tril triu trunc unbind unique unique_consecutive unsqueeze var var_mean where xlogy
    zeros zeros_like
    """.split()  # noqa: SIM905 - one name per word reads better than 200 quoted strings
)

# mindspore.mint.nn
MINT_NN = frozenset(
    """
    AdaptiveAvgPool1d AdaptiveAvgPool2d AdaptiveAvgPool3d AdaptiveMaxPool1d AdaptiveMaxPool2d AvgPool1d AvgPool2d
    AvgPool3d BCELoss BCEWithLogitsLoss BatchNorm1d BatchNorm2d BatchNorm3d ConstantPad1d ConstantPad2d
    ConstantPad3d Conv1d Conv2d Conv3d ConvTranspose2d CrossEntropyLoss Dropout Dropout2d ELU Embedding Flatten Fold
    GELU GLU GroupNorm Hardshrink Hardsigmoid Hardswish Hardtanh Identity KLDivLoss L1Loss LayerNorm Linear
    LogSigmoid LogSoftmax MSELoss MaxPool2d MaxUnpool2d Mish NLLLoss PReLU PixelShuffle ReLU ReLU6 ReflectionPad1d
    ReflectionPad2d ReflectionPad3d ReplicationPad1d ReplicationPad2d ReplicationPad3d SELU SiLU Sigmoid
    SmoothL1Loss SoftMarginLoss Softmax Softshrink SyncBatchNorm Tanh Threshold Unfold Upsample UpsamplingBilinear2d
    UpsamplingNearest2d ZeroPad1d ZeroPad2d ZeroPad3d
    """.split()  # noqa: SIM905 - one name per word reads better than 200 quoted strings
)

# mindspore.mint.nn.functional
MINT_NN_FUNCTIONAL = frozenset(
    """
    adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool2d avg_pool1d
    avg_pool2d avg_pool3d batch_norm binary_cross_entropy binary_cross_entropy_with_logits conv1d conv2d conv3d
    conv_transpose2d cross_entropy dropout dropout2d elu elu_ embedding flatten fold gelu glu grid_sample group_norm
    hardshrink hardsigmoid hardswish hardtanh hardtanh_ interpolate kl_div l1_loss layer_norm leaky_relu linear
    log_softmax logsigmoid max_pool2d max_unpool2d mish mse_loss nll_loss normalize one_hot pad pixel_shuffle prelu
    relu relu6 relu_ selu sigmoid silu smooth_l1_loss soft_margin_loss softmax softplus softshrink tanh threshold
    threshold_ unfold upsample
    """.split()  # noqa: SIM905 - one name per word reads better than 200 quoted strings
)

# mindspore.mint.optim
MINT_OPTIM = frozenset(
    """
    Adam AdamW SGD
    """.split()  # noqa: SIM905 - one name per word reads better than 200 quoted strings
)

# mindspore.mint.linalg
MINT_LINALG = frozenset(
    """
    inv matrix_norm norm qr vector_norm
    """.split()  # noqa: SIM905 - one name per word reads better than 200 quoted strings
)

# mindspore.mint.special
MINT_SPECIAL = frozenset(
    """
    erfc exp2 expm1 log1p log_softmax round sinc
    """.split()  # noqa: SIM905 - one name per word reads better than 200 quoted strings
)

# mindspore.mint.distributed
MINT_DISTRIBUTED = frozenset(
    """
    P2POp TCPStore all_gather all_gather_into_tensor all_gather_into_tensor_uneven all_gather_object all_reduce
    all_to_all all_to_all_single barrier batch_isend_irecv broadcast broadcast_object_list destroy_process_group
    gather gather_object get_backend get_global_rank get_group_rank get_process_group_ranks get_rank get_world_size
    init_process_group irecv is_available is_initialized isend new_group recv reduce reduce_scatter
    reduce_scatter_tensor reduce_scatter_tensor_uneven scatter scatter_object_list send
    """.split()  # noqa: SIM905 - one name per word reads better than 200 quoted strings
)
