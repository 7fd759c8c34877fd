"""The operators onnxruntime registers for its DirectML execution provider: a static
table, because DirectML runs only on Windows and nothing on this machine can ask it.

Source: onnxruntime's ``docs/OperatorKernels.md``, section "Operators implemented by
DmlExecutionProvider" (generated from the registered kernels), as of 2026-12-04. Each
operator maps to the first and the last opset version a DML kernel is registered at
(the table lists every registration as ``N+``; a node whose operator version, in the
model's opset, lies outside that span has no DML kernel). Types are not tracked: the
DML kernels take float32 and float16 for every arithmetic operator; integer support
varies and is not checked here.

One rule beyond the table, the reason this table exists: DirectML cannot take a
``Reshape`` whose ``allowzero`` attribute is 1 (the provider's capability check
rejects it), and onnxruntime then places that node -- and, through the copies around
it, often the whole graph -- on the CPU without a word.
"""

from __future__ import annotations

SOURCE = "onnxruntime docs/OperatorKernels.md (DmlExecutionProvider), 2026-12-04"

# Operator -> (first, last) opset version with a registered DML kernel, domain ai.onnx.
ONNX_KERNELS: dict[str, tuple[int, int]] = {
    "Abs": (6, 13), "Acos": (7, 7), "Acosh": (9, 9), "Add": (7, 14), "Affine": (1, 1), "And": (7, 7),
    "ArgMax": (1, 13), "ArgMin": (1, 13), "Asin": (7, 7), "Asinh": (9, 9), "Atan": (7, 7), "Atanh": (9, 9),
    "AveragePool": (7, 19), "BatchNormalization": (7, 15), "BitShift": (11, 11), "BitwiseAnd": (18, 18),
    "BitwiseNot": (18, 18), "BitwiseOr": (18, 18), "BitwiseXor": (18, 18), "Cast": (6, 21), "CastLike": (15, 21),
    "Ceil": (6, 13), "Celu": (12, 12), "Clip": (6, 13), "Col2Im": (18, 18), "Concat": (4, 13),
    "ConcatFromSequence": (11, 11), "ConstantOfShape": (9, 21), "Conv": (1, 11), "ConvInteger": (10, 10),
    "ConvTranspose": (1, 11), "Cos": (7, 7), "Cosh": (9, 9), "Crop": (1, 1), "CumSum": (11, 14), "DFT": (17, 20),
    "DepthToSpace": (1, 13), "DequantizeLinear": (10, 21), "Div": (7, 14), "Dropout": (7, 7),
    "DynamicQuantizeLinear": (11, 11), "Einsum": (12, 12), "Elu": (6, 6), "Equal": (7, 19), "Erf": (9, 13),
    "Exp": (6, 13), "Expand": (8, 13), "EyeLike": (9, 9), "Flatten": (1, 21), "Floor": (6, 13), "GRU": (7, 14),
    "Gather": (1, 13), "GatherElements": (11, 13), "GatherND": (11, 13), "Gemm": (7, 13),
    "GlobalAveragePool": (1, 1), "GlobalLpPool": (2, 2), "GlobalMaxPool": (1, 1), "Greater": (7, 13),
    "GreaterOrEqual": (12, 16), "GridSample": (16, 16), "GroupNorm": (21, 21), "HardSigmoid": (6, 6),
    "Hardmax": (1, 13), "Identity": (1, 21), "If": (7, 19), "ImageScaler": (1, 1), "InstanceNormalization": (6, 6),
    "IsInf": (10, 20), "IsNaN": (9, 20), "LRN": (1, 13), "LSTM": (7, 14), "LayerNormalization": (1, 17),
    "LeakyRelu": (6, 16), "Less": (7, 13), "LessOrEqual": (12, 16), "Log": (6, 13), "LogSoftmax": (1, 13),
    "LpNormalization": (1, 1), "LpPool": (2, 18), "MatMul": (1, 13), "MatMulInteger": (10, 10), "Max": (6, 13),
    "MaxPool": (1, 12), "MaxRoiPool": (1, 1), "MaxUnpool": (9, 11), "Mean": (6, 13),
    "MeanVarianceNormalization": (1, 13), "MemcpyFromHost": (1, 1), "MemcpyToHost": (1, 1), "Min": (6, 13),
    "Mod": (10, 13), "Mul": (7, 14), "Neg": (6, 13), "NonZero": (9, 13), "Not": (1, 1), "OneHot": (9, 11),
    "OptionalGetElement": (15, 18), "OptionalHasElement": (15, 18), "Or": (7, 7), "PRelu": (7, 16), "Pad": (2, 21),
    "ParametricSoftplus": (1, 1), "Pow": (7, 15), "QLinearConv": (10, 10), "QLinearMatMul": (10, 21),
    "QuantizeLinear": (10, 21), "RNN": (7, 14), "Range": (11, 11), "Reciprocal": (6, 13), "ReduceL1": (1, 18),
    "ReduceL2": (1, 18), "ReduceLogSum": (1, 18), "ReduceLogSumExp": (1, 18), "ReduceMax": (1, 20),
    "ReduceMean": (1, 18), "ReduceMin": (1, 20), "ReduceProd": (1, 18), "ReduceSum": (1, 13),
    "ReduceSumSquare": (1, 18), "Relu": (6, 14), "Reshape": (5, 21), "Resize": (10, 19), "ReverseSequence": (10, 10),
    "RoiAlign": (10, 16), "Round": (11, 11), "STFT": (17, 17), "ScaledTanh": (1, 1), "Scatter": (9, 13),
    "ScatterElements": (11, 16), "ScatterND": (11, 16), "Selu": (6, 6), "SequenceAt": (11, 11),
    "SequenceConstruct": (11, 11), "SequenceEmpty": (11, 11), "SequenceErase": (11, 11), "SequenceInsert": (11, 11),
    "SequenceLength": (11, 11), "Shape": (1, 21), "Shrink": (9, 9), "Sigmoid": (6, 13), "Sign": (9, 13),
    "SimplifiedLayerNormalization": (1, 1), "Sin": (7, 7), "Sinh": (9, 9), "Size": (1, 21), "Slice": (1, 13),
    "Softmax": (1, 13), "Softplus": (1, 1), "Softsign": (1, 1), "SpaceToDepth": (1, 13), "Split": (2, 18),
    "Sqrt": (6, 13), "Squeeze": (1, 21), "Sub": (7, 14), "Sum": (6, 13), "Tan": (7, 7), "Tanh": (6, 13),
    "ThresholdedRelu": (1, 10), "Tile": (6, 13), "TopK": (1, 11), "Transpose": (1, 21), "Trilu": (14, 14),
    "Unsqueeze": (1, 21), "Upsample": (7, 10), "Where": (9, 16), "Xor": (7, 7),
}

# Contrib operators (domain com.microsoft), every one registered from version 1.
MICROSOFT_KERNELS: frozenset[str] = frozenset({
    "Attention", "BiasAdd", "BiasGelu", "BiasSplitGelu", "ConvTransposeWithDynamicPads", "DequantizeLinear",
    "DynamicQuantizeMatMul", "EmbedLayerNormalization", "FastGelu", "FusedMatMul", "FusedMatMulActivation", "Gelu",
    "GroupNorm", "GroupQueryAttention", "MatMulIntegerToFloat", "MatMulNBits", "MultiHeadAttention", "NhwcConv",
    "QAttention", "QLinearAdd", "QLinearAveragePool", "QLinearConcat", "QLinearGlobalAveragePool", "QLinearSigmoid",
    "QuantizeLinear", "QuickGelu", "RotaryEmbedding", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
})
