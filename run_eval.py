#!/usr/bin/env python3
"""Check ModelNew against the reference and time both the way KernelBench does.

    python run_eval.py [--precision fp32|bf16|fp16] [--trials 100] [--json PATH] [--backward]
                       [--reduction mean|sum|none] [--ignore-fraction F] [--weight] [--label-smoothing EPS]
                       [--soft-targets]

Loading: reference.py, then model_new.py, are exec'd into one namespace (as KernelBench's
eval.py does), so the submission sees the reference's names and no __file__.
Correctness: 5 trials with seeds drawn from torch.manual_seed(42); each regenerates the inputs,
runs the reference and then ModelNew on the same tensors, and needs equal shapes and dtypes and
allclose with KernelBench's tolerance (1e-4 fp32, 1e-2 fp16/bf16). Integer tensors keep their
dtype (KernelBench issue #151 casts them too, which breaks the reference itself).
Timing: KernelBench's cuda_event method for ModelNew, eager and torch.compile (inductor,
default mode), plus a plain streaming read of the same bytes measured in the same run as the
bandwidth floor.
--backward checks and times the training step instead: the loss and its gradient with respect to
the logits (loss.backward(), an incoming gradient of ones), the gradient checked with the loss's
tolerance relative to its largest element, with a copy of the logits (y.copy_(x): one read and one
write, what a step must move at least) as the floor; with --soft-targets the floor still copies the
logits alone.
Options (with_options): --reduction, --ignore-fraction (that share of the targets, drawn per
trial, set to the ignore index -100), --weight (random class weights in [0.5, 1.5), drawn once,
passed to both models as an init input) and --label-smoothing give the reference, eager and
torch.compile PyTorch's cross_entropy with them, and ModelNew the same options.
"""
import functools
import argparse
import inspect
import json
import os
import statistics
import sys
import time
import traceback

import torch
from torch.utils.cpp_extension import load_inline

HERE = os.path.dirname(os.path.abspath(__file__))
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TOLERANCE = {"fp32": 1e-4, "bf16": 1e-2, "fp16": 1e-2}  # KernelBench's atol = rtol


IGNORE_INDEX = -100


class SubmissionError(RuntimeError):
    """The submission did not load: it failed to build, raised at import, or lacks ModelNew."""


# ------------------------------------------------------------------------------- loading
def load_problem(ref_src, sub_src, build_dir=None):
    """Exec reference then submission into one namespace; returns that namespace."""
    context = {}
    exec(compile(ref_src, "reference.py", "exec"), context)
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if name not in context:
            raise ValueError(f"the reference defines no {name}")
    if build_dir:
        # What KernelBench prepends when it is given a build directory.
        sub_src = f"import os; os.environ['TORCH_EXTENSIONS_DIR'] = {build_dir!r}\n" + sub_src
    try:
        exec(compile(sub_src, "model_new.py", "exec"), context)
    except Exception as exc:
        raise SubmissionError(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}") from exc
    if not isinstance(context.get("ModelNew"), type):
        raise SubmissionError("the submission defines no class ModelNew")
    return context


