#!/usr/bin/env python3
"""Two versions of model_new.py, the bundle of the crossent package, side by side in one process: the
same bits, and the same speed?

    git show HEAD~1:model_new.py > /tmp/base.py
    python bench/ab.py /tmp/base.py [--candidate model_new.py] [--candidate-sm75] [--no-bitwise]
                       [--no-timing] [--shapes 32768x4096,...] [--dtypes float32,bfloat16] [--passes 3]
                       [--json OUT]

Bitwise: both versions take the GPU suite's inputs (tests/cases.py: every shape, dtype, target
type and view, each under the policy's load kind and under both kinds forced) and must return the
same bits; and the options build's (OPTION_SETS: every option, probability targets, inputs (N, C, d1,
..., dk), the returned lse, and the gradients of a training step, fused or not). Where they differ,
the error of each against float64 is printed where there is one.
Timing: KernelBench's cuda_event method (256 MB L2 flush before each trial, 100 trials), the
baseline, the candidate and a plain streaming read of the same logits interleaved in each of
`passes` passes; the best pass's mean (KernelBench's figure) and median of each are kept. A
candidate whose median is slower by more than 1%, or by 0.5 us where the baseline takes under
50 us, is flagged (the median, since a host delay in one trial moves the mean by microseconds).
--train times the training step (the loss, then backward into the logits' gradient) the same way, at
TRAIN_SHAPES, beside a copy of the logits (the read and the write a step must make).
Host: the dispatch's host time per call, on a problem whose kernel is shorter than it.
--candidate-sm75 runs the candidate as a T4-class GPU gets it, on this GPU: its code built as
compute_75 PTX (the driver compiles it for this GPU) and planned with sm_75's rules.
"""
import argparse
import functools
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.utils.cpp_extension as cpp_extension

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import run_eval  # noqa: E402
from cases import DTYPES, PATHS, SHAPES, expected_loss, logits, targets, views  # noqa: E402
from sweep import TRAIN_SHAPES  # noqa: E402  (the training sweep's shapes, with their dtypes)

# The sweep's shapes and the awkward ones the design record names: rows off the 16-byte grid, just
# over a power of two of vectors, with a short last batch, split rows.
TIMING_SHAPES = [(32768, 4096), (4096, 32000), (8192, 50257), (8192, 128256), (16, 256000), (1000000, 10),
                 (65536, 1000), (1, 4096), (4096, 129), (16368, 4100), (61008, 1100), (8192, 16001), (4096, 32001),
                 (20000, 6001), (3001, 5003), (262144, 250), (2000000, 24)]


def load_version(path, tag):
    """model_new.py at `path` as a module of its own, its extensions built under names of their own: the
    bundle imports load_inline and _get_build_directory by name as it runs, so the tagged ones it takes
    then serve its build at import and its later (options) build alike."""
    load_inline, build_directory = cpp_extension.load_inline, cpp_extension._get_build_directory

    @functools.wraps(load_inline)
    def tagged(*args, name, **kwargs):
        return load_inline(*args, name=f"{name}_{tag}", **kwargs)

    cpp_extension.load_inline = tagged
    cpp_extension._get_build_directory = lambda name, verbose: build_directory(f"{name}_{tag}", verbose)
    spec = importlib.util.spec_from_file_location(f"model_new_{tag}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    finally:  # a version that fails to build leaves cpp_extension as it was
        cpp_extension.load_inline, cpp_extension._get_build_directory = load_inline, build_directory
    module.policy_evict_first = module._evict_first
    return module


def as_sm75(module):
    """module running the code and the plans a compute capability 7.5 GPU gets, on this GPU."""
    sm75 = module._build((("75", "compute_75"),))
    module.default_extension = lambda: sm75
    gpu = module.device_gpu(torch.cuda.current_device())._replace(cc=75)
    module.device_gpu = lambda _: gpu
    forget_plans(module)
    return module


def build_times(versions, extensions_dir):
    """Seconds for each cold import, each in a process of its own that has initialized CUDA first
    (as a harness has), into an empty extensions folder: on every core, alternating, then pinned
    to 4 cores. The last builds land in extensions_dir, for this process to load."""
    runs = [(tag, None) for _ in range(2) for tag in versions] + [(tag, "0-3") for tag in versions]
    times = []
    for k, (tag, cores) in enumerate(runs):
        last = k >= len(runs) - len(versions)
        folder = extensions_dir if last else tempfile.mkdtemp(prefix="ab_build_")
        code = (f"import sys, time, torch\nsys.path.insert(0, {os.path.join(ROOT, 'bench')!r})\ntorch.cuda.init()\n"
                f"import ab\nt = time.perf_counter()\nab.load_version({versions[tag]!r}, {tag!r})\n"
                f"print(time.perf_counter() - t)")
        command = (["taskset", "-c", cores] if cores else []) + [sys.executable, "-c", code]
        proc = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, TORCH_EXTENSIONS_DIR=folder))
        if proc.returncode:
            raise RuntimeError(proc.stderr[-3000:])
        seconds = float(proc.stdout.strip().splitlines()[-1])
        times.append({"version": tag, "cores": cores or f"all {os.cpu_count()}", "seconds": seconds})
        print(f"  cold import, {tag}, {times[-1]['cores']} cores: {seconds:.1f} s", flush=True)
    return times


