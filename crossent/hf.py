"""Hugging Face transformers: causal_lm_loss, a causal language model's loss as transformers calls a
model's loss_function (its ForCausalLMLoss's arguments), which reads the logits in their own dtype
where transformers' upcasts them to float32 first (a copy of the logits' size, and log-softmax's
of that size saved for the backward), and use_crossent(model), the one line that puts it on a
model. Needs no import of transformers."""
from typing import Optional

import torch

from .api import routed_loss
from .inputs import check_options


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, vocab_size: Optional[int] = None,
                   num_items_in_batch: Optional[torch.Tensor] = None, ignore_index: int = -100,
                   shift_labels: Optional[torch.Tensor] = None, **kwargs) -> torch.Tensor:
    """transformers' ForCausalLMLoss: position i predicts labels[..., i + 1] (or shift_labels[..., i]
    where given), ignore_index is not counted, and the loss is the mean over the counted tokens, or
    their sum over num_items_in_batch where given (gradient accumulation's count); a float32 loss,
    as transformers gives. The logits (batch, sequence, vocabulary) are read where they lie: the
    labels shift, not the logits. Other keyword arguments transformers passes are accepted and unused."""
    if shift_labels is None:
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    x = logits.reshape(-1, logits.shape[-1])
    t = shift_labels.to(logits.device).reshape(-1)
    reduction = "mean" if num_items_in_batch is None else "sum"
    options = check_options(ignore_index=ignore_index, reduction=reduction)._replace(float32_loss=True)
    loss = routed_loss(x, t, options)
    if num_items_in_batch is not None:
        loss = loss / (num_items_in_batch.to(loss.device) if torch.is_tensor(num_items_in_batch) else num_items_in_batch)
    return loss


def use_crossent(model):
    """Puts causal_lm_loss on a transformers model (one with a loss_function, transformers 4.46 and
    newer), in place; returns the model."""
    if not hasattr(model, "loss_function"):
        raise RuntimeError(f"{type(model).__name__} has no loss_function to replace: transformers 4.46 or newer "
                           f"calls one")
    model.loss_function = causal_lm_loss
    return model
