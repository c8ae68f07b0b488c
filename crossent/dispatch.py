"""The dispatch: a call's launch in four steps, its problem (worked out by a problem's first call and
kept: call), allocate, pack (the call's fields between the problem's) and launch, and the forwards
built from them: the loss alone (forward), every row's (m, s) alone (row_state), a training step's
loss with every row's (m, s) for its gradient (train_forward), and the training node's, C++ from the
launch to the backward (node_forward).

KernelBench's timing starts before the call and ends after the kernel, with an L2 flush of about 90 us
queued ahead of both: host work that outlasts the flush shows in the time ("Build and host time"). So
everything a call does that its data does not change (the checks, the layout, the plan, most of the
parameter block) is done once per problem: a later call of the same shapes, strides, dtypes, device
and options reads a dict, allocates its result and packs its data pointers."""
from typing import NamedTuple, Optional

import torch

from .build import default_extension, device_gpu, options_extension
from .constants import CLASS_INDICES, DTYPE_CODES, FUSED, MAX_SEG, REDUCTIONS
from .inputs import DEFAULTS, Options, first_bad_target, prepare, samples_shape
from .params import CALL_PARTS, PROBLEM_PARTS, softcap_rate, workspace_layout
from .policy import Plan, gradient_plan, plan_launch, weight_phase_bytes

_workspaces = {}  # (device index, stream) -> int32 tensor whose counters and exact sum are back at zero

# The current stream's handle as an integer: torch's raw accessor is far cheaper than
# torch.cuda.current_stream(device).cuda_stream; the public spelling where a torch lacks it.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream(device_index):
    return _raw_stream(device_index) if _raw_stream else torch.cuda.current_stream(device_index).cuda_stream


def workspace(device_index, stream, nbytes):
    """Scratch for one launch: per stream, so concurrent streams never share a counter. The caller holds
    it until the launch: inside graph capture it is not cached, and a buffer freed there would be handed
    to the next allocation of the capture."""
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


def plan_on(device_index, rows, cols, row_stride, elem_bytes, offset, weighted=False, smoothed=False, probs=False,
            class_stride=1, capped=False, fuse=False):
    """plan_launch on GPU device_index."""
    return plan_launch(rows, cols, row_stride, elem_bytes, device_gpu(device_index), offset, weighted, smoothed, probs,
                       class_stride, capped, fuse)


def plan_rows(rows, options, fuse=False):
    """The launch plan of a call's rows (inputs.prepare's) with its options; `fuse`: the logits alone
    require grad, and the fused family may take them."""
    x = rows.logits
    return plan_on(rows.device, rows.rows, rows.cols, x.stride(0), x.element_size(), x.data_ptr() % 16,
                   rows.weight is not None, options.label_smoothing != 0, rows.probs, rows.class_stride,
                   options.softcap != 0, fuse)


class Problem(NamedTuple):
    """What every call of one problem shares, worked out by its first call (call): the launch plan and
    the parameter block's fields that hold no data pointer, with what allocating and packing read."""
    plan: Plan
    fields: tuple            # the block's two parts that hold no data pointer (problem_fields)
    rows: int                # sample positions
    cols: int                # classes
    row_stride: int          # the logits' rows as the kernels read them: elements from one to the next
    class_stride: int        # elements from a class to the next
    probs: bool              # class-probability targets
    device: int              # the CUDA device's index
    result_dtype: torch.dtype
    per_row: bool            # reduction none: the kernel writes a loss a row (losses) where out points
    samples_shape: tuple     # ... whose shape is the sample positions'
    workspace: tuple         # params.workspace_layout: byte offsets of its parts, and its bytes
    default: bool            # KernelBench's problem, which the default build launches where no state is kept
    gradient: Optional[Plan]  # the training node's backward: the gradient family's plan of these rows


_problems = {}  # problem_key -> Problem
_MOST_PROBLEMS = 1024  # then forgotten, all at once