# ------------------------------------------------------------------------------- correctness
def with_options(context, reduction="mean", ignore_fraction=0.0, weight=False, label_smoothing=0.0,
                 soft_targets=False):
    """The problem with PyTorch's options: the reduction, a share of the targets set to the ignore
    index (drawn after the inputs from the same seed), class weights (the init inputs, so that both
    models get them in the precision and on the device), label smoothing, and class-probability
    targets in place of the indices (a softmax of normal logits, drawn after the inputs). The
    defaults leave it as KernelBench defines it."""
    if reduction == "mean" and not ignore_fraction and not weight and not label_smoothing and not soft_targets:
        return context
    if soft_targets and ignore_fraction:
        raise ValueError("probability targets have no ignore index: --soft-targets takes no --ignore-fraction")
    get_inputs, init_inputs = context["get_inputs"], context["get_init_inputs"]
    if weight:
        if "num_classes" not in context:
            raise ValueError("--weight needs the reference's num_classes")
        weights = torch.rand(context["num_classes"], generator=torch.Generator().manual_seed(0)) + 0.5
        init_inputs = functools.partial(lambda w: [w.clone()], weights)

    class Reference(torch.nn.Module):
        def __init__(self, weight=None):
            super().__init__()
            self.register_buffer("weight", weight)

        def forward(self, predictions, targets):
            return torch.nn.functional.cross_entropy(predictions, targets, self.weight, reduction=reduction,
                                                     label_smoothing=label_smoothing)

    def inputs():
        predictions, targets = get_inputs()
        if soft_targets:
            return [predictions, torch.softmax(torch.randn(predictions.shape), -1)]
        return [predictions, targets.masked_fill(torch.rand(targets.shape) < ignore_fraction, IGNORE_INDEX)]

    model_new = functools.partial(context["ModelNew"], reduction=reduction, label_smoothing=label_smoothing)
    return dict(context, Model=Reference, ModelNew=model_new, get_inputs=inputs, get_init_inputs=init_inputs)


def set_seed(seed):
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)


def trial_seeds(n, seed=42):
    """The per-trial seeds KernelBench draws."""
    torch.manual_seed(seed)
    return [torch.randint(0, 2**32 - 1, (1,)).item() for _ in range(n)]


def process_inputs(inputs, device, dtype):
    """To the device; floating tensors to the precision, integer tensors unchanged."""
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            x = x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device=device)
        out.append(x)
    return out


def compare(ref, new, tol):
    """(ok, message) for one trial, by KernelBench's rules."""
    if not isinstance(new, torch.Tensor):
        return False, f"ModelNew returned {type(new).__name__}, not a tensor"
    if ref.shape != new.shape:
        return False, f"shape mismatch: reference {tuple(ref.shape)}, ModelNew {tuple(new.shape)}"
    if ref.dtype != new.dtype:
        return False, f"dtype mismatch: reference {ref.dtype}, ModelNew {new.dtype}"
    if ref.device != new.device:
        return False, f"device mismatch: reference {ref.device}, ModelNew {new.device}"
    diff = (ref.double() - new.double()).abs().max().item() if ref.numel() else 0.0
    if not torch.allclose(ref, new, atol=tol, rtol=tol):
        return False, f"values differ: max |diff| {diff:.3e} over tolerance {tol:g}"
    return True, f"max |diff| {diff:.3e}"


def check_correctness(context, device, precision, trials=5, seed=42, log=print, backward=False):
    """KernelBench's correctness trials; `backward`: the gradient with respect to the logits too."""
    dtype = PRECISIONS[precision]
    init = process_inputs(context["get_init_inputs"](), device, dtype)
    set_seed(seed)
    model = context["Model"](*init).to(device=device, dtype=dtype)
    set_seed(seed)
    model_new = context["ModelNew"](*init).to(device=device, dtype=dtype)
    passed, notes = 0, []
    with torch.set_grad_enabled(backward):
        for i, s in enumerate(trial_seeds(trials, seed)):
            set_seed(s)
            inputs = process_inputs(context["get_inputs"](), device, dtype)
            ref, ref_grad = run_model(model, inputs, backward)
            torch.cuda.synchronize(device)
            new, new_grad = run_model(model_new, inputs, backward)
            torch.cuda.synchronize(device)
            ok, note = compare(ref, new, TOLERANCE[precision])
            if ok and backward:
                ok, note = compare_gradient(ref_grad, new_grad, TOLERANCE[precision])
            passed += ok
            notes.append(note)
            log(f"  trial {i + 1}/{trials}: {'ok' if ok else 'FAIL'} ({note})")
    return passed, notes


def compare_gradient(ref, new, tol):
    """(ok, message) for the logits' gradients, by KernelBench's rules relative to the reference's
    largest element: each element of a mean's gradient is about 1/N, under any absolute tolerance."""
    if ref is None or new is None:
        return False, f"gradient: none from {'the reference' if ref is None else 'ModelNew'}"
    scale = ref.detach().abs().max().item() if ref.numel() else 0.0
    ok, note = compare(ref / scale, new / scale, tol) if scale > 0 else compare(ref, new, tol)
    return ok, f"gradient, relative to its largest element ({scale:.3g}): {note}"


