"""The backward's launches: d loss / d logits (and d loss / d probability targets) from every row's
(m, s), which the training forward saves, in one read of the logits and one write of the gradient
(the gradient family); a gradient written over the logits by the forward, scaled in place for an
incoming gradient other than 1 (the scale family); and a float32 sum scaled into its own dtype,
rounded once (the round family)."""

import torch

from .build import device_gpu, options_extension
from .constants import CLASS_INDICES, DTYPE_CODES, GRADIENT, REDUCTIONS, ROUND, SCALE
from .dispatch import Written, current_stream, empty_gradient
from .inputs import as_rows
from .params import NO_PARAMS, PARAMS_STRUCT, softcap_rate
from .policy import gradient_plan, round_grid


def cross_entropy_backward(grad, grad_lse, logits, targets, state, options, probs_grad=False, written=None,
                           into=None, split=None, scale=None):
    """(d loss / d logits, d loss / d targets or None): grad, the loss's incoming gradient (its
    shape); grad_lse, the log-sum-exp's (or None); state, the forward's (m, s) a row; probs_grad: also
    the probability targets' gradient; written: the fused forward's gradient (dispatch.Written), whose
    rows stand where grad is 1 and no grad_lse reaches them; into: where to write d loss / d logits,
    the logits themselves (each element is read before it is written, by the same thread). split:
    (start, V) where the logits' columns are the classes [start, start + C) of a vocabulary of V split
    across ranks (crossent.parallel): class-index targets among all V, the class weights all V's.
    scale: the mean's 1 / divisor on the device where the caller has it (a split merge's)."""
    probs = targets.dtype.is_floating_point
    target_dtype = targets.dtype
    x, t, class_stride, rows, _ = as_rows(logits, targets, probs)
    cols = x.shape[1]
    dx = written.dx if written else into if into is not None else empty_gradient(logits, x.dtype)
    dq = empty_gradient(logits, t.dtype) if probs and probs_grad else None

    weight, smoothing, softcap = options.weight, options.label_smoothing, options.softcap
    weight = weight.contiguous() if weight is not None else None
    weight_total = weight.sum(dtype=torch.float32) if weight is not None and smoothing and not probs else None
    class_start, classes = split or (0, 0)  # the kernel reads the weights from the first column's
    grad_in = grad_out = grad.reshape(-1).contiguous()  # as given: the kernel reads its dtype
    if options.reduction == "mean" and scale is None:  # over the mean's divisor on the device: no synchronization
        if written:
            scale = written.scale  # the fused forward's 1 / divisor, which the kernel multiplies by
        else:
            grad_out = grad_in.float() / (rows if probs else mean_divisor(t, weight, options.ignore_index))
    grad_lse = grad_lse.reshape(-1).float().contiguous() if grad_lse is not None else None
    _launch_on_rows(
        GRADIENT, x, rows, class_stride, logits=x.data_ptr(), targets=0 if probs else t.data_ptr(),
        row_stride=x.stride(0), target_stride=t.stride(0) if rows and not probs else 1, target_bytes=t.element_size(),
        ignore_index=options.ignore_index, reduction=REDUCTIONS[options.reduction],
        weight=0 if weight is None else weight.data_ptr() + class_start * weight.element_size(),
        row_state=state.data_ptr(), z_loss=options.z_loss, label_smoothing=smoothing,
        smoothing_per_class=smoothing / (classes or cols), class_start=class_start, classes=classes,
        probs=t.data_ptr() if probs else 0, probs_stride=t.stride(0) if probs else 0,
        probs_dtype=DTYPE_CODES[t.dtype] if probs else CLASS_INDICES, softcap=softcap,
        softcap_rate=softcap_rate(softcap), grad=dx.data_ptr(),
        grad_row_stride=as_rows(dx)[0].stride(0), grad_out=grad_out.data_ptr(),
        grad_dtype=DTYPE_CODES[grad_out.dtype], grad_scale=0 if scale is None else scale.data_ptr(),
        grad_lse=0 if grad_lse is None else grad_lse.data_ptr(),
        weight_total=0 if weight_total is None else weight_total.data_ptr(),
        grad_probs=0 if dq is None else dq.data_ptr(), grad_in=grad_in.data_ptr() if written else 0)
    return dx, None if dq is None else dq.to(target_dtype)