def force_loads(module, evict_first):
    """The policy's kind of load (None), or one forced on every plan."""
    module._evict_first = module.policy_evict_first if evict_first is None else lambda *_, forced=evict_first: forced
    forget_plans(module)


def forget_plans(module):
    """Drops the plans a version keeps: its problems (forget_problems), or where it has none, the cache
    of its plan_on."""
    forget = getattr(module, "forget_problems", None)
    (forget or module.plan_on.cache_clear)()


def bits(x):
    return x.view(torch.int16 if x.element_size() == 2 else torch.int32)


# The options build's calls: cross_entropy's keyword arguments, "probs" for probability targets,
# "kdim" for logits (N, C, 4, 4) (rows N * 16, classes strided), "train" for the gradients of a step
# whose incoming gradient is random ("lse": through the returned lse too).
OPTION_SETS = {
    "sum": dict(reduction="sum"), "none": dict(reduction="none"), "weight": dict(weight=True),
    "ignore 3": dict(ignore_index=3), "smoothing": dict(label_smoothing=0.1),
    "weight+smoothing": dict(weight=True, label_smoothing=0.2), "z_loss+lse": dict(z_loss=1e-3, return_lse=True),
    "softcap": dict(softcap=20.0), "probs": dict(probs=True), "probs+weight+smoothing": dict(probs=True, weight=True,
                                                                                            label_smoothing=0.1),
    "kdim": dict(kdim=True), "train": dict(train=True), "train sum": dict(train=True, reduction="sum"),
    "train none": dict(train=True, reduction="none"), "train weight+smoothing": dict(train=True, weight=True,
                                                                                      label_smoothing=0.1),
    "train softcap": dict(train=True, softcap=30.0), "train probs": dict(train=True, probs=True),
    "train kdim": dict(train=True, kdim=True), "train lse": dict(train=True, z_loss=1e-4, return_lse=True, lse=True),
}


def loss_of(module):
    """A version's loss with cross_entropy's keywords: its cross_entropy where the bundle has one, else
    (the bundle of the package's kernel path) kernel_loss with the options checked."""
    if hasattr(module, "cross_entropy"):
        return module.cross_entropy

    def loss(x, t, inplace=False, **kwargs):
        return module.kernel_loss(x, t, module.check_options(**kwargs), False, inplace)
    return loss


def option_outputs(module, x, t, w, opts, seed):
    """What one version returns for one option set: its outputs, and the gradients where it trains."""
    kwargs = {k: v for k, v in opts.items() if k not in ("probs", "kdim", "train", "weight", "lse")}
    if opts.get("weight"):
        kwargs["weight"] = w
    x = x.detach().clone().requires_grad_(bool(opts.get("train")))
    y = x * 1 if opts.get("train") else x  # not a leaf, as a model's logits
    out = loss_of(module)(y, t, **kwargs)
    outs = list(out) if isinstance(out, tuple) else [out]
    if opts.get("train"):
        generator = torch.Generator(device=x.device).manual_seed(seed)
        total = sum((o.float() * torch.rand(o.shape, device=x.device, generator=generator)).sum()
                    for o in outs[:2 if opts.get("lse") else 1])
        total.backward()
        outs.append(x.grad)
    return [o.detach() for o in outs]


