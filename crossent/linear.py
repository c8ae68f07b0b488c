"""Linear + cross-entropy: the loss of the logits x W^T + b, which never exist for every row at once.

The rows go in chunks. For each, one matmul makes the chunk's logits; the loss launch reads them
and writes their gradient over them, for an incoming 1 of the sum (one launch where the fused family
takes them); then dx = G W and dW += G^T x, in float32 (and db += the sum of G's rows). So a training
step runs its three matmuls once each, and adds to its gradients one chunk's logits and the float32
accumulators. The backward scales the accumulators by the incoming gradient over the mean's
divisor, rounding each gradient once, to its parameter's dtype.

Where each row's incoming gradient is its own (reduction "none") or the log-sum-exp may receive one
(return_lse), the forward keeps every row's (m, s) and nothing else, and the backward makes each
chunk's logits again (a fourth matmul) and their gradient from (m, s).

A chunk's loss is the kernels' where they take its logits (api.kernels_take), else PyTorch's
operations' (CPU, float64), with their gradient by torch.func.vjp: the loop is the same. The forward
and the backward are custom operators, eager calls and torch.compile's alike (the matmuls dominate:
the operator's host cost does not show); torch.compile traces the unchunked composition where the
kernels do not take the logits (torch.func.vjp does not run inside a compiled graph's operator)."""
import operator
from functools import partial
from typing import Callable, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

from .api import kernels_take, routed_loss
from .composite import composite_loss
from .dispatch import train_forward
from .gradient import cross_entropy_backward, mean_divisor, round_scaled, unit_gradient_over
from .inputs import Options, check_no_weight_grad, check_options, check_targets_from_env, wide_dtype
from .ops import OP_NAMESPACE

CHUNK_BYTES = 1 << 30  # a chunk's logits at most, where the caller names no chunk_size ("Chunks")
# torch's float32 result of 16-bit operands (mm's and addmm's out_dtype), on CUDA from torch 2.8
_MATMUL_OUT_DTYPE = torch.torch_version.TorchVersion(torch.__version__) >= (2, 8)