def unit_gradient_over(logits, targets, loss, state, options, written):
    """The gradient for an incoming 1 of each loss, over the logits: the fused launch's (written,
    dispatch.Written), or where it wrote none, the gradient family's from the rows' (m, s), written
    there now."""
    if written is not None:
        return written
    ones = torch.ones(loss.shape, dtype=torch.float32, device=logits.device)
    dx, _ = cross_entropy_backward(ones, None, logits, targets, state, options, into=logits)
    return Written(dx, None)


def scale_in_place(dx, grad, reduction):
    """The gradient written over the logits (inplace) for an incoming 1, times the incoming `grad` on
    the device: every row where one grad serves them all and it is not 1, else each row whose own is
    not 1 (cross_entropy_scale_kernel)."""
    x, _, class_stride, rows, _ = as_rows(dx)
    grad_in = grad.reshape(-1).contiguous()  # as given: the kernel reads its dtype
    _launch_on_rows(SCALE, x, rows, class_stride, reduction=REDUCTIONS[reduction], grad=x.data_ptr(),
                    grad_row_stride=x.stride(0), grad_in=grad_in.data_ptr(), grad_dtype=DTYPE_CODES[grad_in.dtype])
    return dx


def round_scaled(total, factor, out):
    """out = total * factor, rounded once to out's dtype (cross_entropy_round_kernel): total, a
    contiguous float32 sum of out's shape; factor, float32 on the device, one for each of total's
    rows (its first dimension) or one for all of it. Returns out."""
    by_row = factor.numel() != 1
    if total.dtype != torch.float32 or factor.dtype != torch.float32 or total.shape != out.shape or \
            not (total.is_contiguous() and out.is_contiguous()) or (by_row and factor.numel() != total.shape[0]):
        raise ValueError("round_scaled: a contiguous float32 sum of out's shape, and float32 factors, one a row or "
                         f"one; got {total.dtype} {tuple(total.shape)}, {factor.dtype} {tuple(factor.shape)}, "
                         f"{tuple(out.shape)}")
    if not out.numel():
        return out
    index = total.get_device()
    rows, cols = (total.shape[0], total[0].numel()) if by_row else (1, total.numel())
    factor = factor.reshape(-1).contiguous()
    params = NO_PARAMS._replace(rows=rows, cols=cols, family=ROUND, dtype=DTYPE_CODES[out.dtype],
                                grid=round_grid(total.numel(), device_gpu(index)), device=index,
                                stream=current_stream(index), logits=total.data_ptr(), grad=out.data_ptr(),
                                grad_scale=factor.data_ptr(), reduction=REDUCTIONS["none" if by_row else "sum"])
    options_extension().launch(PARAMS_STRUCT.pack(*params))
    return out


def _launch_on_rows(family, x, rows, class_stride, **fields):
    """A launch of the gradient's plan (the gradient and scale families) over the logits' rows x
    (as_rows'), with the family's own fields; none where there is no row."""
    if not rows:
        return
    index = x.get_device()
    plan = gradient_plan(rows, x.shape[1], x.element_size(), device_gpu(index), class_stride)
    params = NO_PARAMS._replace(rows=rows, cols=x.shape[1], group=plan.group, family=family,
                                dtype=DTYPE_CODES[x.dtype], grid=plan.grid, device=index,
                                stream=current_stream(index), class_stride=class_stride, **fields)
    options_extension().launch(PARAMS_STRUCT.pack(*params))


def mean_divisor(targets, weight, ignore_index, dtype=torch.float32):
    """The mean's divisor for class indices (the rows counted, or their classes' weights summed in
    `dtype`), a 0-dim tensor on the device. Its sum of weights may differ from the forward's
    exact one in the last bit; the gradient is that close to the loss's."""
    counted = targets.long() != ignore_index  # in 64 bits, as the kernels compare
    if weight is None:
        return counted.sum()
    return torch.where(counted, weight[targets.clamp(0, weight.shape[0] - 1)], 0).sum(dtype=dtype)