def problem_key(logits, targets, options, fuse):
    """What tells one problem from another: every property of the tensors that a check, the layout or the
    plan reads (the logits' and the class weights' offsets from the 16-byte grid included), the options
    but the class weights' values, and whether the fused family may take the logits."""
    weight = options.weight
    if weight is not None:
        options = (options._replace(weight=None), weight.shape, weight.stride(), weight.dtype, weight.device,
                   weight.data_ptr() % 16)
    return (logits.shape, logits.stride(), logits.dtype, logits.device, logits.data_ptr() % 16, targets.shape,
            targets.stride(), targets.dtype, targets.device, options, fuse)


def forget_problems():
    """Drops every problem worked out, so that the next calls plan anew (for a test that changes the
    policy)."""
    _problems.clear()


def call(logits, targets, options, fuse=False):
    """(problem, x, targets, weight) of a call: its Problem, and the logits, targets and class weights
    where the kernels read them. A problem's first call checks the tensors (with PyTorch's errors), lays
    them out (inputs.prepare) and plans; where that layout is the tensors as given (no copy), the problem
    is kept, and its later calls hand the tensors on as they are."""
    tensors = isinstance(logits, torch.Tensor) and isinstance(targets, torch.Tensor)  # else prepare says what is wrong
    key = problem_key(logits, targets, options, fuse) if tensors else None
    problem = _problems.get(key)
    if problem is not None:
        return problem, logits, targets, options.weight
    with torch.no_grad():  # a copy the layout makes is the kernels' to read, not a step of the graph
        rows = prepare(logits, targets, options)
    problem = _work_out(rows, options, fuse)
    weight = options.weight
    if key is not None and rows.logits.data_ptr() == logits.data_ptr() and rows.targets.data_ptr() == \
            targets.data_ptr() and (weight is None or rows.weight.data_ptr() == weight.data_ptr()):
        if len(_problems) >= _MOST_PROBLEMS:
            _problems.clear()
        _problems[key] = problem
    return problem, rows.logits, rows.targets, rows.weight


def _work_out(rows, options, fuse):
    """The Problem of a call's rows (inputs.prepare's) with its options."""
    plan = plan_rows(rows, options, fuse)
    x = rows.logits
    gradient = None
    if fuse and plan.family == FUSED:
        gradient = gradient_plan(rows.rows, rows.cols, x.element_size(), device_gpu(rows.device), 1)
    default = options.weight is None and options[1:] == DEFAULTS[1:] and not rows.probs and rows.class_stride == 1
    phase_bytes = 0  # the class weights' shifted copies, where rows read the weights a vector at a time
    if rows.weight is not None and (rows.probs or options.label_smoothing):
        phase_bytes = weight_phase_bytes(plan, rows.rows, rows.cols, x.stride(0), x.element_size(), rows.class_stride,
                                         (x.data_ptr() - rows.weight.data_ptr()) % 16)
    return Problem(plan, problem_fields(rows, plan, options), rows.rows, rows.cols, x.stride(0), rows.class_stride,
                   rows.probs, rows.device, rows.result_dtype, options.reduction == "none",
                   samples_shape(rows.original.shape), workspace_layout(plan.splits, rows.rows, phase_bytes), default,
                   gradient)


def problem_fields(rows, plan, options):
    """The parameter block's parts that hold no data pointer (params.PROBLEM_PARTS'), each field named
    beside its value: with the call's parts (pack), every field of params.PARAMS in its order
    (tests/test_boundary.py holds the names to PARAMS)."""
    x, targets, probs, cols = rows.logits, rows.targets, rows.probs, rows.cols
    smoothing, softcap = options.label_smoothing, options.softcap
    return PROBLEM_PARTS[0].pack(
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
    ), PROBLEM_PARTS[1].pack(
        options.ignore_index,                              # ignore_index
        REDUCTIONS[options.reduction],                     # reduction
        options.float32_loss,                              # float32_out
        options.z_loss,                                    # z_loss
        smoothing,                                         # label_smoothing
        smoothing / cols,                                  # smoothing_per_class
        targets.stride(0) if probs else 0,                 # probs_stride
        rows.class_stride,                                 # class_stride
        DTYPE_CODES[targets.dtype] if probs else CLASS_INDICES,  # probs_dtype
        DTYPE_CODES[torch.float32],                        # grad_dtype
        softcap,                                           # softcap
        softcap_rate(softcap),                             # softcap_rate
        cols,                                              # grad_row_stride
        0,                                                 # class_start
        0,                                                 # classes
        0,                                                 # ranks
    )


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


