"""The dispatch: a call's launch in four steps, plan (the policy's, cached per problem: plan_on),
allocate, pack (the parameter block) and launch, and the three forwards built from them: the loss
alone (forward), a training step's loss with every row's (m, s) for its gradient (train_forward), and
the training node's, C++ from the launch to the backward (node_forward).

KernelBench's timing starts before the call and ends after the kernel, with an L2 flush of about 90 us
queued ahead of both: host work that outlasts the flush shows in the time ("Build and host time"). So
the dispatch reads each tensor attribute once, plans once per problem, and asks torch for the raw
stream handle."""
import functools
import math
from typing import NamedTuple, Optional

import torch

from .build import default_extension, device_gpu, options_extension
from .constants import CLASS_INDICES, DTYPE_CODES, FUSED, MAX_SEG, REDUCTIONS
from .inputs import DEFAULTS, first_bad_target, prepare, samples_shape
from .params import PARAMS_STRUCT, workspace_layout
from .policy import gradient_plan, plan_launch

_workspaces = {}  # (device index, stream) -> int32 tensor whose counters and exact sum are back at zero

# The current stream's handle as an integer: torch's raw accessor is far cheaper than
# torch.cuda.current_stream(device).cuda_stream; the public spelling where a torch lacks it.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream(device_index):
    return _raw_stream(device_index) if _raw_stream else torch.cuda.current_stream(device_index).cuda_stream


