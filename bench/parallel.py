#!/usr/bin/env python3
"""The vocabulary-parallel loss against its floor, per rank: a copy of the rank's slice of the logits
plus the one all-gather alone.

    torchrun --nproc_per_node 2 bench/parallel.py [--shapes 8192x131072,16384x256000] [--trials 20]
                                                  [--out bench/results/h200x2_parallel]

For each N x V (bf16, V split evenly, 10% of the targets ignored), the median over `trials` of
CUDA-event timings on each rank, after a barrier: y.copy_(x) of the slice; the all-gather of N x 2
float32; and vocab_parallel_cross_entropy's forward and backward into the slice's gradient, with its
agreement with the gathered logits' loss (rank 0 checks it against float32's, to a bfloat16 rounding).
Rank 0 writes a table and OUT.json (rows N, V, ranks, impl, median_ms per rank, ...).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import crossent  # noqa: E402
from crossent import parallel  # noqa: E402

SHAPES = [(8192, 131072), (16384, 256000)]


def median_ms(fn, trials):
    times = []
    for _ in range(trials + 2):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[2:])


def shape_rows(n, vocab, trials):
    rank, world = dist.get_rank(), dist.get_world_size()
    size = vocab // world
    start = rank * size
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, size, device="cuda", generator=generator).bfloat16().requires_grad_()
    t = torch.randint(0, vocab, (n,), device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    t[torch.rand(n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(2)) < 0.1] = -100
    y = torch.empty_like(x)
    stats, gathered = torch.randn(n * 2, device="cuda"), torch.empty(world * n * 2, device="cuda")

    def step():
        x.grad = None
        parallel.vocab_parallel_cross_entropy(x, t, start, vocab).backward()

    times = {"copy": median_ms(lambda: y.copy_(x.detach()), trials),
             "all-gather": median_ms(lambda: parallel._all_gather(gathered, stats), trials),
             "crossent": median_ms(step, trials)}
    correct = None
    loss = parallel.vocab_parallel_cross_entropy(x, t, start, vocab).float()
    pieces = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(pieces, x.detach())
    if rank == 0:  # the loss is bfloat16, as the logits: within a rounding of float32's
        want = crossent.cross_entropy(torch.cat(pieces, 1).float(), t)
        correct = bool(torch.allclose(loss, want, rtol=torch.finfo(torch.bfloat16).eps, atol=0))
    everyone = [None] * world
    dist.all_gather_object(everyone, times)
    rows = []
    for impl in times:
        per_rank = [r[impl] for r in everyone]
        rows.append({"N": n, "V": vocab, "ranks": world, "dtype": "bfloat16", "impl": impl, "median_ms": per_rank,
                     "correct": correct if impl == "crossent" else None, "device": torch.cuda.get_device_name(),
                     "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")})
    if rank == 0:
        floor = [c + g for c, g in zip(rows[0]["median_ms"], rows[1]["median_ms"])]
        for r in rows:
            print(f"  {n} x {vocab} over {world} {r['impl']:10s} " + " ".join(f"{v:8.3f}" for v in r["median_ms"]) +
                  (f"  {max(a / b for a, b in zip(r['median_ms'], floor)):.2f}x copy + all-gather"
                   if r["impl"] == "crossent" else ""), flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", help="NxV,... (default: SHAPES)")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--out", help="rank 0 writes OUT.json")
    args = ap.parse_args(argv)
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    if any(vocab % dist.get_world_size() for _, vocab in shapes):
        ap.error(f"each V must split evenly over the {dist.get_world_size()} ranks: {shapes}")
    rows = []
    for n, vocab in shapes:
        rows += shape_rows(n, vocab, args.trials)
    if args.out and dist.get_rank() == 0:
        with open(args.out + ".json", "w") as f:
            json.dump(rows, f, indent=1)
    ok = all(r["correct"] is not False for r in rows)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
