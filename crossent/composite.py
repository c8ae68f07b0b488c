"""The loss composed of PyTorch's own operations, every option included, for the calls the kernels do
not take (CPU tensors, float64 logits, targets of other dtypes, a GPU older than Turing): the same
semantics as the kernels, and where PyTorch has the option its very result (F.cross_entropy on that
device), its errors and its gradient through autograd. cross_entropy and CrossEntropyLoss come here;
ModelNew never does."""
import torch
import torch.nn.functional as F

from .inputs import samples_shape, wide_dtype


def composite_loss(input, target, options):
    """The loss (and the lse, where options.return_lse) of `options` (inputs.Options), by PyTorch's
    operations. 16-bit logits are read in float32 where the loss is asked in float32 (float32_loss),
    and under autocast on their device for the extras (softcap, z_loss, lse), as autocast's
    cross-entropy reads them; the lse is in float32 (float64 for float64 logits)."""
    x, weight = input, options.weight
    extras = options.softcap or options.z_loss or options.return_lse
    if x.dtype in (torch.float16, torch.bfloat16) and (
            options.float32_loss or (extras and torch.is_autocast_enabled(x.device.type))):
        x = x.float()
        weight = None if weight is None else weight.float()  # read in float32, as the logits are
    if options.softcap:
        x = options.softcap * torch.tanh(x / options.softcap)
    kwargs = dict(weight=weight, ignore_index=options.ignore_index,
                  label_smoothing=options.label_smoothing)
    if not (options.z_loss or options.return_lse):
        return F.cross_entropy(x, target, reduction=options.reduction, **kwargs)
    lse = torch.logsumexp(x.to(wide_dtype(x.dtype)), dim=1 if x.dim() > 1 else 0)
    per_row = F.cross_entropy(x, target, reduction="none", **kwargs)
    probs = target.is_floating_point()
    counted = torch.ones_like(lse, dtype=torch.bool) if probs else target != options.ignore_index
    if options.z_loss:  # where the row counts: 0 * inf would be NaN
        per_row = per_row + torch.where(counted, options.z_loss * lse**2, 0).to(per_row.dtype)
    if options.reduction == "none":
        loss = per_row
    elif options.reduction == "sum":
        loss = per_row.sum()
    elif options.weight is None or probs:
        loss = per_row.sum() / counted.sum()
    else:  # the counted rows' class weights, as PyTorch's mean divides
        classes = target.clamp(0, options.weight.shape[0] - 1)
        loss = per_row.sum() / torch.where(counted, options.weight[classes], 0).sum()
    return (loss, lse.reshape(samples_shape(input.shape))) if options.return_lse else loss