def bitwise_options(base, cand):
    """(cases, mismatches): both versions' options build on every option set, shapes of each family."""
    cases = mismatches = 0
    for rows, cols in [(4096, 129), (300, 1000), (64, 5000), (4000, 4096), (16, 32003), (1, 4096), (1000, 10)]:
        for dname, dtype in DTYPES.items():
            for name, opts in OPTION_SETS.items():
                shape = (rows, cols, 4, 4) if opts.get("kdim") else (rows, cols)
                x = (torch.randn(shape, device="cuda") * 4).to(dtype)
                w = (torch.rand(cols, device="cuda") + 0.5).to(dtype)
                if opts.get("probs"):
                    t = torch.softmax(torch.randn(shape, device="cuda"), 1).to(dtype)
                else:
                    t = torch.randint(0, cols, shape[:1] + shape[2:], device="cuda")
                seed = cases
                a, b = option_outputs(base, x, t, w, opts, seed), option_outputs(cand, x, t, w, opts, seed)
                cases += 1
                if any(not torch.equal(bits(p), bits(q)) for p, q in zip(a, b)) or len(a) != len(b):
                    mismatches += 1
                    print(f"  differ: {rows} x {cols} {dname} {name}", flush=True)
    return cases, mismatches


def bitwise(base, cand):
    """(cases, mismatches): both versions on the GPU suite's inputs."""
    shapes = list(dict.fromkeys(SHAPES + list(PATHS.values()) + [(300, 1000), (64, 4099), (5, 33), (4001, 4096),
                                                                   (1000, 7600), (1500, 1100), (1000, 5000)]))
    cases = mismatches = 0
    for evict_first in (None, True, False):
        for module in (base, cand):
            force_loads(module, evict_first)
        for dname, dtype in DTYPES.items():
            for tdtype in (torch.int64, torch.int32):
                for rows, cols in shapes:
                    if rows * cols > 2**26:
                        rows = max(1, 2**26 // cols)
                    t = targets(rows, cols, tdtype)
                    if rows > 2:
                        t[1::7] = -100
                    inputs = [("contiguous", logits(rows, cols, dtype))]
                    if rows and cols > 1:
                        inputs += views(rows, cols, dtype)
                    for view, x in inputs:
                        a, b = base.ModelNew()(x, t), cand.ModelNew()(x, t)
                        cases += 1
                        if not torch.equal(bits(a), bits(b)):
                            mismatches += 1
                            ref = expected_loss(x, t).item()
                            print(f"  differ: {rows} x {cols} {dname} {tdtype} {view} loads={evict_first}: "
                                  f"baseline {a.item()!r} (error {abs(a.item() - ref):.3g}), "
                                  f"candidate {b.item()!r} (error {abs(b.item() - ref):.3g})", flush=True)
    for module in (base, cand):
        force_loads(module, None)
    return cases, mismatches


def timing(base, cand, cases, trials, passes, train=False):
    """KernelBench-timed rows, each (N, C, dtype) of `cases`: per implementation the best pass's mean and
    the best pass's median; `train`, of the training step beside a copy of the logits."""
    device = torch.device("cuda")
    if train:
        impls = {"floor": run_eval.copy_fn(), "baseline": run_eval.training_step(loss_of(base)),
                 "candidate": run_eval.training_step(loss_of(cand))}
    else:
        impls = {"floor": run_eval.stream_read_fn(device), "baseline": base.ModelNew(), "candidate": cand.ModelNew()}
    rows = []
    for n, c, dname in cases:
        x = torch.randn(n, c, device=device).to(DTYPES[dname]).requires_grad_(train)
        t = torch.randint(0, c, (n,), device=device)
        mean, median = {}, {}
        for p in range(passes):
            for name in (list(impls) if p % 2 == 0 else list(reversed(impls))):
                times = run_eval.time_cuda_event(impls[name], [x, t], device, trials=trials)
                mean[name] = min(mean.get(name, float("inf")), statistics.fmean(times))
                median[name] = min(median.get(name, float("inf")), statistics.median(times))
        b, k = median["baseline"], median["candidate"]
        slower = k > b * 1.01 if b >= 0.05 else k > b + 0.0005
        rows.append({"N": n, "C": c, "dtype": dname, "train": train, **{f"{i}_mean_ms": mean[i] for i in impls},
                     **{f"{i}_median_ms": median[i] for i in impls}, "flagged": slower})
        print(f"  {n:>8d} x {c:<7d} {dname:>9s}  mean: floor {mean['floor']:.4f} baseline {mean['baseline']:.4f} "
              f"candidate {mean['candidate']:.4f} ({1e3 * (mean['candidate'] - mean['baseline']):+6.2f} us)  median: "
              f"{median['floor']:.4f} {b:.4f} {k:.4f} ({1e3 * (k - b):+6.2f} us){'  SLOWER' if slower else ''}", flush=True)
        del x, t
        torch.cuda.empty_cache()
    return rows


def host_time(base, cand, calls=2000, rounds=5):
    """Microseconds of host time per call, the least of `rounds` rounds of `calls` calls on a one-row
    problem, whose kernel takes less time than its dispatch: what the dispatch costs the host."""
    x, t = torch.randn(1, 4096, device="cuda"), torch.randint(0, 4096, (1,), device="cuda")
    best = {}
    for _ in range(rounds):
        for name, module in (("baseline", base), ("candidate", cand)):
            model = module.ModelNew()
            model(x, t)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                model(x, t)
            torch.cuda.synchronize()
            best[name] = min(best.get(name, float("inf")), (time.perf_counter() - start) / calls * 1e6)
    print(f"host time per call: baseline {best['baseline']:.1f} us, candidate {best['candidate']:.1f} us", flush=True)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("baseline", help="path to the baseline model_new.py")
    ap.add_argument("--candidate", default=os.path.join(ROOT, "model_new.py"))
    ap.add_argument("--candidate-sm75", action="store_true", help="the candidate as sm_75 gets it (as_sm75)")
    ap.add_argument("--no-bitwise", action="store_true")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--train", action="store_true", help="also time the training step at TRAIN_SHAPES")
    ap.add_argument("--build-times", action="store_true", help="time cold imports of both first (6 builds)")
    ap.add_argument("--shapes", help="comma-separated NxC (default: the sweep's and the awkward ones)")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args(argv)

    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__}", flush=True)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "baseline": os.path.relpath(args.baseline, ROOT), "candidate": os.path.relpath(args.candidate, ROOT)}
    if args.build_times:
        folder = tempfile.mkdtemp(prefix="ab_build_")
        report["build_times"] = build_times({"baseline": args.baseline, "candidate": args.candidate}, folder)
        os.environ["TORCH_EXTENSIONS_DIR"] = folder
    base, cand = load_version(args.baseline, "baseline"), load_version(args.candidate, "candidate")
    if args.candidate_sm75:
        cand = as_sm75(cand)
    failed = False
    if not args.no_bitwise:
        cases, mismatches = bitwise(base, cand)
        print(f"bitwise, the default build: {cases} cases, {mismatches} differ", flush=True)
        options_cases, options_mismatches = bitwise_options(base, cand)
        print(f"bitwise, the options build: {options_cases} cases, {options_mismatches} differ", flush=True)
        report.update(bitwise_cases=cases, bitwise_mismatches=mismatches, bitwise_options_cases=options_cases,
                      bitwise_options_mismatches=options_mismatches)
        failed |= mismatches > 0 or options_mismatches > 0
    if not args.no_timing:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else TIMING_SHAPES
        rows = timing(base, cand, [(n, c, d) for n, c in shapes for d in args.dtypes.split(",")], args.trials,
                      args.passes)
        if args.train:
            rows += timing(base, cand, TRAIN_SHAPES, args.trials, args.passes, train=True)
        flagged = [r for r in rows if r["flagged"]]
        print(f"timing: {len(rows)} shapes, {len(flagged)} slower than the gate allows", flush=True)
        report["timing"] = rows
        report["host_us"] = host_time(base, cand)
        failed |= bool(flagged)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
