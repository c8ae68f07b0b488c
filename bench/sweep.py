#!/usr/bin/env python3
"""Effective bandwidth of ModelNew, eager, torch.compile and a plain streaming read, over shapes.

    python bench/sweep.py [--shapes 32768x4096,16x256000] [--dtypes float32,bfloat16] [--no-compile]
                          [--out bench/results/h100_sweep]
    python bench/sweep.py --options [--shapes ...] [--sets "softcap;sum"] [--out bench/results/h100_options]
    python bench/sweep.py --kdim [--out bench/results/h100_kdim]
    python bench/sweep.py --train [--no-compile] [--out bench/results/h100_train]

Every figure is KernelBench's cuda_event method (3 warm-ups, 256 MB L2 flush before each trial,
1 discarded + N timed trials, mean). Writes a table to stdout, OUT.json (a list of rows: N, C,
dtype, impl, mean_ms, ...) and, where matplotlib is installed, OUT.png.
--options: ModelNew with each set of OPTIONS (cross_entropy's options, the defaults first) beside
the read of the same logits and eager PyTorch with the same options where PyTorch has them, at
every sweep shape of 64 MiB or more; rows N, C, dtype, options, impl, mean_ms, floor_ms, correct.
Probability targets ("soft") are read beside the logits: their floor reads both.
--kdim: logits (N, C, d1, ..., dk) of KDIM_SHAPES, classes strided in memory, with class-index
targets: ModelNew, eager and torch.compile beside the read of the logits and the targets; rows
shape, dtype, impl, mean_ms, floor_ms, logits_floor_ms, correct.
--train: the training step (the loss, then loss.backward() into the logits' gradient) of
TRAIN_SHAPES (those of --shapes and --dtypes where given) for ModelNew, eager and torch.compile beside a copy of the logits (y.copy_(x): the
read and the write a step must make); rows N, C, dtype, impl, mean_ms, median_ms, copy_ms,
peak_extra_bytes (the step's peak allocation over its inputs) and correct (loss and gradient
against eager PyTorch's in float32); OUT.png plots time over the copy and the extra memory.
"""
import argparse
import functools
import importlib.util
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import crossent  # noqa: E402
import run_eval  # noqa: E402
from cases import DTYPES, expected_loss  # noqa: E402

SHAPES = [(32768, 4096), (4096, 32000), (8192, 50257), (8192, 128256), (16, 256000), (1000000, 10),
          (65536, 1000), (1, 4096), (4096, 129)]
TODAY = time.strftime("%Y-%m-%d")  # recorded in every row, for bench/report.py
IMPLS = ("model_new", "eager", "compile", "floor")
# The options sweep: cross_entropy's keyword arguments by name ("weight": random class weights;
# "ignore": that share of the targets set to -100). z_loss, softcap and the per-row lse are not PyTorch's.
OPTIONS = {"defaults": {}, "sum": {"reduction": "sum"}, "none": {"reduction": "none"}, "ignore 10%": {"ignore": 0.1},
           "weight": {"weight": True}, "weight, none, ignore 10%": {"weight": True, "reduction": "none", "ignore": 0.1},
           "z_loss": {"z_loss": 1e-4}, "lse": {"return_lse": True}, "label smoothing": {"label_smoothing": 0.1},
           "label smoothing, none, ignore 10%": {"label_smoothing": 0.1, "reduction": "none", "ignore": 0.1},
           "weight, label smoothing": {"weight": True, "label_smoothing": 0.1},
           "weight, label smoothing, none, ignore 10%": {"weight": True, "label_smoothing": 0.1, "reduction": "none",
                                                        "ignore": 0.1},
           "soft": {"soft": True}, "soft, none": {"soft": True, "reduction": "none"},
           "soft, weight, label smoothing": {"soft": True, "weight": True, "label_smoothing": 0.1},
           "softcap": {"softcap": 30.0}, "softcap, none, ignore 10%": {"softcap": 30.0, "reduction": "none", "ignore": 0.1}}
