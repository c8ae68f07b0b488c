"""The public API: cross_entropy, PyTorch's functional loss in its argument order with its options and
a few more, and CrossEntropyLoss, nn.CrossEntropyLoss with the same. The kernels compute what they
take (loss.kernel_loss); the rest (CPU tensors, float64, other target dtypes, a GPU before Turing),
PyTorch's operations (composite.composite_loss), with the same semantics. ModelNew, which never
hands a call to PyTorch, is loss.py's."""
from typing import Optional, Tuple, Union

import torch

from .build import kernels_run_on
from .composite import composite_loss
from .constants import DTYPE_CODES
from .inputs import TARGET_DTYPES, Options, check_options, check_targets_from_env
from .loss import kernel_loss


def kernels_take(input, target, options: Options) -> bool:
    """Whether the kernels compute this call: CUDA tensors of their dtypes, with classes, class weights
    of the logits' dtype (under autocast PyTorch takes others), on a GPU they run on."""
    return (isinstance(input, torch.Tensor) and isinstance(target, torch.Tensor) and input.is_cuda
            and target.is_cuda and input.dtype in DTYPE_CODES
            and (target.dtype in TARGET_DTYPES or target.dtype in DTYPE_CODES)
            and input.dim() > 0 and input.shape[1 if input.dim() > 1 else 0] > 0
            and (options.weight is None or options.weight.dtype == input.dtype)
            and (torch.compiler.is_compiling() or kernels_run_on(input.get_device())))


def routed_loss(input, target, options: Options, inplace=False):
    """The loss of checked options: by the kernels where they take the call, else by PyTorch's
    operations. cross_entropy's, and crossent.hf's."""
    if not kernels_take(input, target, options):
        return composite_loss(input, target, options)
    return kernel_loss(input, target, options, check_targets_from_env(), inplace)


def cross_entropy(input: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor] = None,
                  size_average: Optional[bool] = None, ignore_index: int = -100, reduce: Optional[bool] = None,
                  reduction: str = "mean", label_smoothing: float = 0.0, *, z_loss: float = 0.0,
                  softcap: Optional[float] = None, return_lse: bool = False,
                  inplace: bool = False) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """PyTorch's F.cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction,
    label_smoothing), in one launch (size_average and reduce, deprecated, as PyTorch reads them). input: logits (C,), (N, C) or (N, C, d1, ..., dk), a row per sample position; target:
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
    CROSS_ENTROPY_CHECK_TARGETS=1 an IndexError names the first such row instead, at the cost of a host
    synchronization. Under torch.autocast, 16-bit logits give a float32 loss, as PyTorch's does there.
    What the kernels do not take (CPU tensors, float64 logits, other target dtypes, class weights of
    another dtype under autocast, a GPU before Turing) PyTorch's operations compute, with the same
    semantics (crossent.composite); there inplace does nothing."""
    if size_average is not None or reduce is not None:
        reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
    options = check_options(weight, ignore_index, reduction, z_loss, return_lse, label_smoothing, softcap)
    return routed_loss(input, target, options, inplace)


class CrossEntropyLoss(torch.nn.CrossEntropyLoss):
    """nn.CrossEntropyLoss computed by cross_entropy: its arguments, then this package's (z_loss,
    softcap, return_lse, inplace: see cross_entropy). Read at each call, as PyTorch's module reads
    them: weight (a buffer), ignore_index, reduction, label_smoothing and the four above."""

    def __init__(self, weight: Optional[torch.Tensor] = None, size_average=None, ignore_index: int = -100,
                 reduce=None, reduction: str = "mean", label_smoothing: float = 0.0, *, z_loss: float = 0.0,
                 softcap: Optional[float] = None, return_lse: bool = False, inplace: bool = False):
        super().__init__(weight, size_average, ignore_index, reduce, reduction, label_smoothing)
        check_options(weight, ignore_index, self.reduction, z_loss, return_lse, label_smoothing, softcap)
        self.z_loss, self.softcap, self.return_lse, self.inplace = z_loss, softcap, return_lse, inplace

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        return cross_entropy(input, target, self.weight, ignore_index=self.ignore_index, reduction=self.reduction,
                             label_smoothing=self.label_smoothing, z_loss=self.z_loss, softcap=self.softcap,
                             return_lse=self.return_lse, inplace=self.inplace)

    def extra_repr(self) -> str:
        extras = {"z_loss": self.z_loss, "softcap": self.softcap, "return_lse": self.return_lse,
                  "inplace": self.inplace}
        return ", ".join(f"{k}={v}" for k, v in extras.items() if v)


