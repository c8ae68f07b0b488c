"""KernelBench's static checks on a submission (kernel_static_checker.validate_kernel_static),
as ../shared/KERNELBENCH.md states them: lines are cut at the first '#' and the first '//',
and nothing else is stripped, so docstrings and CUDA strings are scanned too."""
import re

COMPUTE_OPS = (
    "mm bmm matmul einsum conv conv1d conv2d conv3d conv_transpose1d conv_transpose2d "
    "conv_transpose3d avg_pool1d avg_pool2d avg_pool3d max_pool1d max_pool2d max_pool3d "
    "adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool1d "
    "adaptive_max_pool2d adaptive_max_pool3d relu hardtanh elu selu leaky_relu gelu softsign softplus "
    "softmax log_softmax tanh sigmoid hardsigmoid silu mish batch_norm group_norm layer_norm "
    "instance_norm rms_norm normalize linear cross_entropy kl_div mse_loss huber_loss "
    "triplet_margin_loss cosine_similarity logsumexp clamp dropout"
).split()

ERRORS = {
    "try/except": [r"\btry\s*:", r"\bexcept\s*:", r"\bexcept\s+\w+"],
    "the word pass": [r"\bpass\b"],
    "timer patching": [r"torch\.cuda\.Event\s*=", r"\.record\s*=", r"\.elapsed_time\s*=",
                       r"torch\.cuda\.synchronize\s*=", r"time\.time\s*=", r"time\.perf_counter\s*="],
    "threads or processes": [r"\bthreading\b", r"\bmultiprocessing\b", r"concurrent\.futures",
                             r"ThreadPoolExecutor", r"ProcessPoolExecutor"],
    "tensor subclass": [r"_make_subclass", r"class\s+\w+\s*\(\s*(torch\.)?Tensor\s*\)", r"torch\.Tensor\.__new__"],
}

WARNINGS = {
    "torch.nn compute layer": [r"torch\.nn\.(?!(Module|Parameter|ParameterList|ParameterDict|ModuleList|ModuleDict|init|parameter)\b)"],
    "torch compute op": [r"\btorch\.(" + "|".join(COMPUTE_OPS) + r")\b", r"\bF\.\w+\s*\("],
    "streams": [r"torch\.cuda\.Stream\s*\(", r"with\s+torch\.cuda\.stream", r"\.wait_stream\s*\(", r"\.record_stream\s*\("],
}

FP32_DOWNGRADE = [r"__float2half(_rn)?\s*\(", r"\(\s*__half\s*\)", r"static_cast\s*<\s*(__half|half)\s*>\s*\(",
                  r"\.half\s*\(", r"\.to\s*\(\s*torch\.float16"]


def visible(code):
    out = []
    for line in code.split("\n"):
        for mark in ("#", "//"):
            if mark in line:
                line = line[: line.index(mark)]
        out.append(line)
    return "\n".join(out)


def findings(code, precision="fp32"):
    """(errors, warnings): lists of 'rule: matched text' strings."""
    seen = visible(code)
    errors, warnings = [], []
    for name, patterns in ERRORS.items():
        errors += [f"{name}: {m.group(0)!r}" for p in patterns for m in re.finditer(p, seen)]
    if "__global__" not in seen:
        errors.append("no __global__ kernel")
    if "load_inline" not in seen and "cpp_extension" not in seen:
        errors.append("no load_inline / cpp_extension")
    if not re.search(r"\b(threadIdx|blockIdx|blockDim|gridDim)\.|__syncthreads\s*\(|__shared__\s", seen):
        errors.append("no CUDA kernel features")
    for name, patterns in WARNINGS.items():
        warnings += [f"{name}: {m.group(0)!r}" for p in patterns for m in re.finditer(p, seen)]
    if precision == "fp32":
        warnings += [f"fp32 downgrade: {m.group(0)!r}" for p in FP32_DOWNGRADE for m in re.finditer(p, seen)]
    return errors, warnings