PYTORCH_OPTIONS = {"reduction", "weight", "ignore", "label_smoothing", "soft"}
KDIM_SHAPES = [(8, 21, 512, 512), (32, 19, 256, 512)]
OPTIONS_MIN_BYTES = 64 << 20
# The training sweep: the forward sweep's shapes of 64 MiB or more in bfloat16, the LLM vocabularies,
# and KernelBench's shape in both precisions.
TRAIN_SHAPES = [(32768, 4096, "float32"), (32768, 4096, "bfloat16"), (4096, 32000, "bfloat16"),
                (16384, 32000, "bfloat16"), (8192, 50257, "bfloat16"), (8192, 128256, "bfloat16"),
                (4096, 256000, "bfloat16"), (65536, 1000, "bfloat16")]
TRAIN_IMPLS = ("model_new", "eager", "compile", "copy")


def reference_loss(x, t):
    return torch.nn.functional.cross_entropy(x, t)


def measure(n, c, dtype_name, impls, trials, fns):
    """KernelBench-timed rows for the given implementations on one fresh (n, c) input."""
    dtype = DTYPES[dtype_name]
    device = torch.device("cuda")
    x = torch.randn(n, c, device=device).to(dtype)
    t = torch.randint(0, c, (n,), device=device)
    nbytes = x.numel() * x.element_size()
    rows = []
    for impl in impls:
        fn = fns.get(impl)
        if impl == "compile":
            torch._dynamo.reset()  # a fresh compile for each shape, as KernelBench compiles each problem
            fn = torch.compile(reference_loss, backend="inductor", mode="default", dynamic=False)
        times = run_eval.time_cuda_event(fn, [x, t], device, trials=trials)
        stats = run_eval.timing_stats(times)
        rows.append({"N": n, "C": c, "dtype": dtype_name, "impl": impl, "mean_ms": stats["mean_exact"],
                     "median_ms": statistics.median(times), "std_ms": stats["std"], "min_ms": stats["min"],
                     "max_ms": stats["max"], "trials": len(times), "bytes": nbytes,
                     "tbps": nbytes / (stats["mean_exact"] * 1e-3) / 1e12})
        if impl == "model_new":
            rows[-1]["abs_err_vs_fp64"] = (fn(x, t).double() - reference_loss(x.double(), t)).abs().item()
    del x, t
    torch.cuda.empty_cache()
    return rows


def measure_options(n, c, dtype_name, trials, floor_fn, sets=None):
    """Rows for every set of OPTIONS (or those named in `sets`) on one fresh (n, c) input: ModelNew,
    the read, and eager."""
    dtype = DTYPES[dtype_name]
    x = torch.randn(n, c, device="cuda").to(dtype)
    t0 = torch.randint(0, c, (n,), device="cuda")
    probs = torch.softmax(torch.randn(n, c, device="cuda"), 1).to(dtype)
    w = (torch.rand(c, device="cuda") + 0.5).to(dtype)
    floors = {False: timed_mean(floor_fn, [x], trials), True: timed_mean(run_eval.read_each(floor_fn), [x, probs], trials)}
    rows = []
    for name, opts in OPTIONS.items():
        if sets and name not in sets:
            continue
        t = probs if opts.get("soft") else t0.masked_fill(torch.rand(n, device="cuda") < opts.get("ignore", 0.0), -100)
        floor = floors[bool(opts.get("soft"))]
        kwargs = {k: v for k, v in opts.items() if k not in ("ignore", "soft")}
        if opts.get("weight"):
            kwargs["weight"] = w
        fns = {"model_new": functools.partial(crossent.cross_entropy, **kwargs)}
        if set(opts) <= PYTORCH_OPTIONS:
            fns["eager"] = functools.partial(torch.nn.functional.cross_entropy, **kwargs)
        got = fns["model_new"](x, t)
        loss = got[0] if opts.get("return_lse") else got
        want = expected_loss(x, t, -100, kwargs.get("reduction", "mean"), kwargs.get("weight"), kwargs.get("z_loss", 0.0),
                             kwargs.get("label_smoothing", 0.0), kwargs.get("softcap"))
        correct = torch.allclose(loss.double(), want.to(dtype).double(), rtol=2e-2 if dtype != torch.float32 else 1e-4,
                                 atol=1e-5)
        for impl, fn in fns.items():
            times = run_eval.time_cuda_event(fn, [x, t], x.device, trials=trials)
            mean = run_eval.timing_stats(times)["mean_exact"]
            rows.append({"N": n, "C": c, "dtype": dtype_name, "options": name, "impl": impl, "mean_ms": mean,
                         "median_ms": statistics.median(times), "floor_ms": floor, "fraction_of_floor": floor / mean,
                         "correct": bool(correct)})
    del x, t0, probs
    torch.cuda.empty_cache()
    return rows


