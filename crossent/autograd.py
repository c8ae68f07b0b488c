"""The loss's gradient in autograd. The forward saves every row's (m, s), and the backward reads the
logits once more and writes d loss / d logits once (gradient.cross_entropy_backward). Where the logits
alone train and the fused family takes them, the forward writes the gradient for an incoming 1 in the
same launch as the loss, and the backward rewrites only the rows whose incoming gradient is not 1: in
eager calls through the training node (csrc/training_node.cpp, dispatch.node_forward), C++ from the
launch to the backward, else (inplace, which scales those rows, the logits being gone) through the
autograd.Function here, CrossEntropyFunction, which takes every other eager call too (probability
targets, strided classes, rows past a cluster). torch.compile sees the custom operators of ops.py,
whose autograd is input_gradients too. (A custom operator's eager dispatch costs the host several
times an autograd.Function's: pytorch/pytorch#176592.)"""
import torch

from .dispatch import train_forward
from .gradient import cross_entropy_backward, scale_in_place, unit_gradient_over


def save_for_gradient(ctx, input, target, state, options, inplace=False):
    """What the backward reads: the logits (not where inplace wrote the gradient over them), the
    targets, the class weights and the rows' (m, s); the options with the weights saved apart."""
    ctx.save_for_backward(None if inplace else input, target, options.weight, state)
    ctx.options = options._replace(weight=None)
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no work for it


def input_gradients(ctx, grad, grad_state, backward, written=None, inplace=False):
    """(d loss / d input, d loss / d target), each None where not needed: by `backward` (gradient.
    cross_entropy_backward, or its operator), or where the forward wrote the gradient for an incoming 1
    (written: dispatch.Written, eager calls' alone) from there, by cross_entropy_backward, or over the
    logits (inplace) by scale_in_place. grad_state: the state's, whose first column, m's, is the
    log-sum-exp's (dispatch.lse)."""
    if torch.is_grad_enabled():
        raise RuntimeError("cross_entropy's gradient has no gradient of its own: double backward (create_graph=True "
                           "through the loss) is not supported")
    input, target, weight, state = ctx.saved_tensors
    options = ctx.options._replace(weight=weight)
    grad_lse = grad_state[:, 0] if grad_state is not None else None
    if grad is None:  # only the log-sum-exp reached the result
        grad = torch.zeros((), dtype=torch.float32, device=state.device)
        if options.reduction == "none":
            grad = grad.expand(state.shape[:1])
    if written and inplace:
        if grad_lse is not None:
            raise RuntimeError("inplace=True wrote the gradient over the logits, and the log-sum-exp's gradient needs "
                               "them: leave inplace off where the returned lse reaches the result")
        return scale_in_place(written.dx, grad, options.reduction), None
    if written:
        dx, dq = cross_entropy_backward(grad, grad_lse, input, target, state, options, written=written)
    else:
        dx, dq = backward(grad, grad_lse, input, target, state, options, ctx.needs_input_grad[1])
    return dx if ctx.needs_input_grad[0] else None, dq if ctx.needs_input_grad[1] else None


class CrossEntropyFunction(torch.autograd.Function):
    """The loss with its gradient, for eager calls the training node does not take (api). forward
    takes ctx itself: with a separate setup_context, apply binds every call's arguments to forward's
    signature ("The gradient").
    inplace: the forward writes the logits' gradient over them, by the fused launch or else by the
    gradient's kernel right after the loss's, and bumps their version: autograd then refuses any
    tensor saved from them (a "modified by an inplace operation" error), where it would have read the
    gradient in their place."""
    @staticmethod
    def forward(ctx, input, target, options, check_targets, inplace, called=None):
        # Where the logits alone train, the launch may write their gradient too. called: dispatch.call's
        # result, where the training node declined the call.
        fuse = ctx.needs_input_grad[0] and not ctx.needs_input_grad[1]
        loss, state, written = train_forward(input, target, options, check_targets, fuse, inplace, called)
        if inplace:
            written = unit_gradient_over(input, target, loss, state, options, written)
            torch.autograd.graph.increment_version(input)
        save_for_gradient(ctx, input, target, state, options, inplace)
        ctx.written = written
        ctx.inplace = inplace
        return loss, state

    @staticmethod
    def backward(ctx, grad, grad_state):
        written, ctx.written = ctx.written, None  # a second backward (retain_graph) writes the gradient anew ...
        if written is None and ctx.inplace:  # ... from the logits, which inplace overwrote
            raise RuntimeError("inplace=True: the logits hold the first backward's gradient, and a second backward "
                               "through the graph (retain_graph) needs the logits")
        return *input_gradients(ctx, grad, grad_state, cross_entropy_backward, written, ctx.inplace), None, None, None, \
            None