def allocate(problem, logits, weight, options, keep_state, inplace=False):
    """The launch's outputs: the loss (a row's for reduction none, which the kernel writes instead of
    the result, in float32: _launch rounds it to the result's dtype), every row's (m, s) where kept,
    and for the fused family its gradient (`inplace`: the logits themselves) with the mean's scale and
    the weights' sum it reads."""
    device = logits.device
    none = problem.per_row
    out = torch.empty((problem.rows,) if none else (), dtype=torch.float32 if none else problem.result_dtype,
                      device=device)
    state = torch.empty((problem.rows, 2), dtype=torch.float32, device=device) if keep_state else None
    if problem.plan.family != FUSED:
        return Outputs(out, state)
    dx = logits if inplace else empty_gradient(logits, logits.dtype)
    scale = torch.empty((), dtype=torch.float32, device=device) if options.reduction == "mean" else None
    weight_total = weight.sum(dtype=torch.float32) if weight is not None and options.label_smoothing else None
    return Outputs(out, state, dx, scale, weight_total)


def pack(problem, x, targets, weight, outputs, stream, ws):
    """The launch's parameter block: the call's parts (params.CALL_PARTS': its data pointers, on
    `stream` with the workspace `ws`), each field named beside its value, between the problem's. Packed
    from positions: matching some fifty keywords took a third of the dispatch's host time ("Build and host
    time")."""
    exact_off, weight_off, seg_off, phase_off, nbytes = problem.workspace
    base = ws.data_ptr()
    probs = problem.probs
    out, state, dx, scale, weight_total = outputs
    out_ptr = 0 if out is None else out.data_ptr()
    first, second = problem.fields
    return CALL_PARTS[0].pack(
        x.data_ptr(),                                      # logits
        0 if probs else targets.data_ptr(),                # targets
        out_ptr,                                           # out
        base,                                              # counter
        base + 8,                                          # ignored_rows
        base + exact_off,                                  # exact
        base + seg_off,                                    # seg_partials
    ) + first + CALL_PARTS[1].pack(
        stream,                                            # stream
        out_ptr if problem.per_row else 0,                 # losses
        0 if weight is None else weight.data_ptr(),        # weight
        base + phase_off if nbytes > phase_off else 0,     # weight_phases
        base + weight_off,                                 # weight_exact
        0 if state is None else state.data_ptr(),          # row_state
        targets.data_ptr() if probs else 0,                # probs
        0 if dx is None else dx.data_ptr(),                # grad
        0 if scale is None else scale.data_ptr(),          # grad_out
        0,                                                 # grad_scale
        0,                                                 # grad_lse
        0 if weight_total is None else weight_total.data_ptr(),  # weight_total
        0,                                                 # grad_probs
        0,                                                 # grad_in
        0,                                                 # terms
        0,                                                 # lse
    ) + second


def _launch(problem, logits, x, targets, weight, options, check_targets, keep_state, inplace=False):
    """From the problem to the launch, for forward and train_forward: the targets checked where asked (a
    host synchronization), the outputs allocated, the block packed and launched, in the default build
    where the call is KernelBench's problem (its defaults, no state kept), else in the options build."""
    if check_targets and not problem.probs:
        first_bad_target(targets, problem.cols, options.ignore_index)
    stream = current_stream(problem.device)
    ws = workspace(problem.device, stream, problem.workspace[-1])
    outputs = allocate(problem, logits, weight, options, keep_state, inplace)
    block = pack(problem, x, targets, weight, outputs, stream, ws)
    (default_extension() if problem.default and not keep_state else options_extension()).launch(block)
    out = outputs.out
    if problem.per_row:  # in the result's dtype, in the samples' shape
        out = out.to(problem.result_dtype)
        if len(logits.shape) != 2:
            out = out.reshape(problem.samples_shape)
    return out, outputs


