"""The loss through the kernels, which every public entry calls (kernel_loss), and ModelNew,
KernelBench's module (problem 95 with no arguments). A call goes to the launch alone where nothing
trains (dispatch.forward), to the training node or the autograd.Function where the logits or
probabilities require grad in eager mode, and to the custom operator under torch.compile. This is
the last module model_new.py bundles: it never hands a call to PyTorch's operations."""
from typing import Optional

import torch

from .autograd import CrossEntropyFunction
from .dispatch import call, forward, lse, node_forward
from .inputs import Options, check_inplace_over, check_options, check_targets_from_env
from .ops import compiled_loss


def kernel_loss(input, target, options: Options, check_targets, inplace=False):
    """The loss (and lse, where asked) by the kernels, for every public entry. Under autocast, 16-bit
    logits give a float32 loss (autocast's cross-entropy's dtype), read as they are."""
    if torch.is_autocast_enabled("cuda") and getattr(input, "dtype", None) in (torch.float16, torch.bfloat16):
        options = options._replace(float32_loss=True)
    if options.reduction == "mean" and getattr(input, "ndim", 0) == 1 and not options.label_smoothing \
            and isinstance(target, torch.Tensor) and not target.is_floating_point():
        return _one_sample_mean(input, target, options, check_targets, inplace)
    return _kernels(input, target, options, check_targets, inplace)


def _one_sample_mean(input, target, options, check_targets, inplace):
    """The mean of one sample (logits (C,)) as PyTorch's CUDA loss gives it: 0 where its target is
    ignored (not the 0 / 0 of an empty mean), else its loss (NaN where its class weighs 0). The sum
    is that, times the class's weight."""
    result = _kernels(input, target, options._replace(reduction="sum"), check_targets, inplace)
    if options.weight is None:
        return result
    loss, lse = result if options.return_lse else (result, None)
    divisor = torch.where(target == options.ignore_index, 1, options.weight[target.clamp(0, input.shape[0] - 1)])
    loss = loss / divisor.to(loss.dtype)
    return (loss, lse) if options.return_lse else loss


def _kernels(input, target, options, check_targets, inplace):
    """The loss by the kernels: with its gradient where one is wanted (through the custom operator
    where torch.compile traces, which is not in place), else the launch alone, with no log-sum-exp
    saved and the logits untouched."""
    compiling = torch.compiler.is_compiling()
    # getattr: anything but a tensor goes on to inputs.check_inputs' error
    wants_grad = getattr(input, "requires_grad", False) or getattr(target, "requires_grad", False)
    if not compiling and not (wants_grad and torch.is_grad_enabled()):
        return forward(input, target, options, check_targets)
    if compiling:
        loss, state = compiled_loss(input, target, options, check_targets)
    else:
        inplace = bool(inplace) and input.requires_grad
        if inplace:
            check_inplace_over(input)
        if inplace and target.requires_grad:
            raise RuntimeError("inplace=True overwrites the logits, and the probability targets' gradient needs them")
        trained = called = None
        if input.requires_grad and not getattr(target, "requires_grad", False) and not inplace:
            called = call(input, target, options, fuse=True)  # the node's, and where it declines the Function's
            trained = node_forward(input, called, options, check_targets)
        loss, state = trained or CrossEntropyFunction.apply(input, target, options, check_targets, inplace, called)
    return (loss, lse(state, input.shape)) if options.return_lse else loss


class ModelNew(torch.nn.Module):
    """Cross-entropy over rows, computed by one fused CUDA kernel, and its gradient by another where
    the logits require grad. With no arguments, KernelBench's problem: the mean, ignore_index -100.
    weight, ignore_index, reduction and label_smoothing as PyTorch's cross-entropy loss module takes
    them (weight is a buffer, moved with the module); z_loss, softcap and inplace as cross_entropy takes
    them; inputs and targets as cross_entropy takes them, on a GPU: unlike cross_entropy it never hands
    a call to PyTorch's operations (a RuntimeError says what the kernels do not take). check_targets:
    the targets' check (see cross_entropy; None: as the environment says)."""

    def __init__(self, weight: Optional[torch.Tensor] = None, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0, *, z_loss: float = 0.0, softcap: Optional[float] = None,
                 inplace: bool = False, check_targets: Optional[bool] = None):
        super().__init__()
        # Checked once, with PyTorch's errors; the weight, a buffer, joins the options at each call.
        self._options = check_options(None, ignore_index, reduction, z_loss, label_smoothing=label_smoothing,
                                      softcap=softcap)
        check_options(weight)
        self.register_buffer("weight", weight)  # read at each call: .to() and .cuda() move it
        self.inplace = bool(inplace)
        self.check_targets = check_targets_from_env() if check_targets is None else bool(check_targets)

    ignore_index = property(lambda self: self._options.ignore_index)
    reduction = property(lambda self: self._options.reduction)
    z_loss = property(lambda self: self._options.z_loss)
    label_smoothing = property(lambda self: self._options.label_smoothing)
    softcap = property(lambda self: self._options.softcap or None)

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        options = self._options if self.weight is None else self._options._replace(weight=self.weight)
        return kernel_loss(predictions, targets, options, self.check_targets, self.inplace)
