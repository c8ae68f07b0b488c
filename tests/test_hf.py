"""crossent.hf: transformers' causal language-model loss (its arguments and its result), on the
CPU against the loss written out, and on the GPU a small GPT-2 trained with it (bench/hf_gpt2.py)."""
import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F

import crossent.hf
from conftest import ROOT


def _written_out(logits, labels, num_items_in_batch=None, ignore_index=-100):
    """ForCausalLMLoss as transformers writes it: float32 logits, labels shifted left, padded."""
    shift = F.pad(labels, (0, 1), value=ignore_index)[..., 1:].reshape(-1)
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), shift, ignore_index=ignore_index,
                           reduction="sum" if num_items_in_batch is not None else "mean")
    return loss if num_items_in_batch is None else loss / num_items_in_batch


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_causal_loss_is_transformers(device):
    logits = torch.randn(3, 7, 50, device=device).to(torch.bfloat16)
    labels = torch.randint(0, 50, (3, 7), device=device)
    labels[0, 2] = -100
    for kwargs in [{}, {"num_items_in_batch": torch.tensor(11, device=device)}, {"num_items_in_batch": 11}]:
        got = crossent.hf.causal_lm_loss(logits, labels, vocab_size=50, **kwargs)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, _written_out(logits, labels, kwargs.get("num_items_in_batch")))
    shift = F.pad(labels, (0, 1), value=-100)[..., 1:]
    assert torch.equal(crossent.hf.causal_lm_loss(logits, None, shift_labels=shift, ignore_index=-100),
                       crossent.hf.causal_lm_loss(logits, labels))
    ignored = torch.full_like(labels, 5)
    torch.testing.assert_close(crossent.hf.causal_lm_loss(logits, ignored, ignore_index=5), torch.tensor(float("nan"), device=device), equal_nan=True)


def test_the_causal_loss_is_transformers_own_where_it_is_installed():
    loss_utils = pytest.importorskip("transformers.loss.loss_utils")
    logits = torch.randn(2, 9, 40).to(torch.bfloat16)
    labels = torch.randint(0, 40, (2, 9))
    labels[1, :4] = -100
    for kwargs in [{}, {"num_items_in_batch": torch.tensor(13)}]:
        want = loss_utils.ForCausalLMLoss(logits, labels, vocab_size=40, **kwargs)
        got = crossent.hf.causal_lm_loss(logits, labels, vocab_size=40, **kwargs)
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_a_model_without_loss_function_is_refused():
    with pytest.raises(RuntimeError, match="no loss_function"):
        crossent.hf.use_crossent(torch.nn.Linear(2, 2))