def run_model(model, inputs, backward):
    """(the loss, and where `backward` the logits' gradient from an incoming gradient of ones)."""
    if not backward:
        return model(*inputs), None
    logits = inputs[0].detach().requires_grad_()
    loss = model(logits, *inputs[1:])
    if not isinstance(loss, torch.Tensor) or loss.grad_fn is None:
        return loss, None
    loss.backward(torch.ones_like(loss))
    return loss.detach(), logits.grad


def training_step(model):
    """A callable that runs `model`'s forward and backward on logits that require grad."""
    def step(logits, *rest):
        logits.grad = None
        model(logits, *rest).backward()
        return logits.grad
    return step


# ------------------------------------------------------------------------------- timing
def clear_l2(device):
    """KernelBench's flush: fill a fresh 256 MB int64 tensor."""
    dummy = torch.empty((32, 1024, 1024), dtype=torch.int64, device=device)
    dummy.fill_(42)
    del dummy


def time_cuda_event(fn, args, device, warmup=3, trials=100, discard_first=1):
    """KernelBench's time_execution_with_cuda_event: per-trial milliseconds."""
    with torch.cuda.device(device):
        for _ in range(warmup):
            fn(*args)
            torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        times = []
        for trial in range(trials + discard_first):
            torch.cuda.synchronize(device)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            clear_l2(device)
            start.record()
            fn(*args)
            end.record()
            torch.cuda.synchronize(device)
            if trial >= discard_first:
                times.append(start.elapsed_time(end))
    return times


def timing_stats(times):
    """KernelBench's stats (3 significant figures) plus the unrounded mean."""
    def sig3(x):
        return float(f"{x:.3g}")
    return {
        "mean": sig3(statistics.fmean(times)),
        "std": sig3(statistics.pstdev(times)),
        "min": sig3(min(times)),
        "max": sig3(max(times)),
        "num_trials": len(times),
        "mean_exact": statistics.fmean(times),
    }


_READ_SRC = r"""
#include <cstdint>
#include <cuda_runtime.h>
// A plain streaming read of n16 16-byte vectors: 4 independent loads in flight per thread,
// 2 CTAs x 512 threads per SM. One word per CTA is written only if the sum hits a sentinel,
// which keeps the loads alive without adding traffic.
__global__ void __launch_bounds__(512, 2) stream_read(const uint4* p, long long n16, float* out) {
  float acc = 0.f;
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = p[i + u * stride];
#pragma unroll
    for (int u = 0; u < 4; ++u) acc += __uint_as_float(v[u].x ^ v[u].y ^ v[u].z ^ v[u].w);
  }
  for (; i < n16; i += stride) {
    const uint4 v = p[i];
    acc += __uint_as_float(v.x ^ v.y ^ v.z ^ v.w);
  }
  if (acc == 1234.5f) out[blockIdx.x] = acc;
}
void launch_stream_read(uintptr_t p, int64_t n16, uintptr_t out, int64_t grid, uintptr_t stream) {
  stream_read<<<int(grid), 512, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const uint4*>(p), n16, reinterpret_cast<float*>(out));
}
"""
_READ_CPP = r"""
#include <pybind11/pybind11.h>
#include <cstdint>
void launch_stream_read(uintptr_t p, int64_t n16, uintptr_t out, int64_t grid, uintptr_t stream);
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("launch", &launch_stream_read); }
"""


