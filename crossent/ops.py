"""The loss as torch.library custom operators, for torch.compile: <namespace>::cross_entropy (the loss
and every row's (m, s)) and its backward, each an opaque node of the graph with its fake (shapes and
dtypes) and the autograd of autograd.py. A schema takes plain arguments, so the options are flattened
here, and only here, and rebuilt as one Options object inside the operators. No fused launch: a traced
forward does not know whether the backward will run."""
import math
from typing import Optional, Tuple

import torch

from .autograd import input_gradients, save_for_gradient
from .dispatch import empty_gradient, train_forward
from .gradient import cross_entropy_backward
from .inputs import Options, check_inputs, samples_shape


def _op_namespace():
    """crossent, or crossent_<n> where an earlier load in the process holds it (a harness that execs
    model_new.py again, or the package and model_new.py side by side): registered anew under the same
    names, the operators would replace the earlier load's, and when either load's module went, its
    registrations would take the names from both."""
    n = 0
    while hasattr(getattr(torch.ops, f"crossent_{n}" if n else "crossent"), "cross_entropy"):
        n += 1
    return f"crossent_{n}" if n else "crossent"


OP_NAMESPACE = _op_namespace()


def _flat(options):
    """The options as the operators' schema takes them (return_lse stays with the caller)."""
    return options.weight, options.ignore_index, options.reduction, options.label_smoothing, options.z_loss, \
        options.softcap, options.float32_loss


def _options(weight, ignore_index, reduction, label_smoothing, z_loss, softcap, float32_loss):
    return Options(weight, ignore_index, reduction, z_loss, False, label_smoothing, softcap, float32_loss)


def _forward(input: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], ignore_index: int,
             reduction: str, label_smoothing: float, z_loss: float, softcap: float, float32_loss: bool,
             check_targets: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(loss, state): the loss and every row's (m, s), what the gradient reads (and the log-sum-exp's:
    dispatch.lse, whose gradient reaches the state's first column)."""
    options = _options(weight, ignore_index, reduction, label_smoothing, z_loss, softcap, float32_loss)
    loss, state, _ = train_forward(input, target, options, check_targets)
    return loss, state


def _backward(grad: torch.Tensor, grad_lse: Optional[torch.Tensor], input: torch.Tensor, target: torch.Tensor,
              state: torch.Tensor, weight: Optional[torch.Tensor], ignore_index: int, reduction: str,
              label_smoothing: float, z_loss: float, softcap: float, float32_loss: bool,
              target_grad: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(d loss / d input, d loss / d target): the latter empty unless target_grad."""
    options = _options(weight, ignore_index, reduction, label_smoothing, z_loss, softcap, float32_loss)
    dx, dq = cross_entropy_backward(grad, grad_lse, input, target, state, options, target_grad)
    return dx, dq if dq is not None else input.new_empty(0)


forward_op = torch.library.custom_op(f"{OP_NAMESPACE}::cross_entropy", _forward, mutates_args=())
backward_op = torch.library.custom_op(f"{OP_NAMESPACE}::cross_entropy_backward", _backward, mutates_args=())


@forward_op.register_fake
def _forward_shapes(input, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap, float32_loss,
                    check_targets):
    probs = check_inputs(input, target)
    positions = samples_shape(input.shape)
    dtype = torch.float32 if float32_loss or (probs and target.dtype != input.dtype) else input.dtype
    return (input.new_empty(positions if reduction == "none" else (), dtype=dtype),
            input.new_empty((math.prod(positions), 2), dtype=torch.float32))


@backward_op.register_fake
def _backward_shapes(grad, grad_lse, input, target, state, weight, ignore_index, reduction, label_smoothing, z_loss,
                     softcap, float32_loss, target_grad):
    dq = empty_gradient(input, target.dtype) if target_grad else input.new_empty(0)
    return empty_gradient(input, input.dtype), dq


def _setup_context(ctx, inputs, output):
    input, target, *flat, _ = inputs
    save_for_gradient(ctx, input, target, output[1], _options(*flat))


def _backward_through_op(grad, grad_lse, input, target, state, options, target_grad):
    return backward_op(grad, grad_lse, input, target, state, *_flat(options), target_grad)


def _gradients(ctx, grad, grad_state):
    return *input_gradients(ctx, grad, grad_state, _backward_through_op), *[None] * 8


forward_op.register_autograd(_gradients, setup_context=_setup_context)


def compiled_loss(input, target, options, check_targets):
    """(loss, state) through the operator, as torch.compile traces the loss."""
    return forward_op(input, target, *_flat(options), check_targets)
