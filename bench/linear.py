#!/usr/bin/env python3
"""Linear + cross-entropy against its floor, the matmuls, in one process.

    python bench/linear.py [--shapes 8192x4096x128256,...] [--trials 20] [--chunks 2048,8192] [--out bench/results/h200_linear]

For each N x D x V (bf16 x (N, D), W (V, D), 10% of the targets ignored), the median of `trials`
CUDA-event timings of:
  matmuls        x W^T, G W and G^T x alone (G: N x V, made once), the step's floor
  crossent       crossent.linear_cross_entropy, forward and backward into x and W
  inplace        F.linear, then crossent.cross_entropy(inplace=True) over its logits
  eager          F.linear, then F.cross_entropy
  matmul fwd     x W^T alone, the floor of a forward with no gradient
  crossent fwd   linear_cross_entropy under torch.no_grad()
and, for each of --chunks' row counts, linear_cross_entropy with chunk_size that many rows ("crossent
2048"; the library's own choice is "crossent"), with the memory each step allocates at once above its inputs (peak_extra_bytes: the gradients dx and
dW included), and whether its loss and gradients match eager's (bf16's tolerance). Writes a table,
OUT.json (rows N, D, V, impl, median_ms, floor_ms, peak_extra_bytes, correct, ...) and, where
matplotlib is installed, OUT.png.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import crossent  # noqa: E402
import run_eval  # noqa: E402
from sweep import can_plot, peak_extra_bytes, pyplot  # noqa: E402

# PEERS.md's shapes, and quack's published one (4096 x 4096 x 128256).
SHAPES = [(8192, 4096, 128256), (8192, 2304, 256000), (16384, 2048, 128256), (4096, 4096, 128256)]
TODAY = time.strftime("%Y-%m-%d")


def operands(n, d, v):
    x = torch.randn(n, d, device="cuda").bfloat16().requires_grad_()
    w = (torch.randn(v, d, device="cuda") / d**0.5).bfloat16().requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda")
    t[torch.rand(n, device="cuda") < 0.1] = -100
    return x, w, t


def steps(x, w, t, chunks=()):
    """Each implementation as a callable of no arguments, which leaves what it computed."""
    g = torch.randn(x.shape[0], w.shape[0], device="cuda").bfloat16()

    def matmuls():
        return torch.mm(x, w.t()), torch.mm(g, w), torch.mm(g.t(), x)

    def train(loss_of):
        def step():
            x.grad = w.grad = None
            loss = loss_of()
            loss.backward()
            return loss.detach(), x.grad, w.grad
        return step

    def forward(loss_of):
        def step():
            with torch.no_grad():
                return loss_of(),
        return step

    fused = lambda: crossent.linear_cross_entropy(x, w, t)  # noqa: E731
    inplace = lambda: crossent.cross_entropy(F.linear(x, w), t, inplace=True)  # noqa: E731
    eager = lambda: F.cross_entropy(F.linear(x, w), t)  # noqa: E731
    fns = {"matmuls": matmuls, "crossent": train(fused), "inplace": train(inplace), "eager": train(eager),
           "matmul fwd": lambda: (torch.mm(x, w.t()),), "crossent fwd": forward(fused)}
    for rows in chunks:
        fns[f"crossent {rows}"] = train(lambda rows=rows: crossent.linear_cross_entropy(x, w, t, chunk_size=rows))
    return fns


def median_ms(fn, trials):
    times = run_eval.time_cuda_event(lambda: fn(), [], torch.device("cuda"), warmup=2, trials=trials)
    return statistics.median(times)


def shape_rows(n, d, v, trials, chunks=()):
    x, w, t = operands(n, d, v)
    fns = steps(x, w, t, chunks)
    want = fns["eager"]()
    rows, times = [], {}
    for impl, fn in fns.items():
        got = fn()
        correct = None
        if impl.startswith("crossent") or impl == "inplace":
            correct = all(torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2 * b.abs().max().item())
                          for a, b in zip(got, want))
        del got
        times[impl] = median_ms(fn, trials)
        floor = "matmul fwd" if impl.endswith("fwd") else "matmuls"
        rows.append({"N": n, "D": d, "V": v, "dtype": "bfloat16", "impl": impl, "median_ms": times[impl],
                     "floor": floor, "peak_extra_bytes": peak_extra_bytes(fn, []), "correct": correct,
                     "device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": TODAY})
        x.grad = w.grad = None
    for r in rows:
        r["floor_ms"] = times[r["floor"]]
        print(f"  {n} x {d} x {v} {r['impl']:14s} {r['median_ms']:8.3f} ms  {r['median_ms'] / r['floor_ms']:5.3f}x "
              f"{r['floor']}  +{r['peak_extra_bytes'] / 2**30:5.2f} GiB  correct {r['correct']}", flush=True)
    del x, w, t, fns, want
    torch.cuda.empty_cache()
    return rows


def plot(rows, path):
    plt = pyplot()
    keys = list(dict.fromkeys((r["N"], r["D"], r["V"]) for r in rows))
    impls = [i for i in ("crossent", "inplace", "eager") if any(r["impl"] == i for r in rows)]
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 2 * len(keys)), 8))
    width = 0.8 / len(impls)
    for j, impl in enumerate(impls):
        got = {(r["N"], r["D"], r["V"]): r for r in rows if r["impl"] == impl}
        at = [i + (j - (len(impls) - 1) / 2) * width for i in range(len(keys))]
        axes[0].bar(at, [got[k]["median_ms"] / got[k]["floor_ms"] for k in keys], width, label=impl)
        axes[1].bar(at, [got[k]["peak_extra_bytes"] / 2**30 for k in keys], width, label=impl)
    for ax, label in zip(axes, ("time over the three matmuls", "GiB above the inputs")):
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([f"{n} x {d} x {v}" for n, d, v in keys], fontsize=8)
        ax.set_ylabel(label)
    axes[0].axhline(1.0, color="black", linewidth=0.8)
    axes[0].set_ylim(bottom=0.9)
    axes[0].legend()
    fig.suptitle(f"linear + cross-entropy, forward + backward, bf16: {rows[0]['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", help="NxDxV,... (default: SHAPES)")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--chunks", default="", help="ROWS,...: linear_cross_entropy also with these chunk sizes")
    ap.add_argument("--out", help="write OUT.json (and OUT.png)")
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    rows = []
    for n, d, v in shapes:
        rows += shape_rows(n, d, v, args.trials, [int(c) for c in args.chunks.split(",") if c])
        if args.out:
            with open(args.out + ".json", "w") as f:
                json.dump(rows, f, indent=1)
    if args.out and can_plot():
        plot(rows, args.out + ".png")
    return 0 if all(r["correct"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