def lse(state, shape):
    """Every row's log-sum-exp, m + log s, from the rows' (m, s), in the samples' shape (of logits of
    `shape`): the kernels store the pair, which the gradient reads, and not the sum. Its gradient
    reaches m's column alone, which the backward reads as the log-sum-exp's: s's is not formed."""
    return (state[:, 0] + state[:, 1].detach().log()).reshape(samples_shape(shape))


def forward(logits, targets, options, check_targets=False):
    """The loss of a call that does not train, and (options.return_lse) every row's log-sum-exp."""
    problem, x, t, weight = call(logits, targets, options)
    out, outputs = _launch(problem, logits, x, t, weight, options, check_targets, options.return_lse)
    return (out, lse(outputs.state, logits.shape)) if options.return_lse else out


def row_state(logits, targets, options):
    """Every row's (m, s) over the logits as options.softcap reads them, rows x 2 float32, by the
    loss's launch with no other option: it keeps every row's whatever its target. A split vocabulary's
    (crossent.split), whose targets lie among all its classes: the loss of them as given is not read."""
    lse_only = Options(ignore_index=options.ignore_index, reduction="sum", return_lse=True, softcap=options.softcap)
    problem, x, t, weight = call(logits, targets, lse_only)
    return _launch(problem, logits, x, t, weight, lse_only, False, True)[1].state


class Written(NamedTuple):
    """A training forward's gradient for an incoming 1: dx (inplace: the logits themselves) and the
    mean's 1 / divisor it used (scale: None for the sum and none)."""
    dx: torch.Tensor
    scale: Optional[torch.Tensor]


def _check_trains(problem):
    if problem.cols > MAX_SEG:
        raise RuntimeError(f"the gradient takes at most {MAX_SEG} classes; got {problem.cols}")


def train_forward(logits, targets, options, check_targets=False, fuse=False, inplace=False, called=None):
    """(loss, state, written) of a loss that trains: state every row's (m, s), rows x 2 float32 (the
    gradient's input, and the log-sum-exp's: lse); where `fuse` (the logits alone require grad) and the
    fused family takes the problem, written (Written) the gradient it wrote for an incoming 1 (`inplace`:
    over the logits, which must be where the kernels read them), else None. called: the call's (call's
    result, with this `fuse`) where the caller has it already."""
    problem, x, t, weight = called or call(logits, targets, options, fuse)
    _check_trains(problem)
    if inplace and x.data_ptr() != logits.data_ptr():
        raise RuntimeError("inplace=True writes the gradient where the kernels read the logits; these were copied "
                         "first (their classes are not adjacent, nor the contiguous (N, C, d1, ..., dk)): "
                         "give them contiguous, or leave inplace off")
    if inplace and problem.rows > 1 and problem.class_stride == 1 and problem.row_stride < problem.cols:
        raise RuntimeError("inplace=True: the logits' rows overlap in memory (an expanded tensor, or a view with a "
                           "row stride under C), so more than one element would write a single memory location: "
                           "clone() them first, or leave inplace off")
    out, outputs = _launch(problem, logits, x, t, weight, options, check_targets, True, inplace)
    return out, outputs.state, None if outputs.dx is None else Written(outputs.dx, outputs.scale)


def node_forward(logits, called, options, check_targets=False):
    """(loss, state) of a loss whose logits alone train, with the loss's gradient as the training node's
    (csrc/training_node.cpp), which allocates them, where the fused family reads the logits in place;
    else None, and nothing launched (the caller takes the autograd.Function, which checks the targets).
    called: the call's (call's result, fuse=True)."""
    problem, x, t, weight = called
    _check_trains(problem)
    if problem.gradient is None or x.data_ptr() != logits.data_ptr():
        return None
    if check_targets:
        first_bad_target(t, problem.cols, options.ignore_index)
    stream = current_stream(problem.device)
    ws = workspace(problem.device, stream, problem.workspace[-1])
    block = pack(problem, x, t, weight, _NOTHING, stream, ws)
    loss_shape = problem.samples_shape if problem.per_row else ()
    return options_extension().fused_loss(logits, t, weight, block, problem.gradient.group, problem.gradient.grid,
                                          loss_shape)
