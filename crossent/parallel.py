"""The loss over a vocabulary split across ranks (a tensor-parallel language model's head): each rank
holds the logits of its slice of the classes, and every rank gets the loss over all of them, the
logits never gathered.

Each rank reduces its slice to two numbers a row: its log-sum-exp lse_r, and its part of the row's
linear term u_r, that is (1 - eps) w_t y_t where it holds the target, plus eps / V times the sum of
w_j y_j over its classes (y: the logits, capped where softcap asks; w: the class weights, 1 without;
eps: label smoothing). One all-gather brings every rank's two to every rank, which merges them by the
same operations on the same bits, so that every rank gets the same loss, run to run:

    lse = logsumexp_r lse_r,  u = sum_r u_r
    loss = a lse - u + z lse**2,  a = (1 - eps) w_t + eps / V * sum_j w_j

The backward needs no collective: a rank's gradient is its slice's, from the merged lse,

    d loss / d y_j = (a + 2 z lse) p_j - (1 - eps) w_t [j = t] - eps / V w_j,  p_j = exp(y_j - lse)

times each row's incoming gradient (and plus the lse's own, times p_j), times the cap's derivative.
On a GPU the kernels compute it all (crossent.split): the forward's launch every row's (m, s) over
the slice (one read), a launch its (lse_r, u_r) (a gather of the targets' logits; label smoothing's
sum over the slice is one more read, by PyTorch's operations), a launch the merge, and the gradient
family's the gradient (given the merged lse as each row's (m, s) = (lse, 1) and the slice's place
among the classes: one read, one write). Elsewhere (the CPU, float64) PyTorch's operations compute
the same a chunk of rows at a time, in float32 (float64 for float64 logits): the temporaries stay
within ROW_CHUNK_BYTES whatever the slice's size. inplace=True writes the gradient over the logits in
the forward, for an incoming 1, and the backward scales it.

vocab_parallel_linear_cross_entropy is linear_cross_entropy's loop over a rank's rows of the head
(W_r, V_r x D; the input the same on every rank), each chunk's loss this module's (slice_loss): its
all-gather, its slice's gradient G_r, and its rows of the input's gradient, G_r W_r, summed over the
ranks by an all-reduce begun beside the chunk's dW_r matmul."""
import math
from functools import partial
from typing import NamedTuple, Optional

import torch
import torch.distributed as dist

from .api import kernels_take
from .dispatch import row_state
from .gradient import cross_entropy_backward, scale_in_place
from .inputs import (check_inplace_over, check_no_weight_grad, check_options, check_targets_from_env,
                     first_bad_target, wide_dtype)
from .linear import (ChunkLoss, autocast_operands, backward_chunks, backward_inputs, check_shapes, forward_chunks,
                     lse_of, plan_step)
from .split import split_merge, split_terms

ROW_CHUNK_BYTES = 64 << 20  # the float32 temporaries of a chunk of rows at most (PyTorch's operations)
# torch 2.13 renamed the gather into one tensor; the old name warns there (neither: a torch without
# torch.distributed, where the loss says so)
_all_gather = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)


class Slice(NamedTuple):
    """Where a rank's logits lie among the classes, and with whom it shares the rest."""
    start: int       # the first class it holds
    vocab: int       # V, the classes of every rank together
    group: object    # the process group (None: the default one)


def _kernels_take(x, t, options):
    """Whether the kernels compute this rank's share: kernels_take's test, asked of a one-column
    stand-in where the rank holds no class, so that every rank merges by the same launch."""
    return kernels_take(x if x.shape[1] else x.new_empty((1, 1)), t, options) and not torch.compiler.is_compiling()


def _capped(x, softcap):
    """The logits as the loss reads them, in float32 (float64 for float64)."""
    y = x.to(wide_dtype(x.dtype))
    return softcap * torch.tanh(y / softcap) if softcap else y


