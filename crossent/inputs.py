"""A call's inputs and options: the options as one checked object (Options), PyTorch's checks of the
tensors with clearer messages, and the logits and targets as the kernels read them, a row per sample
position (prepare). Nothing here launches or needs a GPU."""
import math
import operator
import os
from typing import NamedTuple, Optional

import torch

from .constants import DTYPE_CODES, IGNORE_INDEX, MAX_SEG, REDUCTIONS, SEG_SLAB

TARGET_DTYPES = (torch.int64, torch.int32)
_FLOAT32 = torch.finfo(torch.float32)
_PLAIN = (int, float)  # numbers as the defaults are given: not bool, not a tensor


class Options(NamedTuple):
    """The options of a call, checked (check_options). The defaults are KernelBench's problem, which the
    default build runs; any other value, the options build."""
    weight: object = None        # class weights: a tensor of C elements of the logits' dtype, or None
    ignore_index: int = IGNORE_INDEX
    reduction: str = "mean"
    z_loss: float = 0.0          # adds z_loss * lse**2 to each counted row's loss
    return_lse: bool = False     # also return every row's log-sum-exp, in float32
    label_smoothing: float = 0.0
    softcap: float = 0.0         # each logit x read as softcap * tanh(x / softcap); 0: as it is
    float32_loss: bool = False   # the loss in float32 from 16-bit logits, as autocast gives it


DEFAULTS = Options()


