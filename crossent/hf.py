"""Hugging Face transformers: causal_lm_loss, a causal language model's loss as transformers calls a
model's loss_function (its ForCausalLMLoss's arguments), which reads the logits in their own dtype
where transformers' upcasts them to float32 first (a copy of the logits' size, and log-softmax's
of that size saved for the backward), and use_crossent(model), the one line that puts it on a
model; use_crossent(model, head=True) puts the model's head into the loss too (linear_cross_entropy):
the logits of every token never exist. Imports transformers only for the latter's output."""
import functools
import types
from typing import Optional

import torch

from .api import routed_loss
from .inputs import check_options
from .linear import linear_loss


def _shifted(labels, ignore_index, shift_labels):
    """The label each position predicts: the next one's (transformers' shift), or shift_labels."""
    if shift_labels is None:
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    return shift_labels


def _over_items(loss, num_items_in_batch):
    if num_items_in_batch is None:
        return loss
    return loss / (num_items_in_batch.to(loss.device) if torch.is_tensor(num_items_in_batch) else num_items_in_batch)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, vocab_size: Optional[int] = None,
                   num_items_in_batch: Optional[torch.Tensor] = None, ignore_index: int = -100,
                   shift_labels: Optional[torch.Tensor] = None, **kwargs) -> torch.Tensor:
    """transformers' ForCausalLMLoss: position i predicts labels[..., i + 1] (or shift_labels[..., i]
    where given), ignore_index is not counted, and the loss is the mean over the counted tokens, or
    their sum over num_items_in_batch where given (gradient accumulation's count); a float32 loss,
    as transformers gives. The logits (batch, sequence, vocabulary) are read where they lie: the
    labels shift, not the logits. Other keyword arguments transformers passes are accepted and unused."""
    x = logits.reshape(-1, logits.shape[-1])
    t = _shifted(labels, ignore_index, shift_labels).to(logits.device).reshape(-1)
    reduction = "mean" if num_items_in_batch is None else "sum"
    options = check_options(ignore_index=ignore_index, reduction=reduction)._replace(float32_loss=True)
    return _over_items(routed_loss(x, t, options), num_items_in_batch)


def use_crossent(model, head=False, chunk_size=None):
    """Puts causal_lm_loss on a transformers model (one with a loss_function, transformers 4.46 and
    newer), in place; returns the model. head=True: a call with labels computes the model's base
    (model.base_model), then the loss of its head's logits by linear_cross_entropy (chunk_size rows of
    them at a time, None: its default), with the head's weight and bias, the labels shifted as
    transformers shifts them, and the cap of the logits a config names (Gemma 2's final_logit_softcapping,
    RecurrentGemma's logits_soft_cap); it returns the loss and no logits. A call without labels is the
    model's own. Refused: a config that scales the logits (Cohere's logit_scale, Granite's
    logits_scaling, ...), and a head with hooks (accelerate's device map, FSDP)."""
    if not hasattr(model, "loss_function"):
        raise RuntimeError(f"{type(model).__name__} has no loss_function to replace: transformers 4.46 or newer "
                           f"calls one")
    model.loss_function = causal_lm_loss
    if head:
        _put_head_in_loss(model, chunk_size)
    return model


_MODEL_ONLY = ("labels", "num_items_in_batch", "shift_labels", "logits_to_keep", "return_dict")
# What a config may say about the logits beyond head(hidden) (its own and its text model's config):
# caps, which the loss's softcap is, and scales, which it refuses.
_CAPS = ("final_logit_softcapping", "logits_soft_cap")
_SCALES = ("logit_scale", "logits_scaling", "lm_head_multiplier", "output_multiplier_scale")


def _logit_cap(model):
    """The cap of the model's logits (None: none), or RuntimeError where its config scales them."""
    configs = [model.config]
    text = getattr(model.config, "text_config", None)
    if text is not None:
        configs.append(text)
    for config in configs:
        for name in _SCALES:
            if getattr(config, name, None) not in (None, 1, 1.0):
                raise RuntimeError(f"{type(model).__name__} scales its logits (config.{name}), which the fused loss "
                                   f"does not: use_crossent(model) without head=True keeps the model's head")
    caps = {getattr(config, name, None) for config in configs for name in _CAPS} - {None}
    if len(caps) > 1:
        raise RuntimeError(f"{type(model).__name__}'s config names two caps of its logits: {sorted(caps)}")
    return caps.pop() if caps else None


def _put_head_in_loss(model, chunk_size):
    head, base = model.get_output_embeddings(), model.base_model
    if not isinstance(head, torch.nn.Linear) or base is model:
        raise RuntimeError(f"{type(model).__name__} has no linear head over a base model to fuse with the loss")
    if head._forward_hooks or head._forward_pre_hooks or hasattr(head, "_hf_hook"):
        raise RuntimeError(f"{type(model).__name__}'s head has hooks (accelerate's device map, FSDP), which the fused "
                           f"loss would pass by, reading its weight directly: use_crossent(model) without head=True")
    forward = functools.partial(_forward_with_head_in_loss, chunk_size=chunk_size, softcap=_logit_cap(model))
    model.forward = types.MethodType(forward, model)


def _forward_with_head_in_loss(model, input_ids=None, *args, labels=None, num_items_in_batch=None, shift_labels=None,
                               chunk_size=None, softcap=None, **kwargs):
    """The model's forward where it has labels (and no further positional arguments): its base, then the
    loss of its head's logits by linear_cross_entropy (softcap: the config's cap, read once by
    _put_head_in_loss); a method of the model, so that a copy of the model (copy.deepcopy) computes
    with its own weights."""
    if labels is None or args:  # the model's own, given only what its caller gave (older forwards take neither)
        given = {"num_items_in_batch": num_items_in_batch, "shift_labels": shift_labels}
        kwargs.update({k: v for k, v in given.items() if v is not None})
        return type(model).forward(model, input_ids, *args, labels=labels, **kwargs)
    from transformers.modeling_outputs import CausalLMOutputWithPast

    head = model.get_output_embeddings()
    outputs = model.base_model(input_ids=input_ids, return_dict=True,
                               **{k: v for k, v in kwargs.items() if k not in _MODEL_ONLY})
    hidden = outputs[0]
    reduction = "mean" if num_items_in_batch is None else "sum"
    options = check_options(reduction=reduction, softcap=softcap)._replace(float32_loss=True)
    targets = _shifted(labels, -100, shift_labels).to(hidden.device)
    loss = _over_items(linear_loss(hidden, head.weight, targets, head.bias, options, chunk_size), num_items_in_batch)
    result = CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=getattr(outputs, "past_key_values", None),
                                    hidden_states=getattr(outputs, "hidden_states", None),
                                    attentions=getattr(outputs, "attentions", None))
    return_dict = kwargs.get("return_dict")
    return result if (getattr(model.config, "return_dict", True) if return_dict is None else return_dict) \
        else result.to_tuple()