def _chunks(rows, cols):
    step = max(1, ROW_CHUNK_BYTES // max(1, 4 * cols))
    return [(start, min(rows, start + step)) for start in range(0, rows, step)]


# ------------------------------------------------------------------ PyTorch's operations

class RowTerms(NamedTuple):
    """What each row's loss needs beside its lse and u, the same on every rank."""
    counted: torch.Tensor   # the target is not ignored
    local: torch.Tensor     # the target's column in this rank's slice, -1 where another rank holds it
    w_t: torch.Tensor       # the target's class weight (1 without weights)
    a: torch.Tensor         # the lse's coefficient, NaN where the target is outside [0, V)


def _row_terms(t, cols, shard, options, dtype):
    weight, eps = options.weight, options.label_smoothing
    counted = t != options.ignore_index
    inside = (t >= 0) & (t < shard.vocab)
    ours = counted & (t >= shard.start) & (t < shard.start + cols)
    local = torch.where(ours, t - shard.start, -1)
    if weight is None:
        w_t, total = torch.ones_like(t, dtype=dtype), shard.vocab
    else:
        w_t, total = weight.to(dtype)[t.clamp(0, shard.vocab - 1)], weight.sum(dtype=dtype)
    a = (1 - eps) * w_t + eps / shard.vocab * total
    a = torch.where(counted & ~inside, math.nan, a)
    return RowTerms(counted, local, w_t, a)


def _local_lse(x, options):
    """Every row's log-sum-exp over this rank's classes (-inf where it holds none), a chunk of rows at
    a time."""
    n, cols = x.shape
    lse = torch.full((n,), -math.inf, dtype=wide_dtype(x.dtype), device=x.device)
    for start, end in _chunks(n, cols) if cols else ():
        y = _capped(x[start:end], options.softcap)
        m = y.amax(1)
        shift = torch.where(m.isinf(), 0, m)  # a row of -inf (or +inf): no inf - inf
        lse[start:end] = shift + (y - shift[:, None]).exp().sum(1).log()
    return lse


def _smoothing_terms(x, shard, options):
    """Label smoothing's share of every row's u_r: eps / V times the sum of w_j y_j over this rank's
    classes (one read, a chunk of rows at a time), in float32 (float64 for float64 logits)."""
    n, cols = x.shape
    eps = options.label_smoothing
    u = torch.zeros((n,), dtype=wide_dtype(x.dtype), device=x.device)
    w_slice = None if options.weight is None else options.weight[shard.start:shard.start + cols].to(u.dtype)
    for start, end in _chunks(n, cols) if cols else ():
        y = _capped(x[start:end], options.softcap)
        u[start:end] = eps / shard.vocab * (y.sum(1) if w_slice is None else y @ w_slice)
    return u


def _linear_terms(x, shard, options, rows):
    """Every row's u_r over this rank's classes: the target's term where it holds it (a gather), and
    label smoothing's sum over its classes."""
    cols = x.shape[1]
    if not cols:
        return torch.zeros_like(rows.w_t)
    eps = options.label_smoothing
    y_t = _capped(x.gather(1, rows.local.clamp(min=0)[:, None])[:, 0], options.softcap)
    u = torch.where(rows.local >= 0, (1 - eps) * rows.w_t * y_t, 0)
    return u + _smoothing_terms(x, shard, options) if eps else u


def _merge(gathered):
    """(lse, u) of every row from every rank's (lse_r, u_r), ranks x rows x 2: the same operations on the
    same bits on every rank (a slice of -inf adds nothing, as torch.logsumexp takes it)."""
    return torch.logsumexp(gathered[:, :, 0], 0), gathered[:, :, 1].sum(0)


def _gather(terms, shard):
    """Every rank's terms (rows x 2 each), ranks x rows x 2: the forward's one collective."""
    world = dist.get_world_size(shard.group)
    gathered = torch.empty((world, *terms.shape), dtype=terms.dtype, device=terms.device)
    _all_gather(gathered.view(-1), terms.reshape(-1), group=shard.group)
    return gathered


def _composite_forward(x, t, shard, options):
    """(loss, lse, divisor, rows) by PyTorch's operations: the loss in float32 (float64 for float64
    logits), reduction none's a row, the mean's divisor, and the rows' RowTerms."""
    cols = x.shape[1]
    dtype = wide_dtype(x.dtype)
    rows = _row_terms(t, cols, shard, options, dtype)
    terms = torch.stack((_local_lse(x, options), _linear_terms(x, shard, options, rows)), 1)
    lse, u = _merge(_gather(terms, shard))
    per_row = rows.a * lse - u
    if options.z_loss:  # (not 0 * lse**2: inf past float32's range, and NaN)
        per_row = per_row + options.z_loss * lse**2
    loss = torch.where(rows.counted, per_row, 0)
    divisor = torch.where(rows.counted, rows.w_t, 0).sum()
    if options.reduction != "none":
        loss = loss.sum() if options.reduction == "sum" else loss.sum() / divisor
    return loss, lse, divisor, rows


def _gradient(x, lse, grad, grad_lse, divisor, shard, options, rows, inplace=False):
    """d loss / d x over this rank's classes by PyTorch's operations, written over x where `inplace`:
    grad, the loss's incoming gradient (its shape); grad_lse, the lse's (or None); divisor, the mean's;
    rows, the rows' RowTerms."""
    out = x if inplace else torch.empty_like(x)
    dtype = wide_dtype(x.dtype)
    eps, z, softcap = options.label_smoothing, options.z_loss, options.softcap
    n, cols = x.shape
    scale = grad.to(dtype)
    if options.reduction == "mean":
        scale = scale / divisor
    per_row = torch.where(rows.counted, scale.expand(n) if options.reduction != "none" else scale.reshape(n), 0)
    w_slice = None if options.weight is None else options.weight[shard.start:shard.start + cols].to(dtype)
    for start, end in _chunks(n, cols):
        y = _capped(x[start:end], softcap)
        g = per_row[start:end]
        p = (y - lse[start:end, None]).exp()
        coefficient = g * (rows.a[start:end] + 2 * z * lse[start:end])
        if grad_lse is not None:
            coefficient = coefficient + grad_lse[start:end].to(dtype)
        dy = coefficient[:, None] * p
        local = rows.local[start:end]  # the target's term where this rank holds it; no host synchronization
        target_term = torch.where(local >= 0, -(1 - eps) * g * rows.w_t[start:end], 0)
        if cols:
            dy.scatter_add_(1, local.clamp(min=0)[:, None], target_term[:, None])
        if eps:
            dy -= (eps / shard.vocab) * g[:, None] * (1 if w_slice is None else w_slice[None, :])
        if softcap:
            dy *= 1 - (y / softcap) ** 2
        out[start:end] = dy
    return out


# ------------------------------------------------------------------ the kernels

def _kernel_forward(x, t, shard, options):
    """split.Merged by the kernels (in the loss's dtype; reduction none's a row in float32)."""
    cols = x.shape[1]
    terms = split_terms(x, t, row_state(x, t, options) if cols else None, shard.start, shard.vocab, options)
    if options.label_smoothing and cols:
        terms[:, 1] += _smoothing_terms(x, shard, options)
    gathered = _gather(terms, shard)
    return split_merge(gathered, t, shard.vocab, gathered.shape[0], options, x.dtype)


def _kernel_gradient(x, t, state, scale, grad, grad_lse, shard, options, inplace=False):
    """d loss / d x over this rank's classes by the gradient family, from the merge's row state and
    the mean's 1 / divisor (scale), written over x where `inplace`."""
    if not x.shape[1]:
        return x if inplace else torch.empty_like(x)
    dx, _ = cross_entropy_backward(grad, grad_lse, x, t, state, options, into=x if inplace else None,
                                   split=(shard.start, shard.vocab), scale=scale)
    return dx


def _scale(x, grad, reduction, kernels):
    """The gradient written over the logits for an incoming 1, times the incoming `grad`, in place."""
    if kernels:
        return scale_in_place(x, grad, reduction) if x.numel() else x
    dtype = wide_dtype(x.dtype)
    g = grad.to(dtype).reshape(-1, 1) if reduction == "none" else grad.to(dtype)
    for start, end in _chunks(*x.shape):  # the product in float32, rounded once
        x[start:end] = x[start:end].to(dtype) * (g[start:end] if reduction == "none" else g)
    return x


class VocabParallelFunction(torch.autograd.Function):
    """The loss and every row's lse of a rank's slice, with their gradient. forward takes ctx itself.
    Saved for the backward beside the logits and targets: the kernels' row state and the mean's
    1 / divisor, or the lse and the mean's divisor."""
    @staticmethod
    def forward(ctx, x, t, shard, options, inplace):
        kernels = _kernels_take(x, t, options)
        if kernels:
            loss, lse, state, scale = _kernel_forward(x, t, shard, options)
            saved = (state, scale)
        else:
            loss, lse, divisor, rows = _composite_forward(x, t, shard, options)
            saved = (lse, divisor)
        ctx.inplace = inplace and ctx.needs_input_grad[0]
        if ctx.inplace:  # the gradient for an incoming 1 of the loss, over the logits
            ones = torch.ones(loss.shape, dtype=torch.float32, device=x.device)
            if kernels:
                _kernel_gradient(x, t, state, scale, ones, None, shard, options, inplace=True)
            else:
                _gradient(x, lse, ones, None, divisor, shard, options, rows, inplace=True)
            torch.autograd.graph.increment_version(x)
        ctx.save_for_backward(None if ctx.inplace else x, t, options.weight, *saved)
        ctx.x = x if ctx.inplace else None
        ctx.shard, ctx.options, ctx.kernels = shard, options._replace(weight=None), kernels
        ctx.set_materialize_grads(False)
        return loss.to(torch.float32 if options.float32_loss else x.dtype), lse

    @staticmethod
    def backward(ctx, grad, grad_lse):
        x, t, weight, first, second = ctx.saved_tensors
        options = ctx.options._replace(weight=weight)
        if grad is None:
            dtype = torch.float32 if ctx.kernels else first.dtype
            grad = torch.zeros(t.shape if options.reduction == "none" else (), dtype=dtype, device=t.device)
        if ctx.inplace:
            x, ctx.x = ctx.x, None
            if x is None:
                raise RuntimeError("inplace=True: the logits hold the first backward's gradient, and a second "
                                   "backward through the graph (retain_graph) needs the logits")
            if grad_lse is not None:
                raise RuntimeError("inplace=True wrote the gradient over the logits, and the lse's gradient needs "
                                   "them: leave inplace off where the returned lse reaches the result")
            return _scale(x, grad, options.reduction, ctx.kernels), None, None, None, None
        if ctx.kernels:
            dx = _kernel_gradient(x, t, first, second, grad, grad_lse, ctx.shard, options)
        else:
            rows = _row_terms(t, x.shape[1], ctx.shard, options, first.dtype)
            dx = _gradient(x, first, grad, grad_lse, second, ctx.shard, options, rows)
        return dx, None, None, None, None


# ------------------------------------------------------------------ a linear layer's slice

def _sum_and_unit_gradient(z, t, options, shard, kernels):
    """A chunk's loss summed over its rows (the same on every rank: one all-gather), and its slice's
    gradient for an incoming 1 written over z."""
    one = torch.ones((), dtype=torch.float32, device=z.device)
    if kernels:
        loss, _, state, scale = _kernel_forward(z, t, shard, options)
        _kernel_gradient(z, t, state, scale, one, None, shard, options, inplace=True)
    else:
        loss, lse, divisor, rows = _composite_forward(z, t, shard, options)
        _gradient(z, lse, one, None, divisor, shard, options, rows, inplace=True)
    return loss


def _losses_and_state(z, t, options, shard, kernels):
    """Every row's loss, and its (m, s) over all the classes as (lse, 1): the same on every rank."""
    if kernels:
        losses, _, state, _ = _kernel_forward(z, t, shard, options)
        return losses, state
    losses, lse, _, _ = _composite_forward(z, t, shard, options)
    return losses, torch.stack((lse, torch.ones_like(lse)), 1)


def _rows_gradient(grad, grad_lse, z, t, state, options, shard, kernels):
    """The slice's gradient for each row's incoming gradients, from its (lse, 1), written over z."""
    if kernels:
        _kernel_gradient(z, t, state, None, grad, grad_lse, shard, options, inplace=True)
    else:
        rows = _row_terms(t, z.shape[1], shard, options, state.dtype)
        _gradient(z, state[:, 0], grad, grad_lse, None, shard, options, rows, inplace=True)


def _sum_over_ranks(dx, shard):
    return dist.all_reduce(dx, group=shard.group, async_op=True)


def slice_loss(shard, kernels):
    """linear's chunk loss (linear.ChunkLoss) over this rank's slice of the classes: each chunk's
    one all-gather, and the input's gradient summed over the ranks."""
    both = dict(shard=shard, kernels=kernels)
    return ChunkLoss(partial(_sum_and_unit_gradient, **both), partial(_losses_and_state, **both),
                     partial(_rows_gradient, **both), partial(_sum_over_ranks, shard=shard))


class VocabParallelLinearFunction(torch.autograd.Function):
    """linear's chunked loss over a rank's slice of the head: the loss and every row's (m, s) over
    all the classes, and the gradients of the input (every rank's share summed), the slice's weight
    and bias. As linear's operators: where the reduction is one number and no lse is returned the
    forward writes the gradients and the backward scales them; else the backward makes each chunk's
    logits again."""
    @staticmethod
    def forward(ctx, x, w, b, t, shard, options, step):
        with torch.autocast(x.device.type, enabled=False):  # the caller cast the operands
            loss, state, dx, dw, db = forward_chunks(x, w, b, t, options, step, slice_loss(shard, step.kernels))
        ctx.save_for_backward(x, w, b, t, options.weight, state, dx, dw, db)
        ctx.shard, ctx.options, ctx.step = shard, options._replace(weight=None), step
        ctx.set_materialize_grads(False)
        return loss, state

    @staticmethod
    def backward(ctx, grad, grad_state):
        x, w, b, t, weight, state, dx, dw, db = ctx.saved_tensors
        options = ctx.options._replace(weight=weight)
        step, grad, grad_lse = backward_inputs(ctx.step, ctx.needs_input_grad, grad, grad_state, t, options)
        with torch.autocast(x.device.type, enabled=False):
            grads = backward_chunks(grad, grad_lse, x, w, b, t, state, dx, dw, db, options, step,
                                    slice_loss(ctx.shard, step.kernels))
        return (*grads, None, None, None, None)


def _dtensor_slice(logits):
    """(local logits, Slice) of a DTensor of logits sharded on their last dimension over a 1-D mesh,
    the shards as torch splits them (torch.chunk's sizes)."""
    mesh, placements = logits.device_mesh, logits.placements
    if mesh.ndim != 1 or len(placements) != 1 or not placements[0].is_shard() or \
            placements[0].dim % logits.dim() != logits.dim() - 1:
        raise RuntimeError(f"the logits must be sharded on their last dimension (the classes) over a 1-D mesh; "
                           f"got placements {placements} over a {mesh.ndim}-D mesh")
    vocab, rank, world = logits.shape[-1], mesh.get_local_rank(), mesh.size()
    local = logits.to_local()
    step = -(-vocab // world)
    start = min(rank * step, vocab)
    if local.shape[-1] != max(0, min(step, vocab - start)):
        raise RuntimeError(f"rank {rank} holds {local.shape[-1]} classes, not torch.chunk's share of {vocab}")
    return local, Slice(start, vocab, mesh.get_group())


def _check_slice(shard, cols, target, options, name):
    """What a call over a split vocabulary needs: torch.distributed, this rank's `cols` classes within the
    vocabulary, the class weights of all of it (needing no gradient), and where asked
    (check_targets_from_env) targets within it: every rank holds every target, so each raises alike,
    before any collective."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{name} gathers across ranks: initialize torch.distributed first")
    if not 0 <= shard.start <= shard.start + cols <= shard.vocab:
        raise RuntimeError(f"classes [{shard.start}, {shard.start + cols}) are not within the {shard.vocab} classes")
    weight = options.weight
    if weight is not None and tuple(weight.shape) != (shard.vocab,):
        raise RuntimeError(f"weight must hold all {shard.vocab} classes' weights; got shape {tuple(weight.shape)}")
    check_no_weight_grad(weight)
    if check_targets_from_env():
        first_bad_target(target, shard.vocab, options.ignore_index)


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, vocab_start: Optional[int] = None,
                                 vocab_size: Optional[int] = None, group=None, *, weight: Optional[torch.Tensor] = None,
                                 ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                                 z_loss: float = 0.0, softcap: Optional[float] = None, return_lse: bool = False,
                                 inplace: bool = False):
    """cross_entropy over V classes split across the ranks of `group` (None: the default group), on every
    rank the same: logits (..., V_r), this rank's classes [vocab_start, vocab_start + V_r) of vocab_size
    (V) in all (uneven slices allowed, one rank's may be empty), target (...) the global class indices,
    the same on every rank; or logits a DTensor sharded on its last dimension over a 1-D mesh (the
    slice, V and the group then its own). weight: the class weights of all V classes, the same on every
    rank; the rest as cross_entropy takes them, label smoothing spread over all V classes. One
    all-gather of 2 numbers a row in the forward (float32; float64 for float64 logits), none in the
    backward; the gradient is this rank's slice's, in the logits' dtype; inplace=True writes it over
    the logits in the forward (as cross_entropy's inplace; the lse's gradient then cannot pass).
    Returns the loss (and with return_lse every row's lse, in float32; float64 for float64 logits),
    reduction "none"'s in the targets' shape. A DTensor target must be replicated (no gather)."""
    options = check_options(weight, ignore_index, reduction, z_loss, return_lse, label_smoothing, softcap)
    if hasattr(logits, "device_mesh"):  # a DTensor
        if inplace:
            raise RuntimeError("inplace=True writes over the logits' storage, which a DTensor's local shard shares "
                               "with it: give this rank's slice as a tensor, or leave inplace off")
        logits, shard = _dtensor_slice(logits)
        if hasattr(target, "device_mesh"):
            if not all(p.is_replicate() for p in target.placements):
                raise RuntimeError(f"a DTensor target must be replicated, the same on every rank; got placements "
                                   f"{target.placements}: gather it first")
            target = target.to_local()
    else:
        if vocab_start is None or vocab_size is None:
            raise TypeError("vocab_parallel_cross_entropy needs vocab_start and vocab_size with a tensor of logits")
        shard = Slice(int(vocab_start), int(vocab_size), group)
    if target.dtype.is_floating_point or target.dtype == torch.bool or target.shape != logits.shape[:-1]:
        raise RuntimeError(f"target must hold class indices of shape {tuple(logits.shape[:-1])}; got "
                           f"{target.dtype} of shape {tuple(target.shape)}")
    cols = logits.shape[-1]
    _check_slice(shard, cols, target, options, "vocab_parallel_cross_entropy")
    if torch.is_autocast_enabled(logits.device.type) and logits.dtype in (torch.float16, torch.bfloat16):
        options = options._replace(float32_loss=True)
    x = logits.reshape(math.prod(logits.shape[:-1]), cols)
    if inplace and logits.requires_grad and torch.is_grad_enabled():
        check_inplace_over(logits)
        if x.data_ptr() != logits.data_ptr() or not x.is_contiguous():
            raise RuntimeError("inplace=True writes the gradient over the logits: give them contiguous")
    sample_shape = target.shape
    loss, lse = VocabParallelFunction.apply(x, target.reshape(-1).long(), shard, options, bool(inplace))
    if reduction == "none":
        loss = loss.reshape(sample_shape)
    return (loss, lse.reshape(sample_shape)) if return_lse else loss


def vocab_parallel_linear_cross_entropy(input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor,
                                        vocab_start: int, vocab_size: int, group=None, *,
                                        linear_bias: Optional[torch.Tensor] = None,
                                        weight: Optional[torch.Tensor] = None, ignore_index: int = -100,
                                        reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                                        softcap: Optional[float] = None, return_lse: bool = False,
                                        chunk_size: Optional[int] = None):
    """linear_cross_entropy with the head's classes split across the ranks of `group` (None: the
    default group): input (..., D), the same on every rank; linear_weight (V_r, D) and linear_bias
    (V_r,) or None, this rank's rows of the head, the classes [vocab_start, vocab_start + V_r) of
    vocab_size (V) in all; target (...) the global class indices, the same on every rank; weight (all
    V classes') and the rest as vocab_parallel_cross_entropy takes them. Each rank makes its slice's
    logits a chunk of rows at a time; each chunk's forward all-gathers 2 numbers a row, and the
    input's gradient, this rank's share of which is its slice's, is summed over the ranks by one
    all-reduce (in float32, rounded once after it): every rank gets the loss and the input's whole
    gradient, and its slice's gradients of the weight and the bias. chunk_size: rows per chunk, the
    same on every rank (None: linear_cross_entropy's choice for V / ranks classes, the same on every
    rank whatever the slices). Returns the loss (and with return_lse every row's lse)."""
    options = check_options(weight, ignore_index, reduction, z_loss, return_lse, label_smoothing, softcap)
    shard = Slice(int(vocab_start), int(vocab_size), group)
    check_shapes(input, linear_weight, linear_bias, target)
    _check_slice(shard, linear_weight.shape[0], target, options, "vocab_parallel_linear_cross_entropy")
    x, w, b, autocast = autocast_operands(input, linear_weight, linear_bias)
    if autocast:
        options = options._replace(float32_loss=True)
    x, t = x.reshape(-1, x.shape[-1]), target.reshape(-1).long()
    kernels = _kernels_take(x.new_empty((0, w.shape[0])), t, options)  # as each chunk's logits will be
    classes = -(-shard.vocab // dist.get_world_size(group))  # the same on every rank, whatever its slice
    step = plan_step(x, w, b, options, classes, chunk_size, False, kernels)  # the targets checked above
    loss, state = VocabParallelLinearFunction.apply(x, w, b, t, shard, options, step)
    if reduction == "none":
        loss = loss.reshape(target.shape)
    return (loss, lse_of(state).reshape(target.shape)) if return_lse else loss