def _number(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number; got {value!r}")
    return float(value)


def check_options(weight=None, ignore_index=IGNORE_INDEX, reduction="mean", z_loss=0.0, return_lse=False,
                  label_smoothing=0.0, softcap=None):
    """The options as the dispatch takes them (DEFAULTS itself where every one is the default), or
    the error PyTorch gives for the same mistake: ValueError for the reduction, TypeError for an
    argument of the wrong type, RuntimeError for label smoothing over 1 (under 0 it is none, as in
    PyTorch)."""
    if weight is None and softcap is None and return_lse is False and type(reduction) is str \
            and reduction == "mean" and type(ignore_index) is int and ignore_index == IGNORE_INDEX \
            and type(z_loss) in _PLAIN and z_loss == 0 and type(label_smoothing) in _PLAIN and label_smoothing == 0:
        return DEFAULTS  # a call that passes no option: every check below passes, at a fraction of their cost
    return _checked_options(weight, ignore_index, reduction, z_loss, return_lse, label_smoothing, softcap)


def _checked_options(weight, ignore_index, reduction, z_loss, return_lse, label_smoothing, softcap):
    """check_options' checks, argument by argument."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"{reduction} is not a valid value for reduction")
    if isinstance(ignore_index, bool) or not hasattr(ignore_index, "__index__"):
        raise TypeError(f"ignore_index must be an integer; got {ignore_index!r}")
    if not -2**63 <= operator.index(ignore_index) < 2**63:
        raise TypeError(f"ignore_index must be an int64 integer; got {ignore_index!r}")
    if weight is not None and not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a tensor or None; got {type(weight).__name__}")
    if not math.isfinite(_number("z_loss", z_loss)):
        raise ValueError(f"z_loss must be a finite number; got {z_loss!r}")
    if _number("label_smoothing", label_smoothing) > 1:
        raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    if softcap is not None and not _FLOAT32.tiny <= _number("softcap", softcap) <= _FLOAT32.max:  # the kernels' float32
        raise ValueError(f"softcap must be None or a positive number in float32's normal range; got {softcap!r}")
    options = Options(weight, operator.index(ignore_index), reduction, float(z_loss), bool(return_lse),
                      float(label_smoothing) if label_smoothing > 0 else 0.0, float(softcap or 0.0))
    return DEFAULTS if weight is None and options[1:] == DEFAULTS[1:] else options


def check_weight(weight, logits):
    """The class weights as the kernels read them, or PyTorch's error: C of the logits' dtype."""
    cols = logits.shape[1]
    if weight.dim() != 1 or weight.shape[0] != cols:
        raise RuntimeError(f"weight tensor should be defined either for all {cols} classes or no classes but got "
                         f"weight tensor of shape: {list(weight.shape)}")
    if weight.dtype != logits.dtype:
        raise RuntimeError(f"expected scalar type {logits.dtype} but found {weight.dtype} (weight)")
    if weight.device != logits.device:
        raise RuntimeError(f"weight is on {weight.device}, the logits on {logits.device}")
    return weight.contiguous()


def check_no_weight_grad(weight):
    """PyTorch's error where class weights require grad: no cross-entropy differentiates them."""
    if weight is not None and weight.requires_grad and torch.is_grad_enabled():
        raise RuntimeError("the derivative for 'weight' is not implemented")


def check_inplace_over(logits):
    """PyTorch's refusal of an in-place write, for a gradient written over logits that are a leaf
    requiring grad, or a view of one."""
    if (logits if logits._base is None else logits._base).is_leaf:
        raise RuntimeError("inplace=True would write the gradient over a leaf that requires grad (or a view of "
                           "one), as PyTorch refuses in-place operations on them")


def wide_dtype(dtype):
    """The dtype sums and row statistics are kept in: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_targets_from_env():
    return os.environ.get("CROSS_ENTROPY_CHECK_TARGETS", "0") not in ("", "0")


def samples_shape(shape):
    """The shape of a loss per sample position of logits of `shape`: (N, d1, ..., dk) of (N, C, d1,
    ..., dk), (N,) of (N, C), () of (C,). The class-index targets' shape."""
    return shape[:1] + shape[2:] if len(shape) > 1 else ()


def check_inputs(logits, targets):
    """PyTorch's checks, with clearer messages and PyTorch's exception types (ValueError for batch
    sizes that differ, IndexError for logits with no classes, RuntimeError for the rest; TypeError for
    what is not a tensor), and the refusals of what only the kernels do not take (other devices and
    dtypes: RuntimeError). Returns whether the targets are class probabilities."""
    # Each tensor attribute is read once or twice: this runs on every call, ahead of the launch.
    if not isinstance(logits, torch.Tensor) or not isinstance(targets, torch.Tensor):
        raise TypeError("cross_entropy expects two tensors: logits and targets")
    if logits.dtype not in DTYPE_CODES:
        raise RuntimeError(f"the kernels take float32, bfloat16 or float16 logits; got {logits.dtype}")
    probs = targets.dtype.is_floating_point
    if probs and targets.dtype not in DTYPE_CODES:
        raise RuntimeError(f"the kernels take float32, bfloat16 or float16 class-probability targets; "
                           f"got {targets.dtype}")
    if not probs and targets.dtype not in TARGET_DTYPES:
        raise RuntimeError(f"the kernels take int64 or int32 class-index targets; got {targets.dtype}")
    shape, target_shape = logits.shape, targets.shape
    if not shape:
        raise RuntimeError("logits must have shape (C,), (N, C) or (N, C, d1, ..., dk); got a 0-dim tensor")
    if probs and target_shape != shape:
        raise RuntimeError(f"class-probability targets must have the logits' shape {tuple(shape)}; "
                           f"got {tuple(target_shape)}")
    if not probs and target_shape != samples_shape(shape):
        if len(shape) > 1 and len(target_shape) == len(shape) - 1 and target_shape[0] != shape[0]:
            raise ValueError(f"batch sizes differ: logits have {shape[0]} samples, targets {target_shape[0]}")
        raise RuntimeError(f"class-index targets must have shape {tuple(samples_shape(shape))} for logits "
                           f"{tuple(shape)}; got {tuple(target_shape)}")
    cols = shape[1] if len(shape) > 1 else shape[0]
    if cols == 0:
        raise IndexError("logits have no classes (C = 0): every target is out of bounds")
    if cols > MAX_SEG * SEG_SLAB:
        raise RuntimeError(f"logits have {cols} classes; the kernels take at most {MAX_SEG * SEG_SLAB}")
    if not (logits.is_cuda and targets.is_cuda):
        raise RuntimeError(f"the kernels take CUDA tensors; got logits on {logits.device} and targets on "
                           f"{targets.device}")
    if logits.get_device() != targets.get_device():
        raise RuntimeError(f"logits and targets are on different devices: {logits.device} and {targets.device}")
    return probs


def first_bad_target(targets, cols, ignore_index):
    """Raises IndexError (PyTorch's) naming the first row whose target is outside [0, C) and not ignore_index,
    comparing in 64 bits as the kernels do (an int32 tensor against a wider int would wrap it)."""
    targets = targets.long()
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= cols))
    if bool(bad.any()):
        row = int(bad.reshape(-1).nonzero()[0, 0])
        raise IndexError(f"targets[{row}] = {int(targets.reshape(-1)[row])} is outside [0, {cols}) "
                         f"and is not the ignore index {ignore_index}")