def timed_mean(fn, args, trials):
    return run_eval.timing_stats(run_eval.time_cuda_event(fn, args, args[0].device, trials=trials))["mean_exact"]


def kdim_main(args):
    """KDIM_SHAPES in each dtype: ModelNew, eager and torch.compile against the read of the logits
    and the targets (and of the logits alone), each checked against float64."""
    floor_fn = run_eval.stream_read_fn(torch.device("cuda"))
    rows = []
    for shape in KDIM_SHAPES:
        for d in args.dtypes.split(","):
            x = torch.randn(shape, device="cuda").to(DTYPES[d])
            t = torch.randint(0, shape[1], shape[:1] + shape[2:], device="cuda")
            floor = timed_mean(run_eval.read_each(floor_fn), [x, t], args.trials)
            logits_floor = timed_mean(floor_fn, [x], args.trials)
            correct = torch.allclose(crossent.cross_entropy(x, t).double(), expected_loss(x, t).to(x.dtype).double(),
                                     rtol=2e-2 if x.dtype != torch.float32 else 1e-4)
            torch._dynamo.reset()
            fns = {"model_new": crossent.cross_entropy, "eager": torch.nn.functional.cross_entropy,
                   "compile": torch.compile(reference_loss, backend="inductor", mode="default", dynamic=False)}
            for impl, fn in fns.items():
                mean = min(timed_mean(fn, [x, t], args.trials) for _ in range(args.passes))
                rows.append({"shape": list(shape), "dtype": d, "impl": impl, "mean_ms": mean, "floor_ms": floor,
                             "logits_floor_ms": logits_floor, "fraction_of_floor": floor / mean, "correct": bool(correct),
                             "device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": TODAY,
                             "passes": args.passes})
                print(f"  {str(shape):20s} {d:9s} {impl:9s} {mean:.4f} ms  {100 * floor / mean:5.1f}% of the read "
                      f"(logits alone {100 * logits_floor / mean:5.1f}%)  correct {correct}", flush=True)
            del x, t
            torch.cuda.empty_cache()
            if args.out:
                with open(args.out + ".json", "w") as f:
                    json.dump(rows, f, indent=1)
    if args.out:
        save_plot(plot_kdim, rows, args.out + ".png")
    return 0 if all(r["correct"] for r in rows) else 1


def peak_extra_bytes(fn, args):
    """The most memory fn(*args) allocates at once above what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn(*args)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def train_main(args):
    """Each of TRAIN_SHAPES: the step of every implementation, its time over the copy's and its
    memory, each checked against eager PyTorch's step in float32. torch.compile in a phase of its own,
    after the others at every shape, as the forward sweep times it: its background compile workers
    slow the host of whatever is timed after them."""
    rows = []
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else None
    combos = [(n, c, d) for n, c, d in TRAIN_SHAPES
              if not (shapes and (n, c) not in shapes or d not in args.dtypes.split(","))]
    phases = [("model_new", "eager", "copy")] + ([] if args.no_compile else [("compile",)])
    for impls in phases:
        for n, c, d in combos:
            rows += train_rows(n, c, d, impls, args.trials)
            if args.out:
                with open(args.out + ".json", "w") as f:
                    json.dump(rows, f, indent=1)
    if args.out:
        save_plot(plot_train, rows, args.out + ".png")
    return 0 if all(r["correct"] for r in rows) else 1


def train_rows(n, c, d, impls, trials):
    """The training sweep's rows of `impls` at one shape, beside a copy of the logits timed first."""
    rows = []
    x = (torch.randn(n, c, device="cuda") * 2).to(DTYPES[d]).requires_grad_()
    t = torch.randint(0, c, (n,), device="cuda")
    torch._dynamo.reset()
    losses = {"model_new": crossent.cross_entropy, "eager": reference_loss}
    if "compile" in impls:
        losses["compile"] = torch.compile(reference_loss, backend="inductor", mode="default", dynamic=False)
    want_loss, want_grad = run_eval.run_model(reference_loss, [x.float(), t], backward=True)
    tol = 1e-5 if x.dtype == torch.float32 else 2e-2
    fns = {impl: run_eval.training_step(losses[impl]) if impl != "copy" else run_eval.copy_fn() for impl in impls}
    copy_ms = timed_mean(run_eval.copy_fn(), [x, t], trials)
    for impl, fn in fns.items():
        loss, grad = run_eval.run_model(losses[impl], [x, t], True) if impl != "copy" else (want_loss, want_grad)
        correct = bool(torch.allclose(loss.float(), want_loss, rtol=tol, atol=tol) and
                       torch.allclose(grad.float(), want_grad, rtol=tol, atol=tol * want_grad.abs().max()))
        del loss, grad
        x.grad = None
        times = run_eval.time_cuda_event(fn, [x, t], x.device, trials=trials)
        mean = run_eval.timing_stats(times)["mean_exact"]
        x.grad = None
        rows.append({"N": n, "C": c, "dtype": d, "impl": impl, "mean_ms": mean, "median_ms": statistics.median(times),
                     "copy_ms": copy_ms, "peak_extra_bytes": peak_extra_bytes(fn, [x, t]), "correct": correct,
                     "device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": TODAY})
        x.grad = None
        print(f"  {n} x {c} {d:9s} {impl:9s} {mean:.4f} ms  {mean / copy_ms:5.2f}x the copy  extra "
              f"{rows[-1]['peak_extra_bytes'] / (x.numel() * x.element_size()):4.2f}x the logits  correct {correct}",
              flush=True)
    del x, t, want_grad
    torch.cuda.empty_cache()
    return rows