def test_a_gpt2_with_its_head_in_the_loss_is_transformers_gpt2():
    """use_crossent(model, head=True), in float64 on the CPU: with labels (a few ignored, and with
    num_items_in_batch) the loss and every parameter's gradient are the model's own, and no logits
    come back; without labels the model is as it was."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=300, n_positions=32, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    theirs = transformers.GPT2LMHeadModel(config).double()
    ours = transformers.GPT2LMHeadModel(config).double()
    ours.load_state_dict(theirs.state_dict())
    assert crossent.hf.use_crossent(ours, head=True, chunk_size=7) is ours
    tokens = torch.randint(0, 300, (3, 20))
    labels = tokens.masked_fill(torch.rand(3, 20) < 0.2, -100)
    for kwargs in [{}, {"num_items_in_batch": torch.tensor(41)}]:
        want, got = theirs(input_ids=tokens, labels=labels, **kwargs), ours(input_ids=tokens, labels=labels, **kwargs)
        assert got.logits is None and got.loss.dtype == torch.float32
        torch.testing.assert_close(got.loss, want.loss, rtol=1e-6, atol=0)
        want.loss.backward(), got.loss.backward()
        for (name, a), b in zip(theirs.named_parameters(), ours.parameters()):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=1e-9, msg=name)
            a.grad = b.grad = None
    assert torch.equal(ours(input_ids=tokens).logits, theirs(input_ids=tokens).logits)


def test_the_fused_head_follows_the_model_it_is_on():
    """A deep copy computes with its own weights; return_dict=False gives a tuple, the base's outputs
    in it; a config's logit cap is the loss's softcap; a config that scales the logits, or a head with
    hooks, is refused."""
    transformers = pytest.importorskip("transformers")
    import copy
    config = transformers.GPT2Config(vocab_size=100, n_positions=16, n_embd=8, n_layer=1, n_head=2, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = crossent.hf.use_crossent(transformers.GPT2LMHeadModel(config).double(), head=True)
    tokens = torch.randint(0, 100, (2, 12))
    twin = copy.deepcopy(model)
    before = twin(input_ids=tokens, labels=tokens).loss
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    assert torch.equal(twin(input_ids=tokens, labels=tokens).loss, before)
    as_tuple = model(input_ids=tokens, labels=tokens, return_dict=False)
    assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], model(input_ids=tokens, labels=tokens).loss)
    model.config.return_dict = False  # a tuple still, with the base's cache and hidden states
    loss, cache, hidden = model(input_ids=tokens, labels=tokens, use_cache=True, output_hidden_states=True)
    assert torch.equal(loss, as_tuple[0]) and cache is not None and len(hidden) == config.n_layer + 1
    model.config.return_dict = True  # (the config the models below share)

    capped = transformers.GPT2LMHeadModel(config).double()
    capped.config.final_logit_softcapping = 3.0
    logits = capped(input_ids=tokens).logits  # GPT-2 does not cap them itself: the loss's softcap does
    want = crossent.cross_entropy(logits[:, :-1].reshape(-1, 100), tokens[:, 1:].reshape(-1), softcap=3.0).float()
    got = crossent.hf.use_crossent(capped, head=True)(input_ids=tokens, labels=tokens).loss
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)

    scaled = transformers.GPT2LMHeadModel(config)
    scaled.config.logits_scaling = 4.0  # Granite's
    with pytest.raises(RuntimeError, match="logits_scaling"):
        crossent.hf.use_crossent(scaled, head=True)
    hooked = transformers.GPT2LMHeadModel(config)
    hooked.lm_head.register_forward_pre_hook(lambda module, args: None)
    with pytest.raises(RuntimeError, match="hooks"):
        crossent.hf.use_crossent(hooked, head=True)


@pytest.mark.gpu
def test_a_gpt2_trains_with_it_as_with_transformers_loss():
    """A model given the loss by use_crossent learns the task with less memory. Its loss curve stays
    within 3 times the distance rounding alone makes (a float64 loss's) from transformers' own; with
    the head in the loss, one step's gradient is at least as close to a float64 head's as
    transformers' (which rounds the head's gradient to bfloat16 under autocast): the curve of a more
    exact gradient drifts from transformers' as far as training amplifies it. (The bounds hold on an
    H200 with torch 2.11 and transformers 5.17: bench/results/h200_hf_gpt2.json.)"""
    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import hf_gpt2

    runs = hf_gpt2.run()["runs"]
    theirs = runs["transformers"]
    print({name: (r["distance"], r["gradient_error"], r["peak_bytes"], r["step_ms"]) for name, r in runs.items()})
    learned = math.log(hf_gpt2.WORDS) + 0.5  # log(vocab_size) at the start, log(WORDS) once the words are known
    assert theirs["losses"][-1] < learned
    assert runs["crossent"]["distance"] <= max(3 * runs["float64"]["distance"], 1e-3)
    assert runs["crossent head"]["gradient_error"] <= theirs["gradient_error"]
    for name in ("crossent", "crossent head"):  # the loss alone; the head and the loss in chunks
        assert runs[name]["losses"][-1] < learned, name
        assert runs[name]["peak_bytes"] < theirs["peak_bytes"], name