def as_rows(logits, targets=None, probs=False):
    """The logits and targets as the kernels read them: (logits, targets, class_stride, rows,
    result_dtype). Logits (C,) are one row; (N, C, d1, ..., dk) are N * d1 * ... * dk, a row per
    sample position, whose classes lie class_stride = d1 * ... * dk elements apart where they are
    not contiguous (_positions); rows of (N, C) or (C,) have adjacent columns. The targets follow the
    logits' rows; probability targets in the promoted dtype (PyTorch's: float32 for two different
    ones), the result's. targets None: the logits' rows alone (None in the targets' place)."""
    shape = logits.shape
    class_stride = 1
    if len(shape) == 1:
        logits = logits.unsqueeze(0)
    elif len(shape) > 2:
        logits, class_stride = _positions(logits)
    if class_stride == 1 and logits.stride(1) != 1 and logits.shape[1] > 1:
        logits = logits.contiguous()  # the kernels stream along rows; columns must be adjacent
    rows = logits.shape[0] if class_stride == 1 else shape[0] * class_stride
    result_dtype = logits.dtype
    if targets is None:
        return logits, None, class_stride, rows, result_dtype
    if len(shape) == 1:
        targets = targets.unsqueeze(0)
    elif len(shape) > 2 and not probs:
        targets = targets.reshape(-1)
    elif len(shape) > 2:  # probabilities in the logits' layout: channels last, or contiguous
        targets = targets.movedim(1, -1).reshape(-1, shape[1]) if class_stride == 1 else targets.contiguous()
    if probs:
        if targets.dtype != logits.dtype:
            targets, result_dtype = targets.float(), torch.float32
        if class_stride == 1 and targets.stride(1) != 1 and logits.shape[1] > 1:
            targets = targets.contiguous()
    return logits, targets, class_stride, rows, result_dtype


def _positions(logits):
    """Logits (N, C, d1, ..., dk) as rows of sample positions, in the order of the targets
    (N, d1, ..., dk), and the classes' stride: a view (N * d1 * ... * dk, C) where each position's
    classes are contiguous (channels last), stride 1, else the contiguous logits, whose classes lie
    d1 * ... * dk apart."""
    last = logits.movedim(1, -1)
    if last.is_contiguous():
        return last.reshape(-1, logits.shape[1]), 1
    return logits.contiguous(), math.prod(logits.shape[2:])


class Rows(NamedTuple):
    """A call's tensors as the kernels read them (prepare)."""
    logits: torch.Tensor     # (rows, C) of adjacent classes, or the contiguous (N, C, d1, ..., dk) (class_stride > 1)
    targets: torch.Tensor    # a class index a row, or probabilities laid out as the logits
    probs: bool              # class-probability targets
    class_stride: int        # elements from a class to the next
    rows: int                # sample positions
    cols: int                # classes
    result_dtype: torch.dtype  # the loss's: the logits', the promoted one of probabilities, or float32 (float32_loss)
    weight: Optional[torch.Tensor]  # the class weights, checked (check_weight)
    original: torch.Tensor   # the logits as given
    device: int              # their CUDA device's index


def prepare(logits, targets, options):
    """A call's logits, targets and class weights checked, with PyTorch's errors, and laid out as the
    kernels read them."""
    probs = check_inputs(logits, targets)
    original = logits
    logits, targets, class_stride, rows, result_dtype = as_rows(logits, targets, probs)
    if options.float32_loss:
        result_dtype = torch.float32
    if probs and options.ignore_index >= 0:
        raise RuntimeError("ignore_index is not supported for class-probability targets")
    weight = options.weight
    if weight is not None:
        weight = check_weight(weight, logits)
    cols = logits.shape[1]
    if (options.label_smoothing or options.softcap or probs or class_stride > 1) and cols > MAX_SEG:
        raise RuntimeError(f"label smoothing, softcap, probability targets and inputs (N, C, d1, ..., dk) take at most "
                         f"{MAX_SEG} classes; got {cols}")
    return Rows(logits, targets, probs, class_stride, rows, cols, result_dtype, weight, original, logits.get_device())
