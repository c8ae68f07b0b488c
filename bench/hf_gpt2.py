"""A small GPT-2 from Hugging Face transformers, built from a config (no download), trained from the
same weights on the same batches with the same dropout masks five times: with transformers' own
loss, with a float64 loss, with crossent's (crossent.hf.use_crossent), with the head and its loss in
float64, and with the head in crossent's loss (use_crossent(model, head=True)). The float64 runs
measure how far rounding alone moves the loss curve from transformers' (training amplifies any
difference): the loss's rounding, and the head's and the loss's (transformers rounds the logits and
the head's gradient to bfloat16 under autocast, crossent's head keeps the gradient in float32).
crossent's curves should stay within those distances, with less memory. Each run's gradient error is
that of one step at the initial weights, the largest over the parameters of its distance from the
float64 head's gradient, relative to that gradient's norm. Prints and (--json) records
the curves, their distances, the peak memory and the time per step. tests/test_hf.py runs it and
checks it.

    python3 bench/hf_gpt2.py --json bench/results/h200_hf_gpt2.json
"""
import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the package, uninstalled too

CONFIG = dict(vocab_size=50257, n_positions=256, n_embd=256, n_layer=2, n_head=4)
BATCH, SEQUENCE, STEPS, LR, WORDS = 8, 256, 50, 3e-3, 256


def float64_loss(logits, labels, vocab_size=None, num_items_in_batch=None, ignore_index=-100, shift_labels=None,
                 **kwargs):
    """transformers' causal loss computed in float64: the rounding-free reference."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    loss = F.cross_entropy(logits.double().reshape(-1, logits.shape[-1]), shift_labels.reshape(-1),
                           ignore_index=ignore_index)
    return loss.float()


def float64_head(model):
    """The head's logits and their loss in float64, autocast or not: how far rounding alone moves the
    curve of a model whose head is in the loss."""
    head = model.lm_head

    def forward(hidden):
        with torch.autocast(hidden.device.type, enabled=False):
            return F.linear(hidden.double(), head.weight.double())

    head.forward = forward
    model.loss_function = float64_loss


def batches(steps, device):
    """Token sequences with structure to learn, over WORDS tokens spread across the vocabulary: each
    token is a fixed function of the one before, one time in ten a random word instead. A model
    learns the words within the run (the loss falls from log(vocab_size) toward log(WORDS)), so a
    loss with wrong gradients shows as a curve far from the others."""
    generator = torch.Generator().manual_seed(0)
    words = torch.randperm(CONFIG["vocab_size"], generator=generator)[:WORDS]
    follow = torch.zeros(CONFIG["vocab_size"], dtype=torch.long)
    follow[words] = words[torch.randperm(WORDS, generator=generator)]
    out = []
    for _ in range(steps):
        tokens = torch.empty(BATCH, SEQUENCE, dtype=torch.long)
        tokens[:, 0] = words[torch.randint(0, WORDS, (BATCH,), generator=generator)]
        noise = torch.rand(BATCH, SEQUENCE, generator=generator) < 0.1
        random = words[torch.randint(0, WORDS, (BATCH, SEQUENCE), generator=generator)]
        for i in range(1, SEQUENCE):
            tokens[:, i] = torch.where(noise[:, i], random[:, i], follow[tokens[:, i - 1]])
        out.append(tokens.to(device))
    return out


def _model(put_loss, initial, device):
    """The model from the initial weights, with its loss as put_loss(model) puts it (None: transformers'
    own)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(**CONFIG)).to(device)
    model.load_state_dict(initial)
    if put_loss is not None:
        put_loss(model)
    return model


def train(put_loss, initial, data, device):
    """Loss per step, peak memory (bytes) and mean time per step after the first five."""
    torch.manual_seed(1)  # the same dropout masks in every run: the losses alone differ
    model = _model(put_loss, initial, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, times = [], []
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for tokens in data:
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
    return {"losses": losses, "peak_bytes": torch.cuda.max_memory_allocated(), "step_ms": 1e3 * sum(times[5:]) / len(times[5:])}


def first_gradients(put_loss, initial, tokens, device):
    """Every parameter's gradient of the loss of one batch at the initial weights, without dropout:
    rounding's effect on one step, before training amplifies it."""
    model = _model(put_loss, initial, device).eval()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    return {name: p.grad for name, p in model.named_parameters()}


def run(steps=STEPS):
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    import crossent.hf

    device = torch.device("cuda")
    torch.manual_seed(0)
    initial = GPT2LMHeadModel(GPT2Config(**CONFIG)).state_dict()
    data = batches(steps, device)
    losses = {"transformers": None,
              "float64": lambda model: setattr(model, "loss_function", float64_loss),
              "crossent": crossent.hf.use_crossent,
              "float64 head": float64_head,
              "crossent head": lambda model: crossent.hf.use_crossent(model, head=True)}
    runs = {name: train(put_loss, initial, data, device) for name, put_loss in losses.items()}
    exact = first_gradients(float64_head, initial, data[0], device)
    for name, put_loss in losses.items():
        grads = exact if put_loss is float64_head else first_gradients(put_loss, initial, data[0], device)
        runs[name]["gradient_error"] = max(((grads[p] - g).norm() / g.norm()).item() for p, g in exact.items())
        runs[name]["distance"] = max(abs(a - b) for a, b in zip(runs[name]["losses"], runs["transformers"]["losses"]))
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
            "date": datetime.date.today().isoformat(), "config": CONFIG, "batch": BATCH, "sequence": SEQUENCE,
            "steps": steps, "autocast": "bfloat16", "runs": runs}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    result = run(args.steps)
    for name, r in result["runs"].items():
        print(f"{name:12s} first {r['losses'][0]:.4f} last {r['losses'][-1]:.4f} distance {r['distance']:.2e} "
              f"gradient error {r['gradient_error']:.2e} peak {r['peak_bytes'] / 2**20:.0f} MiB "
              f"step {r['step_ms']:.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
