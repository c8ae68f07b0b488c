#!/usr/bin/env python3
"""The training step against its floor and quack's one kernel, in one process, by triton's do_bench
(its median: the L2 cleared before each run, and no synchronization between runs, so that the GPU sets
the pace wherever the host keeps ahead).

    python3 bench/step.py [--shapes 32768x4096:float32,...] [--json bench/results/h200_step.json]

At each shape: y.copy_(x) of the logits (the step's floor: one read and one write); this package's
step (cross_entropy, then loss.backward() into the logits' gradient) with the defaults and with each
option of OPTIONS (reduction none's incoming gradient: ones, each row's own); and, where quack-kernels
is installed, quack's one-kernel call (cross_entropy_fwd with return_dx: each row's loss and the
gradient of their sum, with no mean and no autograd), the peers' fastest step on these GPUs.
"""
import argparse
import datetime
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the package, uninstalled too

import crossent  # noqa: E402

# Issue-tracked shapes: KernelBench's in both precisions, the LLM vocabularies, and the short rows.
SHAPES = [(32768, 4096, "float32"), (32768, 4096, "bfloat16"), (16384, 32000, "bfloat16"),
          (8192, 128256, "bfloat16"), (4096, 256000, "bfloat16"), (8192, 50257, "bfloat16"),
          (65536, 1000, "bfloat16")]
# cross_entropy's keyword arguments; "weight" stands for random class weights of the logits' dtype.
OPTIONS = {"defaults": {}, "class weights": {"weight": None}, "label smoothing": {"label_smoothing": 0.1},
           "reduction sum": {"reduction": "sum"}, "reduction none": {"reduction": "none"}}


def quack_step():
    """quack's one-kernel call (loss a row and dx), or None where quack-kernels is not installed."""
    try:
        from quack.cross_entropy import cross_entropy_fwd
    except Exception:  # not installed, or its compiler stack does not load here
        return None
    return lambda x, t: cross_entropy_fwd(x, t, return_dx=True)


def measure(n, c, dtype, quack_fn, rep):
    """{what: median ms} at one shape, the copy first."""
    from triton.testing import do_bench  # the GPU's: triton comes with CUDA builds of torch
    x = (torch.randn(n, c, device="cuda") * 2).to(dtype)
    t = torch.randint(0, c, (n,), device="cuda")
    y = torch.empty_like(x)
    leaf = x.clone().requires_grad_()
    weight = (torch.rand(c, device="cuda") + 0.5).to(dtype)
    times = {"copy": do_bench(lambda: y.copy_(x), rep=rep, return_mode="median")}
    for name, kwargs in OPTIONS.items():
        kwargs = {k: weight if k == "weight" else v for k, v in kwargs.items()}
        grad = torch.ones(n if kwargs.get("reduction") == "none" else (), device="cuda", dtype=dtype)

        def step():
            leaf.grad = None
            crossent.cross_entropy(leaf, t, **kwargs).backward(grad)
        times[name] = do_bench(step, rep=rep, return_mode="median")
    leaf.grad = None
    if quack_fn is not None:
        times["quack one kernel"] = do_bench(lambda: quack_fn(x, t), rep=rep, return_mode="median")
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", help="NxC[:dtype],... (dtype: bfloat16 where not named; default: SHAPES)")
    parser.add_argument("--rep", type=int, default=200, help="do_bench's milliseconds a figure")
    parser.add_argument("--json", help="write the results as JSON")
    args = parser.parse_args(argv)
    named = [(s.split(":") + ["bfloat16"])[:2] for s in args.shapes.split(",")] if args.shapes else []
    shapes = [(*(int(v) for v in size.split("x")), dtype) for size, dtype in named] or SHAPES
    quack_fn = quack_step()
    rows = []
    for n, c, dtype in shapes:
        times = measure(n, c, getattr(torch, dtype), quack_fn, args.rep)
        copy = times["copy"]
        rows.append({"N": n, "C": c, "dtype": dtype, "median_ms": times})
        print(f"{n} x {c} {dtype}: copy {copy:.4f} ms; " +
              "; ".join(f"{k} {v:.4f} ({v / copy:.3f}x)" for k, v in times.items() if k != "copy"), flush=True)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "date": datetime.date.today().isoformat(), "quack": quack_fn is not None, "rows": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