def stream_read_fn(device):
    """A callable that reads all bytes of a tensor once: the bandwidth floor."""
    major, minor = torch.cuda.get_device_capability(device)
    options = {"no_implicit_headers": True} if "no_implicit_headers" in inspect.signature(load_inline).parameters else {}
    ext = load_inline(name=f"kb95_stream_read_sm{major}{minor}", cpp_sources=[_READ_CPP], cuda_sources=[_READ_SRC],
                      extra_cuda_cflags=["-O3", f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"],
                      **options)
    grid = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    sink = torch.empty(grid, dtype=torch.float32, device=device)

    def read(x, *_):
        ext.launch(x.data_ptr(), x.numel() * x.element_size() // 16, sink.data_ptr(), grid,
                   torch.cuda.current_stream(device).cuda_stream)
        return sink
    return read


def copy_fn():
    """A callable that copies a tensor into another of its shape: one read and one write, a training
    step's floor."""
    out = {}

    def copy(x, *_):
        y = out.get("y")
        if y is None or y.shape != x.shape or y.dtype != x.dtype:
            y = out["y"] = torch.empty_like(x, requires_grad=False)
        return y.copy_(x.detach())
    return copy


def read_each(read):
    """The read of every tensor given, one after another: the floor where the targets are read too."""
    return lambda *tensors: [read(t) for t in tensors]


# ------------------------------------------------------------------------------- report
def summarize(results, logit_bytes):
    """Adds speedups and bandwidths to the per-implementation stats."""
    mean = {k: v["mean_exact"] for k, v in results.items()}
    summary = {
        "model_new_ms": mean["model_new"],
        "eager_ms": mean["eager"],
        "compile_ms": mean.get("compile"),
        "floor_ms": mean["floor"],
        "speedup_eager": mean["eager"] / mean["model_new"],
        "speedup_compile": mean["compile"] / mean["model_new"] if "compile" in mean else None,
        "model_new_tbps": logit_bytes / (mean["model_new"] * 1e-3) / 1e12,
        "floor_tbps": logit_bytes / (mean["floor"] * 1e-3) / 1e12,
    }
    summary["fraction_of_floor"] = mean["floor"] / mean["model_new"]
    return summary


def format_table(results, logit_bytes, floor="stream read (floor)"):
    rows = [("ModelNew", "model_new"), ("eager", "eager"), ("torch.compile", "compile"), (floor, "floor")]
    # Three significant digits take up to 8 characters (0.000636, 6.36e-05): columns of 10 keep them apart.
    lines = [f"{'':22s}" + "".join(f"{h:>10s}" for h in ("mean ms", "std", "min", "max")) + f"{'TB/s':>7s}"]
    for label, key in rows:
        if key in results:
            r = results[key]
            tbps = logit_bytes / (r["mean_exact"] * 1e-3) / 1e12
            lines.append(f"{label:22s}" + "".join(f"{r[k]:10.3g}" for k in ("mean", "std", "min", "max")) + f"{tbps:7.2f}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32")
    ap.add_argument("--trials", type=int, default=100, help="timed trials per implementation (default 100)")
    ap.add_argument("--correct-trials", type=int, default=5, help="correctness trials (default 5)")
    ap.add_argument("--json", metavar="PATH", help="write the report as JSON")
    ap.add_argument("--reference", default=os.path.join(HERE, "reference.py"))
    ap.add_argument("--submission", default=os.path.join(HERE, "model_new.py"))
    ap.add_argument("--build-dir", help="TORCH_EXTENSIONS_DIR for the build, as KernelBench sets it")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    ap.add_argument("--reduction", choices=["mean", "sum", "none"], default="mean")
    ap.add_argument("--ignore-fraction", type=float, default=0.0, metavar="F",
                    help="share of the targets set to the ignore index -100 (default 0)")
    ap.add_argument("--weight", action="store_true", help="random class weights for both models")
    ap.add_argument("--label-smoothing", type=float, default=0.0, metavar="EPS")
    ap.add_argument("--soft-targets", action="store_true",
                    help="class-probability targets of the logits' shape and precision; the floor reads them too")
    ap.add_argument("--backward", action="store_true",
                    help="the training step (loss and the logits' gradient) against a copy of the logits")
    args = ap.parse_args(argv)

    with open(args.reference) as f:
        ref_src = f.read()
    with open(args.submission) as f:
        sub_src = f.read()
    print("loading the submission (a cold build of its CUDA extension takes a while) ...", flush=True)
    t0 = time.perf_counter()
    try:
        context = load_problem(ref_src, sub_src, args.build_dir)
    except SubmissionError as exc:
        print(f"ModelNew failed to load: {exc}", file=sys.stderr)
        return 1
    load_s = time.perf_counter() - t0
    print(f"loaded in {load_s:.1f} s", flush=True)
    context = with_options(context, args.reduction, args.ignore_fraction, args.weight, args.label_smoothing,
                           args.soft_targets)
    if not torch.cuda.is_available():
        print("run_eval needs a CUDA GPU; none is visible", file=sys.stderr)
        return 2

    device = torch.device("cuda", torch.cuda.current_device())
    dtype = PRECISIONS[args.precision]
    report = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "precision": args.precision,
        "load_seconds": load_s,
        "reduction": args.reduction,
        "ignore_fraction": args.ignore_fraction,
        "weight": args.weight,
        "label_smoothing": args.label_smoothing,
        "soft_targets": args.soft_targets,
        "backward": args.backward,
    }

    print(f"correctness ({args.correct_trials} trials, tolerance {TOLERANCE[args.precision]:g}):", flush=True)
    try:
        passed, notes = check_correctness(context, device, args.precision, args.correct_trials,
                                          backward=args.backward)
    except Exception as exc:
        print(f"ModelNew raised during the correctness check: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    report.update(correct=passed == args.correct_trials, trials_passed=passed, correct_trials=args.correct_trials)

    set_seed(42)
    init = process_inputs(context["get_init_inputs"](), device, dtype)
    inputs = process_inputs(context["get_inputs"](), device, dtype)
    logits = inputs[0]
    # The bytes a launch must read: the logits, and probability targets where they are the targets.
    logit_bytes = sum(x.numel() * x.element_size() for x in (inputs if args.soft_targets else inputs[:1]))
    report["shape"] = list(logits.shape)
    model_new = context["ModelNew"](*init).to(device=device, dtype=dtype)
    model = context["Model"](*init).to(device=device, dtype=dtype)
    impls = {"model_new": model_new, "eager": model}
    if not args.no_compile:
        impls["compile"] = torch.compile(model, backend="inductor", mode="default")
    if args.backward:  # the step, and what it must move: the logits read once, the gradient written once
        impls = {key: training_step(fn) for key, fn in impls.items()}
        impls["floor"] = copy_fn()
        logits.requires_grad_()
        logit_bytes = 2 * logits.numel() * logits.element_size()
    else:
        read = stream_read_fn(device)
        impls["floor"] = read_each(read) if args.soft_targets else read

    results = {}
    for key, fn in impls.items():
        print(f"timing {key} ({args.trials} trials) ...", flush=True)
        results[key] = timing_stats(time_cuda_event(fn, inputs, device, trials=args.trials))
    report["timings"] = results
    report.update(summarize(results, logit_bytes))

    print()
    print(f"device {report['device']} | torch {report['torch']} | CUDA {report['cuda']} | "
          f"{args.precision} | {logits.shape[0]} x {logits.shape[1]} | reduction {args.reduction}, "
          f"{args.ignore_fraction:g} of the targets ignored" + (", class weights" if args.weight else "")
          + (f", label smoothing {args.label_smoothing:g}" if args.label_smoothing else "")
          + (", probability targets" if args.soft_targets else "") + (", forward and backward" if args.backward else ""))
    print(f"correct: {passed}/{args.correct_trials} trials")
    print(format_table(results, logit_bytes, "copy (floor)" if args.backward else "stream read (floor)"))
    print(f"Speedup over eager: {report['speedup_eager']:.2f}x")
    if report["speedup_compile"] is not None:
        print(f"Speedup over torch.compile: {report['speedup_compile']:.2f}x")
    floor = "copy" if args.backward else "streaming-read"
    print(f"ModelNew: {report['model_new_tbps']:.2f} TB/s effective, "
          f"{100 * report['fraction_of_floor']:.1f}% of the {floor} floor ({report['floor_tbps']:.2f} TB/s)")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
        print(f"wrote {args.json}")
    return 0 if report["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
