"""The public API: cross_entropy, PyTorch's functional loss with its options and a few more, and
ModelNew, KernelBench's module (problem 95 with no arguments). Each call goes to the launch alone
where nothing trains (dispatch.forward), to the training node or the autograd.Function where the
logits or probabilities require grad in eager mode, and to the custom operator under torch.compile."""
from typing import Optional, Tuple, Union

import torch

from .autograd import CrossEntropyFunction
from .dispatch import forward, lse, node_forward
from .inputs import Options, check_options, check_targets_from_env
from .ops import compiled_loss


def _loss(input, target, options: Options, check_targets, inplace=False):
    """The loss (and lse, where asked): with its gradient where one is wanted (through the custom
    operator where torch.compile traces, which is not in place), else the launch alone, with no
    log-sum-exp saved and the logits untouched."""
    compiling = torch.compiler.is_compiling()
    # getattr: anything but a tensor goes on to inputs.check_inputs' error
    wants_grad = getattr(input, "requires_grad", False) or getattr(target, "requires_grad", False)
    if not compiling and not (wants_grad and torch.is_grad_enabled()):
        return forward(input, target, options, check_targets)
    if compiling:
        loss, state = compiled_loss(input, target, options, check_targets)
    else:
        inplace = bool(inplace) and input.requires_grad
        if inplace and (input if input._base is None else input._base).is_leaf:
            raise RuntimeError("inplace=True would write the gradient over a leaf that requires grad (or a view of "
                               "one), as PyTorch refuses in-place operations on them")
        if inplace and target.requires_grad:
            raise ValueError("inplace=True overwrites the logits, and the probability targets' gradient needs them")
        trained = None
        if input.requires_grad and not getattr(target, "requires_grad", False) and not inplace:
            trained = node_forward(input, target, options, check_targets)
        loss, state = trained or CrossEntropyFunction.apply(input, target, options, check_targets, inplace)
    return (loss, lse(state, input.shape)) if options.return_lse else loss


def cross_entropy(input: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor] = None,
                  ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0, *,
                  z_loss: float = 0.0, softcap: Optional[float] = None, return_lse: bool = False,
                  inplace: bool = False) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """PyTorch's cross_entropy(input, target, weight, ignore_index, reduction, label_smoothing), in
    one launch. input: logits (C,), (N, C) or (N, C, d1, ..., dk), a row per sample position; target:
    class indices (int64 or int32) of shape (), (N,) or (N, d1, ..., dk), or class probabilities of
    the input's shape (the result in the promoted dtype, float32 for two different ones). weight: a
    class weight per column, of the logits' dtype; with class indices the mean then divides by the
    counted rows' weights, with probabilities by the rows. reduction "none" gives a loss per row
    (0 where the target is ignored), of the targets' shape for indices; "sum" their sum; "mean" their
    mean. label_smoothing (eps): the targets mixed with the uniform distribution, (1 - eps) of each
    row's own plus eps / C of each class, weighted as PyTorch weighs them.
    Beyond PyTorch: z_loss adds z_loss * lse**2 to each counted row's loss (lse: its log-sum-exp;
    the mean divides as before); softcap (a positive number) passes every logit through
    softcap * tanh(x / softcap) first, as Gemma 2 caps its logits, and everything above then reads
    the capped logits; return_lse=True returns (loss, lse), lse every row's log-sum-exp in float32,
    ignored rows' too, in the shape of the loss per row.
    inplace=True: where the logits require grad, the forward writes their gradient over them, so that
    the step allocates no tensor of their size, and bumps their version: autograd raises where a tensor
    saved from them would be read (the gradient in their place). The backward hands that storage on,
    multiplied by the incoming gradient where it is not 1 (16-bit gradients then round twice). It
    needs logits that are not a leaf, in a layout the kernels read in place (adjacent classes, or the
    contiguous (N, C, d1, ..., dk)) with no rows that overlap, targets that do not require grad, and no
    gradient through lse; torch.compile traces the out-of-place loss.
    A target outside [0, C) other than ignore_index makes its row's loss NaN; with the environment's
    CROSS_ENTROPY_CHECK_TARGETS=1 a ValueError names the first such row instead, at the cost of a host
    synchronization."""
    options = check_options(weight, ignore_index, reduction, z_loss, return_lse, label_smoothing, softcap)
    return _loss(input, target, options, check_targets_from_env(), inplace)


class ModelNew(torch.nn.Module):
    """Cross-entropy over rows, computed by one fused CUDA kernel, and its gradient by another where
    the logits require grad. With no arguments, KernelBench's problem: the mean, ignore_index -100.
    weight, ignore_index, reduction and label_smoothing as PyTorch's cross-entropy loss module takes
    them (weight is a buffer, moved with the module); z_loss, softcap and inplace as cross_entropy takes
    them; inputs and targets as cross_entropy takes them. check_targets: the targets' check (see
    cross_entropy; None: as the environment says)."""

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
        return _loss(predictions, targets, options, self.check_targets, self.inplace)
