"""The launches of a vocabulary split across ranks (crossent.parallel; csrc/families/split.cuh): each
row's two numbers over a rank's classes, before the all-gather (split_terms), and every rank's merged
into the loss, after it (split_merge). A thread a row, a few small launches in place of the forty row
operations that PyTorch's would take, whose host time outlasted the kernels' reads."""
from typing import NamedTuple, Optional

import torch

from .build import options_extension
from .constants import DTYPE_CODES, REDUCTIONS, SPLIT_MERGE, SPLIT_TERMS
from .dispatch import current_stream, workspace
from .params import NO_PARAMS, PARAMS_STRUCT, softcap_rate, workspace_layout
from .policy import split_grid


def _launch(family, device, stream, rows, **fields):
    params = NO_PARAMS._replace(family=family, rows=rows, grid=split_grid(rows), device=device, stream=stream, **fields)
    options_extension().launch(PARAMS_STRUCT.pack(*params))


def split_terms(x, t, state, class_start, classes, options):
    """Every row's (lse_r, u_r) over this rank's classes, rows x 2 float32: x, its logits (rows x
    cols, any strides); t, the rows' targets among all `classes`, from `class_start` on here; state,
    the rows' (m, s) over the rank's classes (dispatch.row_state), None where it holds none. u_r leaves
    out label smoothing's sum over the classes, which the caller adds. Both launches read the class
    weights of all V classes from the first (the gradient's, from the slice's first column)."""
    rows, cols = x.shape
    terms = torch.empty((rows, 2), dtype=torch.float32, device=x.device)
    if rows:
        weight = options.weight
        device = x.get_device()
        _launch(SPLIT_TERMS, device, current_stream(device), rows, cols=cols, dtype=DTYPE_CODES[x.dtype],
                logits=x.data_ptr(), row_stride=x.stride(0), class_stride=x.stride(1), targets=t.data_ptr(),
                target_stride=t.stride(0), target_bytes=t.element_size(), ignore_index=options.ignore_index,
                weight=0 if weight is None else weight.data_ptr(), row_state=0 if state is None else state.data_ptr(),
                label_smoothing=options.label_smoothing, softcap=options.softcap,
                softcap_rate=softcap_rate(options.softcap), class_start=class_start, classes=classes,
                terms=terms.data_ptr())
    return terms


class Merged(NamedTuple):
    """The merge's: the loss (reduction none's a row, in float32), every row's lse and (lse, 1), the
    gradient family's row state, and the mean's 1 / divisor."""
    loss: torch.Tensor
    lse: torch.Tensor
    state: torch.Tensor
    scale: Optional[torch.Tensor]


def split_merge(gathered, t, classes, ranks, options, dtype):
    """Every rank's terms (gathered: ranks x rows x 2 float32, split_terms' of each) merged into each
    row's lse and the loss, the same bits on every rank: the loss in the logits' `dtype` (float32
    where options.float32_loss; reduction none's in float32), whose class weights the kernel reads."""
    rows = t.shape[0]
    device = t.device
    none, mean = options.reduction == "none", options.reduction == "mean"
    weight, smoothing = options.weight, options.label_smoothing
    loss = torch.empty((rows,) if none else (), dtype=torch.float32 if none or options.float32_loss else dtype,
                       device=device)
    lse = torch.empty((rows,), dtype=torch.float32, device=device)
    state = torch.empty((rows, 2), dtype=torch.float32, device=device)
    scale = torch.empty((), dtype=torch.float32, device=device) if mean else None
    weight_total = weight.sum(dtype=torch.float32) if weight is not None and smoothing else None
    exact_off, weight_off, _, _, nbytes = workspace_layout(1, rows)
    index = device.index
    stream = current_stream(index)
    ws = workspace(index, stream, nbytes)  # held until the launch
    base = ws.data_ptr()
    _launch(SPLIT_MERGE, index, stream, rows, dtype=DTYPE_CODES[dtype], targets=t.data_ptr(), target_stride=t.stride(0),
            target_bytes=t.element_size(), ignore_index=options.ignore_index, reduction=REDUCTIONS[options.reduction],
            float32_out=options.float32_loss, weight=0 if weight is None else weight.data_ptr(),
            weight_total=0 if weight_total is None else weight_total.data_ptr(), label_smoothing=smoothing,
            smoothing_per_class=smoothing / classes, z_loss=options.z_loss, cols=classes, ranks=ranks,
            terms=gathered.data_ptr(), lse=lse.data_ptr(), row_state=state.data_ptr(),
            losses=loss.data_ptr() if none else 0, out=0 if none else loss.data_ptr(),
            grad_out=0 if scale is None else scale.data_ptr(), counter=base, ignored_rows=base + 8,
            exact=base + exact_off, weight_exact=base + weight_off)
    return Merged(loss, lse, state, scale)
