"""Host time per call against eager PyTorch's, in one process: the forward and the training step (the
loss and its backward into the logits' gradient), with the defaults and with each option, on logits
small enough that the GPU waits on the host (1024 x 1000 bf16 by default). Each figure is the least of
`rounds` rounds of `calls` calls followed by one synchronization, crossent and F.cross_entropy taking
turns within each round. KernelBench's entry (ModelNew) is timed too, for the forward; beside each step,
the step of the simplest loss there is, `x.sum()` (a reduction, whose backward is a view and the
gradient's accumulation): what autograd's `backward()` costs the host whatever the loss.

    python3 bench/host.py --json bench/results/h200_host.json
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

import crossent  # noqa: E402

# (name, keyword arguments both losses take); "weight" stands for a tensor of class weights.
CASES = [("defaults", {}), ("class weights", {"weight": None}), ("label smoothing", {"label_smoothing": 0.1}),
         ("reduction sum", {"reduction": "sum"}), ("reduction none", {"reduction": "none"})]


def per_call_us(functions, calls, rounds):
    """{name: microseconds a call} of each function, the least of the rounds, taking turns."""
    for fn in functions.values():
        fn()
    torch.cuda.synchronize()
    best = dict.fromkeys(functions, float("inf"))
    for _ in range(rounds):
        for name, fn in functions.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            best[name] = min(best[name], (time.perf_counter() - start) / calls * 1e6)
    return best


def run(rows=1024, cols=1000, dtype=torch.bfloat16, calls=300, rounds=5):
    x = torch.randn(rows, cols, device="cuda").to(dtype)
    t = torch.randint(0, cols, (rows,), device="cuda")
    weight = (torch.rand(cols, device="cuda") + 0.5).to(dtype)
    leaf = x.clone().requires_grad_()
    unit = torch.ones((), device="cuda", dtype=dtype)
    results = []

    def sum_step():  # the cheapest loss's step: autograd's round trip and little else
        leaf.grad = None
        leaf.sum().backward(unit)

    for name, kwargs in CASES:
        kwargs = {k: weight if k == "weight" else v for k, v in kwargs.items()}
        grad = torch.ones(rows if kwargs.get("reduction") == "none" else (), device="cuda", dtype=dtype)

        def step(loss_function):
            def one():
                leaf.grad = None
                loss_function(leaf, t, **kwargs).backward(grad)
            return one

        forward = {"crossent": lambda: crossent.cross_entropy(x, t, **kwargs),
                   "eager": lambda: F.cross_entropy(x, t, **kwargs)}
        if not kwargs:
            model = crossent.ModelNew()
            forward["ModelNew"] = lambda: model(x, t)
        steps = {"crossent": step(crossent.cross_entropy), "eager": step(F.cross_entropy), "x.sum()": sum_step}
        for kind, functions in (("forward", forward), ("step", steps)):
            us = per_call_us(functions, calls, rounds)
            results.append({"case": name, "kind": kind, **{f"{k}_us": v for k, v in us.items()}})
            print(f"{name:16s} {kind:8s} " + "  ".join(f"{k} {v:6.1f} us" for k, v in us.items()), flush=True)
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": datetime.date.today().isoformat(),
            "shape": [rows, cols], "dtype": str(dtype).replace("torch.", ""), "calls": calls, "rounds": rounds,
            "host": results}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="1024x1000", help="RxC of the logits (default 1024x1000)")
    parser.add_argument("--dtype", default="bf16", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the results as JSON")
    args = parser.parse_args(argv)
    rows, cols = (int(v) for v in args.shape.lower().split("x"))
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    result = run(rows, cols, dtype, args.calls, args.rounds)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