def _workspace(device_index, stream, nbytes):
    """Scratch for one launch: per stream, so concurrent streams never share a counter."""
    key = (device_index, stream)
    ws = _workspaces.get(key)
    if ws is not None and ws.numel() * 4 >= nbytes:
        return ws
    # Zeroed once here; every launch leaves its counters at zero again. Inside graph capture the
    # zeroing becomes part of the graph, and the buffer lives only as long as the graph needs it.
    ws = torch.zeros(-(-nbytes // 4), dtype=torch.int32, device=device_index)
    if not torch.cuda.is_current_stream_capturing():
        _workspaces[key] = ws
    return ws


@functools.lru_cache(maxsize=1024)
def plan_on(device_index, rows, cols, row_stride, elem_bytes, offset, weighted=False, smoothed=False, probs=False,
            class_stride=1, capped=False, fuse=False):
    """plan_launch on GPU device_index, cached: the host's time per call shows in KernelBench's timing.
    A test that changes the policy clears it."""
    return plan_launch(rows, cols, row_stride, elem_bytes, device_gpu(device_index), offset, weighted, smoothed, probs,
                       class_stride, capped, fuse)


def plan_rows(rows, options, fuse=False):
    """The launch plan of a call's rows (inputs.prepare's) with its options; `fuse`: the logits alone
    require grad, and the fused family may take them."""
    x = rows.logits
    return plan_on(rows.device, rows.rows, rows.cols, x.stride(0), x.element_size(), x.data_ptr() % 16,
                   rows.weight is not None, options.label_smoothing != 0, rows.probs, rows.class_stride,
                   options.softcap != 0, fuse)


def empty_gradient(logits, dtype):
    """A gradient of the logits' shape in the layout the kernel writes, which the backward's fake
    declares too: channels last where the logits are (inputs.as_rows reads those as rows in place),
    else contiguous."""
    shape = logits.shape
    if len(shape) > 2 and logits.movedim(1, -1).is_contiguous():
        return torch.empty(shape[:1] + shape[2:] + shape[1:2], dtype=dtype, device=logits.device).movedim(-1, 1)
    return torch.empty(shape, dtype=dtype, device=logits.device)


class Outputs(NamedTuple):
    """What a launch writes besides its workspace (allocate)."""
    out: Optional[torch.Tensor] = None    # the loss, or reduction none's a row
    state: Optional[torch.Tensor] = None  # every row's (m, s): rows x 2 float32, the gradient's input
    dx: Optional[torch.Tensor] = None     # the fused family's gradient for an incoming 1
    scale: Optional[torch.Tensor] = None  # ... and the mean's 1 / divisor it used
    weight_total: Optional[torch.Tensor] = None  # ... and the class weights' sum, where label smoothing reads it


_NOTHING = Outputs()  # a launch whose outputs the training node allocates


def allocate(rows, plan, options, keep_state, inplace=False):
    """The launch's outputs: the loss (a row's for reduction none, which the kernel writes instead of
    the result, in float32: _launch rounds it to the result's dtype), every row's (m, s) where kept, and for the fused family its gradient (`inplace`: the
    logits themselves) with the mean's scale and the weights' sum it reads."""
    device = rows.logits.device
    none = options.reduction == "none"
    out = torch.empty((rows.rows,) if none else (), dtype=torch.float32 if none else rows.result_dtype, device=device)
    state = torch.empty((rows.rows, 2), dtype=torch.float32, device=device) if keep_state else None
    if plan.family != FUSED:
        return Outputs(out, state)
    dx = rows.original if inplace else empty_gradient(rows.original, rows.logits.dtype)
    scale = torch.empty((), dtype=torch.float32, device=device) if options.reduction == "mean" else None
    weight = rows.weight
    weight_total = weight.sum(dtype=torch.float32) if weight is not None and options.label_smoothing else None
    return Outputs(out, state, dx, scale, weight_total)


def workspace(rows, plan, stream):
    """The launch's scratch (params.workspace_layout), zero where it counts. The caller holds it until
    the launch: inside graph capture it is not cached, and a buffer freed there would be handed to the
    next allocation of the capture."""
    return _workspace(rows.device, stream, workspace_layout(plan, rows.rows)[3])


def pack(rows, plan, options, outputs, stream, ws):
    """The launch's parameter block, on `stream` with the workspace `ws`: every field of params.PARAMS
    in its order, each named beside its value (tests/test_boundary.py holds the names to PARAMS). Packed
    from positions: matching some fifty keywords took a third of the dispatch's host time ("Build and host
    time")."""
    x, targets, probs, weight, cols = rows.logits, rows.targets, rows.probs, rows.weight, rows.cols
    smoothing, softcap, none = options.label_smoothing, options.softcap, options.reduction == "none"
    exact_off, weight_off, seg_off, _ = workspace_layout(plan, rows.rows)
    base = ws.data_ptr()
    out, state, dx, scale, weight_total = outputs
    out_ptr = 0 if out is None else out.data_ptr()
    return PARAMS_STRUCT.pack(
        x.data_ptr(),                                      # logits
        0 if probs else targets.data_ptr(),                # targets
        out_ptr,                                           # out
        base,                                              # counter
        base + 8,                                          # ignored_rows
        base + exact_off,                                  # exact
        base + seg_off,                                    # seg_partials
        rows.rows,                                         # rows
        cols,                                              # cols
        x.stride(0),                                       # row_stride
        targets.stride(0) if rows.rows and not probs else 1,  # target_stride
        rows.rows * plan.splits,                           # items
        plan.chunks,                                       # chunks
        plan.splits,                                       # splits
        plan.seg_len,                                      # seg_len
        plan.group,                                        # group
        plan.rounds,                                       # chunk_rounds
        plan.tile_rows,                                    # tile_rows
        targets.element_size(),                            # target_bytes
        plan.family,                                       # family
        plan.sweeps,                                       # sweeps
        plan.batch_rows,                                   # batch_rows
        DTYPE_CODES[x.dtype],                              # dtype
        plan.grid,                                         # grid
        rows.device,                                       # device
        plan.lead_256,                                     # lead_256
        plan.evict_first,                                  # evict_first
        stream,                                            # stream
        options.ignore_index,                              # ignore_index
        REDUCTIONS[options.reduction],                     # reduction
        options.float32_loss,                              # float32_out
        out_ptr if none else 0,                            # losses
        0 if weight is None else weight.data_ptr(),        # weight
        base + weight_off,                                 # weight_exact
        0 if state is None else state.data_ptr(),          # row_state
        options.z_loss,                                    # z_loss
        smoothing,                                         # label_smoothing
        smoothing / cols,                                  # smoothing_per_class
        targets.data_ptr() if probs else 0,                # probs
        targets.stride(0) if probs else 0,                 # probs_stride
        rows.class_stride,                                 # class_stride
        DTYPE_CODES[targets.dtype] if probs else CLASS_INDICES,  # probs_dtype
        softcap,                                           # softcap
        2 / math.log(2) / softcap if softcap else 0.0,     # softcap_rate
        0 if dx is None else dx.data_ptr(),                # grad
        cols,                                              # grad_row_stride
        0 if scale is None else scale.data_ptr(),          # grad_out
        0,                                                 # grad_lse
        0 if weight_total is None else weight_total.data_ptr(),  # weight_total
        0,                                                 # grad_probs
        0,                                                 # grad_in
    )


def _launch(rows, plan, options, check_targets, keep_state, inplace=False):
    """From the plan to the launch, for forward and train_forward: the targets checked where asked (a host
    synchronization), the outputs allocated, the block packed and launched, in the default build where
    the call is KernelBench's problem (its defaults, no state kept), else in the options build."""
    if check_targets and not rows.probs:
        first_bad_target(rows.targets, rows.cols, options.ignore_index)
    stream = current_stream(rows.device)
    ws = workspace(rows, plan, stream)
    outputs = allocate(rows, plan, options, keep_state, inplace)
    block = pack(rows, plan, options, outputs, stream, ws)
    default = options is DEFAULTS and not keep_state and not rows.probs and rows.class_stride == 1
    (default_extension() if default else options_extension()).launch(block)
    out = outputs.out
    if options.reduction == "none":  # per row: in the result's dtype, in the samples' shape
        out = out.to(rows.result_dtype)
        if len(rows.original.shape) != 2:
            out = out.reshape(samples_shape(rows.original.shape))
    return out, outputs


def lse(state, shape):
    """Every row's log-sum-exp, m + log s, from the rows' (m, s), in the samples' shape (of logits of
    `shape`): the kernels store the pair, which the gradient reads, and not the sum. Its gradient
    reaches m's column alone, which the backward reads as the log-sum-exp's: s's is not formed."""
    return (state[:, 0] + state[:, 1].detach().log()).reshape(samples_shape(shape))


def forward(logits, targets, options, check_targets=False):
    """The loss of a call that does not train, and (options.return_lse) every row's log-sum-exp."""
    rows = prepare(logits, targets, options)
    out, outputs = _launch(rows, plan_rows(rows, options), options, check_targets, options.return_lse)
    return (out, lse(outputs.state, rows.original.shape)) if options.return_lse else out


class Written(NamedTuple):
    """A training forward's gradient for an incoming 1: dx (inplace: the logits themselves) and the
    mean's 1 / divisor it used (scale: None for the sum and none)."""
    dx: torch.Tensor
    scale: Optional[torch.Tensor]


def _check_trains(rows):
    if rows.cols > MAX_SEG:
        raise RuntimeError(f"the gradient takes at most {MAX_SEG} classes; got {rows.cols}")


def train_forward(logits, targets, options, check_targets=False, fuse=False, inplace=False):
    """(loss, state, written) of a loss that trains: state every row's (m, s), rows x 2 float32 (the
    gradient's input, and the log-sum-exp's: lse); where `fuse` (the logits alone require grad) and the
    fused family takes the problem, written (Written) the gradient it wrote for an incoming 1 (`inplace`:
    over the logits, which must be where the kernels read them), else None."""
    rows = prepare(logits, targets, options)
    _check_trains(rows)
    if inplace and rows.logits.data_ptr() != rows.original.data_ptr():
        raise RuntimeError("inplace=True writes the gradient where the kernels read the logits; these were copied "
                         "first (their classes are not adjacent, nor the contiguous (N, C, d1, ..., dk)): "
                         "give them contiguous, or leave inplace off")
    if inplace and rows.rows > 1 and rows.class_stride == 1 and rows.logits.stride(0) < rows.cols:
        raise RuntimeError("inplace=True: the logits' rows overlap in memory (an expanded tensor, or a view with a "
                           "row stride under C), so more than one element would write a single memory location: "
                           "clone() them first, or leave inplace off")
    out, outputs = _launch(rows, plan_rows(rows, options, fuse), options, check_targets, True, inplace)
    return out, outputs.state, None if outputs.dx is None else Written(outputs.dx, outputs.scale)


def node_forward(logits, targets, options, check_targets=False):
    """(loss, state) of a loss whose logits alone train, with the loss's gradient as the training node's
    (csrc/training_node.cpp), which allocates them, where the fused family reads the logits in place;
    else None, and nothing launched (the caller takes the autograd.Function, which checks the targets)."""
    rows = prepare(logits, targets, options)
    _check_trains(rows)
    plan = plan_rows(rows, options, fuse=True)
    if plan.family != FUSED or rows.logits.data_ptr() != rows.original.data_ptr():
        return None
    if check_targets:
        first_bad_target(rows.targets, rows.cols, options.ignore_index)
    stream = current_stream(rows.device)
    ws = workspace(rows, plan, stream)
    block = pack(rows, plan, options, _NOTHING, stream, ws)
    backward = gradient_plan(rows.rows, rows.cols, rows.logits.element_size(), device_gpu(rows.device), 1)
    loss_shape = samples_shape(rows.original.shape) if options.reduction == "none" else ()
    return options_extension().fused_loss(rows.original, rows.targets, rows.weight, block, backward.group,
                                          backward.grid, loss_shape)