def options_main(args, shapes):
    """Each shape's rows from the best of `passes` passes per options and implementation (the lowest
    mean, its read beside it), every pass checked against float64."""
    rows = []
    floor_fn = run_eval.stream_read_fn(torch.device("cuda"))
    for n, c in shapes:
        for d in args.dtypes.split(","):
            if n * c * DTYPES[d].itemsize < OPTIONS_MIN_BYTES:
                continue
            best = {}
            for _ in range(args.passes):
                for r in measure_options(n, c, d, args.trials, floor_fn, args.sets and args.sets.split(";")):
                    key = (r["options"], r["impl"])
                    r["correct"] = r["correct"] and best.get(key, r)["correct"]
                    if key not in best or r["mean_ms"] < best[key]["mean_ms"]:
                        best[key] = r
                    else:
                        best[key]["correct"] = r["correct"]
            new = list(best.values())
            for r in new:
                r.update(device=torch.cuda.get_device_name(), torch=torch.__version__, date=TODAY, passes=args.passes)
                print(f"  {n} x {c} {d:9s} {r['options']:34s} {r['impl']:9s} {r['mean_ms']:.4f} ms  "
                      f"{100 * r['fraction_of_floor']:5.1f}% of the read  correct {r['correct']}", flush=True)
            rows += new
            if args.out:
                with open(args.out + ".json", "w") as f:
                    json.dump(rows, f, indent=1)
    if args.out:
        save_plot(plot_options, rows, args.out + ".png")
    return 0 if all(r["correct"] for r in rows) else 1


def table(rows):
    by = {}
    for r in rows:
        by.setdefault((r["N"], r["C"], r["dtype"]), {})[r["impl"]] = r
    lines = [f"{'N x C':>16s} {'dtype':>9s} {'MiB':>7s} | {'ModelNew':>9s} {'eager':>8s} {'compile':>8s} {'floor':>8s}"
             f" | {'TB/s':>5s} {'%floor':>6s} {'x eager':>7s} {'x comp':>6s}"]
    nan = {"mean_ms": float("nan")}  # an implementation not timed (compile under --no-compile)
    for (n, c, d), r in by.items():
        m, e, k, f = (r.get(i, nan)["mean_ms"] for i in IMPLS)
        lines.append(f"{f'{n} x {c}':>16s} {d:>9s} {r['model_new']['bytes'] / 2**20:7.1f} | {m:9.4f} {e:8.4f} {k:8.4f} {f:8.4f}"
                     f" | {r['model_new']['tbps']:5.2f} {100 * f / m:6.1f} {e / m:7.2f} {k / m:6.2f}")
    return "\n".join(lines)