def chunk_rows(rows, classes, elem_bytes, chunk_size=None):
    """Rows per chunk: chunk_size where the caller names it, else as many as keep a chunk's logits
    (rows x classes of elem_bytes) within CHUNK_BYTES, and at least one."""
    if chunk_size is not None:
        if isinstance(chunk_size, bool) or not hasattr(chunk_size, "__index__") or operator.index(chunk_size) < 1:
            raise ValueError(f"chunk_size must be a positive number of rows; got {chunk_size!r}")
        return operator.index(chunk_size)
    return max(1, min(rows, CHUNK_BYTES // max(1, classes * elem_bytes)))


class Step(NamedTuple):
    """How a call goes: whether the forward writes the gradients (fused: the reduction is one number
    and no lse is returned), which gradients are wanted, where the logits' rows are cut, and who
    computes a chunk's loss."""
    fused: bool
    dx: bool            # d loss / d input wanted
    dw: bool            # d loss / d linear_weight wanted
    db: bool            # d loss / d linear_bias wanted
    chunk: int          # rows per chunk
    check_targets: bool
    kernels: bool       # the kernels compute each chunk's loss (api.kernels_take), else PyTorch's operations


class ChunkLoss(NamedTuple):
    """A chunk's loss over its logits z (rows x classes), as the loop asks for it three ways; each
    writes a gradient over z, which it owns. sum_options and row_options have the reduction "sum" or
    "none", the loss in float32 (float64 for float64 logits), no lse. This module's own (local_loss)
    sees every class; crossent.parallel's sees a rank's slice of them."""
    sum_and_gradient: Callable  # (z, t, sum_options): the chunk's loss; its gradient for an incoming 1 over z
    losses_and_state: Callable  # (z, t, row_options): (loss a row, (m, s) a row); z left as it is
    gradient: Callable          # (grad, grad_lse, z, t, state, row_options): the rows' gradient over z
    # (rows of dx, float32 or float64): their sum over the ranks begun, in place, as a work to wait on;
    # None: one rank
    reduce_dx: Optional[Callable] = None


def local_loss(step: Step):
    """The chunk loss over every class: the kernels' where they take the step, else PyTorch's
    operations'."""
    both = dict(kernels=step.kernels, check_targets=step.check_targets)
    return ChunkLoss(partial(_loss_and_gradient, **both), partial(_losses_and_state, **both),
                     partial(_gradient, kernels=step.kernels))


# The local chunk loss: the kernels' or PyTorch's operations'.

def _loss_and_gradient(z, t, sum_options, kernels, check_targets):
    """The chunk's loss (the sum), and its gradient for an incoming 1 written over z."""
    if kernels:
        loss, state, written = train_forward(z, t, sum_options, check_targets, fuse=True, inplace=True)
        unit_gradient_over(z, t, loss, state, sum_options, written)
        return loss
    loss, gradient_of = torch.func.vjp(lambda logits: composite_loss(logits, t, sum_options), z)
    z.copy_(gradient_of(torch.ones_like(loss))[0])
    return loss


def _losses_and_state(z, t, row_options, kernels, check_targets):
    """(loss a row, (m, s) a row) of the chunk; z is left as it is."""
    if kernels:
        losses, state, _ = train_forward(z, t, row_options, check_targets)
        return losses, state
    losses, lse = composite_loss(z, t, row_options._replace(return_lse=True))
    return losses, torch.stack((lse, torch.ones_like(lse)), 1)  # m = lse, s = 1


def _gradient(grad, grad_lse, z, t, state, row_options, kernels):
    """The chunk's gradient for the incoming gradients of its rows' losses (grad) and log-sum-exps
    (grad_lse, or None), written over z."""
    if kernels:
        cross_entropy_backward(grad, grad_lse, z, t, state, row_options, into=z)
        return
    lse_options = row_options._replace(return_lse=True)
    (losses, lse), gradient_of = torch.func.vjp(lambda logits: composite_loss(logits, t, lse_options), z)
    grad_lse = torch.zeros_like(lse) if grad_lse is None else grad_lse.to(lse.dtype)
    z.copy_(gradient_of((grad.to(losses.dtype), grad_lse))[0])


def _matmul_into(out, a, b, accumulate):
    """out (+)= a @ b, in out's dtype: in the matmul's epilogue where out has a and b's dtype, or
    torch takes a float32 result of 16-bit operands (CUDA, torch 2.8 on); else the product in a and
    b's dtype, then added."""
    if a.dtype == out.dtype:
        return out.addmm_(a, b) if accumulate else torch.mm(a, b, out=out)
    if _MATMUL_OUT_DTYPE and out.is_cuda:
        if accumulate:
            return torch.addmm(out, a, b, out_dtype=out.dtype, out=out)
        return torch.mm(a, b, out_dtype=out.dtype, out=out)
    product = torch.mm(a, b)
    return out.add_(product) if accumulate else out.copy_(product)


def _rounded(total, factor, like, kernels):
    """total (a float32 or float64 sum) times factor (one a row, or one), rounded once into a tensor
    like `like`: by the kernels' launch where they take the step (PyTorch's multiply into another
    dtype takes its loop without vectors), else by PyTorch's."""
    out = torch.empty_like(like)
    if kernels and out.is_contiguous():
        return round_scaled(total, factor, out)
    return torch.mul(total, factor.reshape(-1, *[1] * (total.dim() - 1)) if factor.dim() else factor, out=out)


def _logits(x, w, b):
    return torch.mm(x, w.t()) if b is None else torch.addmm(b, x, w.t())


def _made_shapes(x, w, step: Step):
    """The shapes of forward_op's state, dx, dw and db: (0,) where the step does not make one."""
    fused = step.fused
    wanted = (not fused, fused and step.dx, fused and step.dw, fused and step.db)
    return [shape if made else (0,) for made, shape in zip(wanted, ((x.shape[0], 2), x.shape, w.shape, w.shape[:1]))]


def forward_chunks(x, w, b, t, options: Options, step: Step, chunks: Optional[ChunkLoss] = None):
    """(loss, state, dx, dw, db) of x (N, D), w (V, D), b (V,) or None, targets t (N,): the loss as
    options ask; state every row's (m, s) where the step is not fused (else empty); where fused, the
    wanted gradients of the sum, unscaled, in float32 (float64 for float64 inputs), else empty.
    chunks: each chunk's loss (local_loss(step) where None)."""
    rows = x.shape[0]
    wide = wide_dtype(x.dtype)
    chunk_loss = chunks or local_loss(step)
    sum_options = options._replace(reduction="sum", return_lse=False, float32_loss=True)
    row_options = options._replace(reduction="none", return_lse=False, float32_loss=True)
    state_shape, dx_shape, dw_shape, db_shape = _made_shapes(x, w, step)
    total = torch.zeros((), dtype=wide, device=x.device)
    losses = torch.empty(0 if step.fused else rows, dtype=wide, device=x.device)
    state, dx = (torch.empty(shape, dtype=wide, device=x.device) for shape in (state_shape, dx_shape))
    # The first chunk writes dw (and db adds to zeros); with no rows, none does.
    dw = (torch.empty if rows else torch.zeros)(dw_shape, dtype=wide, device=x.device)
    db = torch.zeros(db_shape, dtype=wide, device=x.device)
    pending = []  # dx's sums over the ranks, begun
    for start in range(0, rows, step.chunk):
        end = min(rows, start + step.chunk)
        xc, tc = x[start:end], t[start:end]
        z = _logits(xc, w, b)
        if step.fused:
            total += chunk_loss.sum_and_gradient(z, tc, sum_options)
            if step.dx:
                _matmul_into(dx[start:end], z, w, False)
                if chunk_loss.reduce_dx:  # summed over the ranks while dW's matmul runs
                    pending.append(chunk_loss.reduce_dx(dx[start:end]))
            if step.dw:
                _matmul_into(dw, z.t(), xc, start > 0)
            if step.db:
                db += z.sum(0, dtype=wide)
        else:
            losses[start:end], state[start:end] = chunk_loss.losses_and_state(z, tc, row_options)
        del z  # before the next chunk's logits: one chunk's at a time
    for work in pending:
        work.wait()
    if not step.fused:
        total = losses.sum()
    dtype = torch.float32 if options.float32_loss else x.dtype
    if options.reduction == "none":
        loss = losses.to(dtype)
    elif options.reduction == "sum":
        loss = total.to(dtype)
    else:
        loss = (total / mean_divisor(t, options.weight, options.ignore_index, wide)).to(dtype)
    return loss, state, dx, dw, db


def backward_chunks(grad, grad_lse, x, w, b, t, state, dx, dw, db, options: Options, step: Step,
                    chunks: Optional[ChunkLoss] = None):
    """(d loss / d x, d loss / d w, d loss / d b), each None where the step does not want it: grad, the
    loss's incoming gradient; grad_lse, the log-sum-exps' (or None). Where the step is fused, the
    forward's accumulators (dx, dw, db) times grad over the mean's divisor, the ignored rows' dx 0;
    else each chunk's logits made again and their gradient from the rows' (m, s) (state), by the
    forward's chunk loss (chunks)."""
    counted = t.long() != options.ignore_index
    scale = grad.to(wide_dtype(x.dtype))
    if options.reduction == "mean":
        scale = scale / mean_divisor(t, options.weight, options.ignore_index, scale.dtype)
    wanted = step.dx, step.dw, step.db
    if step.fused:
        # An ignored row's gradient is 0 and no other row's reaches it, whatever the scale (inf where
        # no row counts, the mean's 0 / 0); dw and db are sums over the rows: 0 where none counts.
        any_row = torch.where(counted.any(), scale, 0)
        factors = torch.where(counted, scale, 0), any_row, any_row
        return tuple(_rounded(total, factor, like, step.kernels) if want else None
                     for total, factor, like, want in zip((dx, dw, db), factors, (x, w, b), wanted))
    rows, chunk_loss = x.shape[0], chunks or local_loss(step)
    row_options = options._replace(reduction="none", return_lse=False, float32_loss=True)
    per_row = scale if options.reduction == "none" else scale.expand(rows)
    wide = wide_dtype(x.dtype)
    reduce_dx = chunk_loss.reduce_dx
    # dx in its dtype, or where ranks sum it, in float32 (float64) first: rounded once, after the sum
    dx_out = torch.empty(x.shape, dtype=wide if reduce_dx else x.dtype, device=x.device) if wanted[0] else None
    pending = []
    dw_acc = (torch.empty if rows else torch.zeros)(w.shape, dtype=wide, device=x.device) if wanted[1] else None
    db_acc = torch.zeros(w.shape[0], dtype=wide, device=x.device) if wanted[2] else None
    for start in range(0, rows, step.chunk):
        end = min(rows, start + step.chunk)
        xc, tc = x[start:end], t[start:end]
        z = _logits(xc, w, b)
        chunk_loss.gradient(per_row[start:end], None if grad_lse is None else grad_lse[start:end], z, tc,
                            state[start:end], row_options)
        if wanted[0]:
            _matmul_into(dx_out[start:end], z, w, False)
            if reduce_dx:
                pending.append(reduce_dx(dx_out[start:end]))
        if wanted[1]:
            _matmul_into(dw_acc, z.t(), xc, start > 0)
        if wanted[2]:
            db_acc += z.sum(0, dtype=wide)
        del z
    for work in pending:
        work.wait()
    if reduce_dx and wanted[0]:
        dx_out = dx_out.to(x.dtype)
    return dx_out, None if dw_acc is None else dw_acc.to(w.dtype), None if db_acc is None else db_acc.to(b.dtype)


def _flat(options: Options, step: Step):
    """The options (but the class weights, a tensor of their own) and the step, as the operators'
    schemas take them."""
    return (options.ignore_index, options.reduction, options.label_smoothing, options.z_loss, options.softcap,
            options.float32_loss, *step)


def _rebuilt(weight, ignore_index, reduction, label_smoothing, z_loss, softcap, float32_loss, *step):
    return Options(weight, ignore_index, reduction, z_loss, False, label_smoothing, softcap, float32_loss), Step(*step)


def _op_forward(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], t: torch.Tensor,
                weight: Optional[torch.Tensor], ignore_index: int, reduction: str, label_smoothing: float,
                z_loss: float, softcap: float, float32_loss: bool, fused: bool, dx: bool, dw: bool, db: bool,
                chunk: int, check_targets: bool, kernels: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                         torch.Tensor, torch.Tensor]:
    options, step = _rebuilt(weight, ignore_index, reduction, label_smoothing, z_loss, softcap, float32_loss, fused,
                             dx, dw, db, chunk, check_targets, kernels)
    with torch.autocast(x.device.type, enabled=False):  # the caller cast the operands
        return forward_chunks(x, w, b, t, options, step)


def _op_backward(grad: torch.Tensor, grad_lse: Optional[torch.Tensor], x: torch.Tensor, w: torch.Tensor,
                 b: Optional[torch.Tensor], t: torch.Tensor, state: torch.Tensor, dx: torch.Tensor, dw: torch.Tensor,
                 db: torch.Tensor, weight: Optional[torch.Tensor], ignore_index: int, reduction: str,
                 label_smoothing: float, z_loss: float, softcap: float, float32_loss: bool, fused: bool, dx_wanted: bool,
                 dw_wanted: bool, db_wanted: bool, chunk: int, check_targets: bool,
                 kernels: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    options, step = _rebuilt(weight, ignore_index, reduction, label_smoothing, z_loss, softcap, float32_loss, fused,
                             dx_wanted, dw_wanted, db_wanted, chunk, check_targets, kernels)
    with torch.autocast(x.device.type, enabled=False):
        grads = backward_chunks(grad, grad_lse, x, w, b, t, state, dx, dw, db, options, step)
    return tuple(g if g is not None else x.new_empty(0) for g in grads)


forward_op = torch.library.custom_op(f"{OP_NAMESPACE}::linear_cross_entropy", _op_forward, mutates_args=())
backward_op = torch.library.custom_op(f"{OP_NAMESPACE}::linear_cross_entropy_backward", _op_backward,
                                      mutates_args=())


@forward_op.register_fake
def _forward_shapes(x, w, b, t, weight, *flat):
    options, step = _rebuilt(weight, *flat)
    loss = x.new_empty((x.shape[0],) if options.reduction == "none" else (),
                       dtype=torch.float32 if options.float32_loss else x.dtype)
    return (loss, *(x.new_empty(shape, dtype=wide_dtype(x.dtype)) for shape in _made_shapes(x, w, step)))


@backward_op.register_fake
def _backward_shapes(grad, grad_lse, x, w, b, t, state, dx, dw, db, weight, *flat):
    _, step = _rebuilt(weight, *flat)
    return (torch.empty_like(x) if step.dx else x.new_empty(0), torch.empty_like(w) if step.dw else x.new_empty(0),
            torch.empty_like(b) if step.db else x.new_empty(0))


def _setup_context(ctx, inputs, output):
    x, w, b, t, weight, *flat = inputs
    ctx.save_for_backward(x, w, b, t, weight, *output[1:])
    ctx.flat = flat
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None


def backward_inputs(step: Step, needs_input_grad, grad, grad_state, t, options: Options):
    """What backward_chunks takes from autograd's call: the step wanting the gradients autograd asks
    for, the loss's incoming gradient (zeros where none reached it) and the lse's (None where the step
    is fused, whose forward returned no lse)."""
    if torch.is_grad_enabled():
        raise RuntimeError("linear_cross_entropy's gradient has no gradient of its own: double backward "
                           "(create_graph=True through the loss) is not supported")
    step = step._replace(dx=bool(needs_input_grad[0]), dw=bool(needs_input_grad[1]), db=bool(needs_input_grad[2]))
    if grad is None:
        grad = torch.zeros(t.shape if options.reduction == "none" else (), dtype=torch.float32, device=t.device)
    return step, grad, None if grad_state is None or step.fused else grad_state[:, 0]


def _op_gradients(ctx, grad, grad_state, *_):
    x, w, b, t, weight, state, dx, dw, db = ctx.saved_tensors
    options, step = _rebuilt(weight, *ctx.flat)
    step, grad, grad_lse = backward_inputs(step, ctx.needs_input_grad, grad, grad_state, t, options)
    grads = backward_op(grad, grad_lse, x, w, b, t, state, dx, dw, db, weight, *_flat(options, step))
    wanted = step.dx, step.dw, step.db
    return *(g if n else None for g, n in zip(grads, wanted)), *[None] * (len(ctx.flat) + 2)


forward_op.register_autograd(_op_gradients, setup_context=_setup_context)


def autocast_operands(x, w, b):
    """The operands as autocast casts a linear layer's where it is on for their device (float64 ones
    stay as they are), and whether the logits are then 16-bit: their loss is float32, as autocast's
    cross-entropy's."""
    device = x.device.type
    if not torch.is_autocast_enabled(device):
        return x, w, b, False
    dtype = torch.get_autocast_dtype(device)
    x, w, b = (a if a is None or a.dtype == torch.float64 else a.to(dtype) for a in (x, w, b))
    return x, w, b, x.dtype == dtype


def check_shapes(x, w, b, t):
    """PyTorch's errors for operands that do not fit: input (..., D), linear_weight (V, D), linear_bias
    (V,), targets (...) of class indices."""
    if not all(isinstance(a, torch.Tensor) for a in (x, w, t)) or not (b is None or isinstance(b, torch.Tensor)):
        raise TypeError("linear_cross_entropy expects tensors: input, linear_weight, target (and linear_bias)")
    if w.dim() != 2 or x.dim() < 1 or x.shape[-1] != w.shape[1]:
        raise RuntimeError(f"input (..., D) and linear_weight (V, D) do not fit: got {tuple(x.shape)} and "
                           f"{tuple(w.shape)}")
    if b is not None and tuple(b.shape) != (w.shape[0],):
        raise RuntimeError(f"linear_bias must have shape ({w.shape[0]},); got {tuple(b.shape)}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise RuntimeError(f"linear_cross_entropy takes class-index targets (integers); got {t.dtype}")
    if t.shape != x.shape[:-1]:
        raise ValueError(f"targets must have the input's shape but its last dimension, {tuple(x.shape[:-1])}; "
                         f"got {tuple(t.shape)}")


def plan_step(x, w, b, options: Options, classes, chunk_size, check_targets, kernels):
    """How a call on operands x (N, D), w, b (as cast) goes (Step): the gradients wanted, fused where
    the reduction is one number and no lse is returned, chunks of rows whose logits have `classes`
    columns (chunk_rows)."""
    needs = [torch.is_grad_enabled() and a is not None and a.requires_grad for a in (x, w, b)]
    fused = any(needs) and options.reduction != "none" and not options.return_lse
    return Step(fused, *needs, chunk_rows(x.shape[0], classes, x.element_size(), chunk_size), check_targets, kernels)


def lse_of(state):
    """Every row's log-sum-exp from the forward's row state (m, s)."""
    return state[:, 0] + state[:, 1].detach().log()


def linear_cross_entropy(input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor, *,
                         linear_bias: Optional[torch.Tensor] = None, weight: Optional[torch.Tensor] = None,
                         ignore_index: Optional[int] = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                         z_loss: float = 0.0, softcap: Optional[float] = None, return_lse: bool = False,
                         chunk_size: Optional[int] = None):
    """cross_entropy of the rows of F.linear(input, linear_weight, linear_bias), the classes last (for
    input (N, D), cross_entropy(F.linear(...), target, ...)), with the logits a chunk of rows at a
    time, never all at once: input (..., D), linear_weight (V, D), linear_bias (V,) or None, target
    (...) class indices; weight (class weights, V) and every other option as
    cross_entropy takes them (see there). The loss, the lse and the gradients of input, linear_weight
    and linear_bias are cross_entropy's of the linear layer's logits, to rounding: the weight's and
    the bias's summed over the chunks in float32 and rounded once (16-bit operands on the CPU, or
    with torch before 2.8: each chunk's product rounded to their dtype first). PyTorch's names
    (F.linear_cross_entropy in torch 2.13 and later).
    chunk_size: rows per chunk; None: as many as keep a chunk's logits within CHUNK_BYTES (1 GiB).
    With reduction "mean" or "sum" and no lse returned, the gradients are computed in the forward
    (three matmuls); with reduction "none" or return_lse, the backward makes the logits again
    (four). Under torch.autocast the operands are cast as autocast casts a linear layer's, and the
    loss is float32. No host synchronization; a custom operator, which torch.compile takes whole."""
    ignore_index = -100 if ignore_index is None else ignore_index  # torch 2.13's F.linear_cross_entropy's None
    options = check_options(weight, ignore_index, reduction, z_loss, return_lse, label_smoothing, softcap)
    return linear_loss(input, linear_weight, target, linear_bias, options, chunk_size)


def linear_loss(input, linear_weight, target, linear_bias, options: Options, chunk_size=None):
    """linear_cross_entropy of checked options (inputs.Options; float32_loss: a float32 loss from
    16-bit operands, as crossent.hf asks), for every public entry."""
    check_shapes(input, linear_weight, linear_bias, target)
    check_no_weight_grad(options.weight)
    x, w, b, autocast = autocast_operands(input, linear_weight, linear_bias)
    if autocast and not options.float32_loss:  # (_replace only where needed: torch 2.4's compiler cannot trace it)
        options = options._replace(float32_loss=True)
    if input.dim() == 1:  # one row, whose logits are the chunk
        return routed_loss(F.linear(input, linear_weight, linear_bias), target, options)
    kernels = kernels_take(x.new_empty((0, w.shape[0])), target, options)  # as each chunk's logits will be
    sample_shape = target.shape
    reduction, return_lse = options.reduction, options.return_lse
    x, t = x.flatten(0, -2), target.reshape(-1)
    if torch.compiler.is_compiling() and not kernels:
        # A compiled call the kernels do not take, traced unchunked: torch.func.vjp, the composition's
        # gradient, does not run inside a compiled graph's operator.
        out = routed_loss(F.linear(input.flatten(0, -2), linear_weight, linear_bias), t, options)
        loss, lse = out if return_lse else (out, None)
    else:  # the operators take no return_lse (_flat): the lse is m + log s of the rows' state
        step = plan_step(x, w, b, options, w.shape[0], chunk_size, check_targets_from_env(), kernels)
        loss, state, *_ = forward_op(x, w, b, t, options.weight, *_flat(options, step))
        lse = lse_of(state) if return_lse else None
    if reduction == "none":
        loss = loss.reshape(sample_shape)
    return (loss, lse.reshape(sample_shape)) if return_lse else loss


class LinearCrossEntropyLoss(torch.nn.Module):
    """linear_cross_entropy as a module: the loss's options (cross_entropy's, and chunk_size) at
    construction, forward(input, linear_weight, target, linear_bias=None). The class weights are a
    buffer, moved with the module."""

    def __init__(self, weight: Optional[torch.Tensor] = None, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0, *, z_loss: float = 0.0, softcap: Optional[float] = None,
                 return_lse: bool = False, chunk_size: Optional[int] = None):
        super().__init__()
        check_options(weight, ignore_index, reduction, z_loss, return_lse, label_smoothing, softcap)
        chunk_rows(1, 1, 1, chunk_size)  # its error now, not at the first call
        self.register_buffer("weight", weight)
        self.ignore_index, self.reduction, self.label_smoothing = ignore_index, reduction, label_smoothing
        self.z_loss, self.softcap, self.return_lse, self.chunk_size = z_loss, softcap, return_lse, chunk_size

    def forward(self, input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor,
                linear_bias: Optional[torch.Tensor] = None):
        return linear_cross_entropy(input, linear_weight, target, linear_bias=linear_bias, weight=self.weight,
                                    ignore_index=self.ignore_index, reduction=self.reduction,
                                    label_smoothing=self.label_smoothing, z_loss=self.z_loss, softcap=self.softcap,
                                    return_lse=self.return_lse, chunk_size=self.chunk_size)

    def extra_repr(self) -> str:
        extras = {"ignore_index": self.ignore_index != -100, "reduction": self.reduction != "mean",
                  "label_smoothing": self.label_smoothing, "z_loss": self.z_loss, "softcap": self.softcap,
                  "return_lse": self.return_lse, "chunk_size": self.chunk_size is not None}
        return ", ".join(f"{k}={getattr(self, k)}" for k, shown in extras.items() if shown)