def can_plot():
    return importlib.util.find_spec("matplotlib") is not None


def pyplot():
    """matplotlib's pyplot, drawing to files alone."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot(rows, path, title):
    plt = pyplot()
    keys = []
    for r in rows:
        if (r["N"], r["C"], r["dtype"]) not in keys:
            keys.append((r["N"], r["C"], r["dtype"]))
    fig, ax = plt.subplots(figsize=(max(10, 0.55 * len(keys)), 5))
    width = 0.2
    for j, impl in enumerate(IMPLS):
        vals = [next((r["tbps"] for r in rows if (r["N"], r["C"], r["dtype"]) == k and r["impl"] == impl), 0.0)
                for k in keys]
        ax.bar([i + (j - 1.5) * width for i in range(len(keys))], vals, width, label=impl)
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"{n}x{c}\n{d}" for n, c, d in keys], rotation=90, fontsize=7)
    ax.set_ylabel("effective TB/s (logit bytes / mean time)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_options(rows, path):
    """--options: ModelNew's share of the read per set of options, a panel per dtype, a bar per shape."""
    plt = pyplot()
    mine = [r for r in rows if r["impl"] == "model_new"]
    dtypes = list(dict.fromkeys(r["dtype"] for r in mine))
    sets = list(dict.fromkeys(r["options"] for r in mine))
    shapes = list(dict.fromkeys((r["N"], r["C"]) for r in mine))
    got = {(r["dtype"], r["options"], r["N"], r["C"]): r["fraction_of_floor"] for r in mine}
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(max(10, 0.75 * len(sets)), 3.2 * len(dtypes)), squeeze=False)
    width = 0.8 / len(shapes)
    for ax, d in zip(axes[:, 0], dtypes):
        for j, (n, c) in enumerate(shapes):
            at = [i + (j - (len(shapes) - 1) / 2) * width for i in range(len(sets))]
            ax.bar(at, [100 * got.get((d, o, n, c), 0.0) for o in sets], width, label=f"{n} x {c}")
        ax.axhline(95, color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(sets)))
        ax.set_xticklabels(sets if ax is axes[-1, 0] else [], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(f"{d}: % of the read")
        ax.set_ylim(0, max(110, 105 * max(got.values())))
    axes[0, 0].legend(fontsize=7, ncol=len(shapes))
    fig.suptitle(f"cross-entropy forward with options, ModelNew against the read: {rows[0]['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_kdim(rows, path):
    """--kdim: each implementation's share of the read of the logits and the targets, per shape and dtype."""
    plt = pyplot()
    keys = list(dict.fromkeys((tuple(r["shape"]), r["dtype"]) for r in rows))
    impls = [i for i in ("model_new", "eager", "compile") if any(r["impl"] == i for r in rows)]
    got = {(tuple(r["shape"]), r["dtype"], r["impl"]): r["fraction_of_floor"] for r in rows}
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(keys)), 4.5))
    width = 0.8 / len(impls)
    for j, impl in enumerate(impls):
        at = [i + (j - (len(impls) - 1) / 2) * width for i in range(len(keys))]
        ax.bar(at, [100 * got.get((s, d, impl), 0.0) for s, d in keys], width, label=impl)
    ax.axhline(95, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"{' x '.join(map(str, s))}\n{d}" for s, d in keys], fontsize=8)
    ax.set_ylabel("% of the read (logits and targets)")
    ax.legend()
    ax.set_title(f"cross-entropy forward, inputs (N, C, d1, ..., dk): {rows[0]['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def save_plot(draw, rows, path):
    if can_plot():
        draw(rows, path)
    else:
        print("matplotlib not installed: no plot (run again with --plot-only where it is)")


def plot_train(rows, path):
    """Time over the copy, and extra memory over the logits, per shape and implementation."""
    plt = pyplot()
    keys = list(dict.fromkeys((r["N"], r["C"], r["dtype"]) for r in rows))
    impls = [i for i in TRAIN_IMPLS if any(r["impl"] == i for r in rows)]
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.3 * len(keys)), 8))
    width = 0.8 / len(impls)
    for j, impl in enumerate(impls):
        got = {(r["N"], r["C"], r["dtype"]): r for r in rows if r["impl"] == impl}
        at = [i + (j - (len(impls) - 1) / 2) * width for i in range(len(keys))]
        axes[0].bar(at, [got[k]["mean_ms"] / got[k]["copy_ms"] if k in got else 0 for k in keys], width, label=impl)
        axes[1].bar(at, [got[k]["peak_extra_bytes"] / (k[0] * k[1] * DTYPES[k[2]].itemsize) if k in got else 0
                         for k in keys], width, label=impl)
    for ax, label in zip(axes, ("time over the copy y.copy_(x)", "extra memory over the logits")):
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([f"{n} x {c}\n{d}" for n, c, d in keys], fontsize=8)
        ax.set_ylabel(label)
    axes[0].axhline(1.0, color="black", linewidth=0.8)
    axes[0].legend()
    fig.suptitle(f"cross-entropy forward + backward: {rows[0]['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", help="comma-separated NxC (default: the full sweep)")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--out", default=None, help="path prefix for .json and .png (default: no files)")
    ap.add_argument("--passes", type=int, default=1,
                    help="time every shape this many times and keep, per implementation, the pass with the lowest "
                         "mean (for hosts whose launch delays vary); compile is timed once")
    ap.add_argument("--plot-only", action="store_true", help="redraw OUT.png from OUT.json")
    ap.add_argument("--options", action="store_true", help="the options sweep (OPTIONS), shapes of 64 MiB or more")
    ap.add_argument("--sets", help="with --options: the OPTIONS sets to time, by name, separated by ';' (default: all)")
    ap.add_argument("--kdim", action="store_true", help="the sweep of inputs (N, C, d1, ..., dk): KDIM_SHAPES")
    ap.add_argument("--train", action="store_true", help="the training step's sweep (TRAIN_SHAPES) against a copy")
    ap.add_argument("--no-compile", action="store_true", help="the forward or --train sweep: no torch.compile rows")
    args = ap.parse_args(argv)
    if args.plot_only:
        with open(args.out + ".json") as f:
            rows = json.load(f)
        if args.train:
            plot_train(rows, args.out + ".png")
        elif args.options:
            plot_options(rows, args.out + ".png")
        elif args.kdim:
            plot_kdim(rows, args.out + ".png")
        else:
            plot(rows, args.out + ".png", "cross-entropy forward, mean reduction")
        return 0

    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    if args.options:
        return options_main(args, shapes)
    if args.kdim:
        return kdim_main(args)
    if args.train:
        return train_main(args)
    model = crossent.ModelNew()
    floor_fn = run_eval.stream_read_fn(torch.device("cuda"))
    device = torch.cuda.get_device_name()
    rows = []
    fns = {"model_new": model, "eager": reference_loss, "floor": floor_fn}
    # torch.compile last, in a phase of its own: its background compile workers load the host
    # CPUs, which delays the launches of whatever is timed next.
    phases = [("floor", "model_new", "eager")] * args.passes + ([] if args.no_compile else [("compile",)])
    combos = [(n, c, d) for n, c in shapes for d in args.dtypes.split(",")]
    best = {}
    for p, impls in enumerate(phases):
        for n, c, d in combos:
            new = measure(n, c, d, impls, args.trials, fns)
            for r in new:
                r.update(device=device, torch=torch.__version__, date=TODAY, pass_index=p)
                key = (n, c, d, r["impl"])
                r["pass_means_ms"] = best.get(key, {}).get("pass_means_ms", []) + [r["mean_ms"]]
                if key not in best or r["mean_ms"] < best[key]["mean_ms"]:
                    best[key] = r
                else:
                    best[key]["pass_means_ms"] = r["pass_means_ms"]
            rows = list(best.values())
            print("  " + ", ".join(f"{r['impl']} {r['mean_ms']:.4f}" for r in new) + f"  ms  ({n} x {c} {d})", flush=True)
            if args.out:  # after every shape, so an interrupted sweep keeps what it measured
                with open(args.out + ".json", "w") as f:
                    json.dump(rows, f, indent=1)
    print(f"\n{device} | torch {torch.__version__} | KernelBench cuda_event timing, mean of {args.trials}")
    print(table(rows))
    if args.out:
        save_plot(functools.partial(plot, title=f"cross-entropy forward, mean reduction: {device}"), rows,
                  args.out + ".png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
