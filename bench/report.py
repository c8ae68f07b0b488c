#!/usr/bin/env python3
"""Tables from the committed results: bench/RESULTS.md in full, and README.md's headline tables.

    python bench/report.py            # rewrite bench/RESULTS.md and the README's marker blocks
    python bench/report.py --check    # exit 1, printing a diff, where either is stale

Reads every bench/results/*.json (run_eval.py --json, bench/sweep.py --out, bench/ab.py --json),
tells the kind of each from its fields, and writes tables that name their source files, GPU, torch
version and date. In README.md only the lines between <!-- report:NAME --> and
<!-- /report:NAME --> (NAME: forward, training) are generated. Standard library only.
"""
import argparse
import difflib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRECISIONS = ("fp32", "bf16", "fp16")
# What bench/ab.py's files do not record themselves: which two versions they compare.
AB_NOTES = {"h100_sm75.json": "Baseline: the source's sm_90 code; candidate: its sm_75 code (`--candidate-sm75`: "
                              "compute_75 PTX under sm_75's plans), both on the H100.",
            "h100_ab_options.json": "Baseline: the source before class weights and label smoothing; candidate: "
                                    "with them.",
            "h100_build_times_options.json": "Baseline: the source before class weights and label smoothing; "
                                             "candidate: with them.",
            "h200_ab_package.json": "Baseline: model_new.py as one hand-written file; candidate: model_new.py "
                                    "bundled from the crossent package (tools/bundle.py), the same kernels' source "
                                    "split into files; 2 passes.",
            "h200_ab_package_rerun.json": "The same two versions as h200_ab_package.json, timing only, 3 passes, "
                                          "on another H200."}


def ms(x):
    """Three significant digits, trailing zeros kept: 0.188 ms, 1.20 ms, 0.0986 ms."""
    return f"{x:#.3g}".rstrip(".") + " ms"


def pct(x):
    return f"{100 * x:.1f}%"


def times(x):
    return f"{x:.2f}x"


def yes(ok):
    return "yes" if ok else "NO"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def by(rows, key):
    """{key(row): {impl: row}}, in the rows' order."""
    out = {}
    for r in rows:
        out.setdefault(key(r), {})[r["impl"]] = r
    return out


def kind(data):
    if isinstance(data, dict):
        if "transformers" in data:
            return "hf"
        if "host" in data:
            return "host"
        if "median_ms" in (data.get("rows") or [{}])[0]:
            return "step"
        return "run_eval" if "timings" in data else "ab" if data.keys() & {"timing", "build_times", "runs"} else None
    first = data[0] if data else {}
    return next((name for key, name in (("options", "options"), ("copy_ms", "train"), ("shape", "kdim"),
                                        ("ranks", "parallel"), ("floor_ms", "linear"), ("tbps", "sweep"))
                 if key in first), None)


def provenance(files):
    """One line naming the source files and the GPU, torch, CUDA and date they record."""
    def values(field):
        got = {}
        for name, data in files.items():
            for rec in data if isinstance(data, list) else [data]:
                got.setdefault(str(rec[field]) if rec.get(field) is not None else "not recorded", set()).add(name)
        if set(got) == {"not recorded"}:
            return None
        if len(got) < 2:
            return next(iter(got), None)
        return "; ".join(f"{v} ({', '.join(sorted(n))})" for v, n in got.items())
    cuda, date = values("cuda"), values("date")
    return (f"Source: {', '.join(f'`bench/results/{n}`' for n in files)}. GPU: {values('device')}. "
            f"torch {values('torch')}" + (f", CUDA {cuda}" if cuda else "") + ". Date: "
            + (date or f"not recorded in the file{'s' * (len(files) > 1)}") + ".")


def run_eval_options(r):
    """run_eval.py's options behind report r, beside --precision and --backward."""
    return ([f"--reduction {r['reduction']}"] * (r.get("reduction", "mean") != "mean")
            + [f"--ignore-fraction {r.get('ignore_fraction'):g}"] * bool(r.get("ignore_fraction"))
            + ["--weight"] * bool(r.get("weight"))
            + [f"--label-smoothing {r.get('label_smoothing'):g}"] * bool(r.get("label_smoothing"))
            + ["--soft-targets"] * bool(r.get("soft_targets")))


def run_eval_table(files, backward, headline=False):
    """run_eval.py's reports, by precision; the headline drops the columns its caption gives."""
    rows = []
    for name, r in sorted(files.items(), key=lambda f: (f[1]["device"], PRECISIONS.index(f[1]["precision"]),
                                                         run_eval_options(f[1]))):
        t = r["timings"]
        rows.append([f"`{name}`", r["device"].removeprefix("NVIDIA "), r["precision"],
                     " ".join(run_eval_options(r)) or "defaults",
                     " x ".join(map(str, r["shape"])), f"{r['trials_passed']}/{r['correct_trials']}",
                     t["model_new"]["num_trials"]]
                    + [ms(t[k]["mean_exact"]) if k in t else "" for k in ("model_new", "eager", "compile", "floor")]
                    + [times(r["speedup_eager"]), times(r["speedup_compile"]) if r.get("speedup_compile") else "",
                       times(r["model_new_ms"] / r["floor_ms"]) if backward else pct(r["fraction_of_floor"])])
    header = ["file", "GPU", "precision", "options", "shape", "correct", "trials", "ModelNew", "eager",
              "torch.compile", "copy" if backward else "read", "vs eager", "vs compile",
              "over the copy" if backward else "of the read"]
    keep = [1, 2, 5] + list(range(7, len(header))) if headline else range(len(header))
    return table([header[i] for i in keep], [[row[i] for i in keep] for row in rows])


def shape_of(r):
    return r["N"], r["C"], r["dtype"]


def over_copy(got):
    """A training shape's cells: ModelNew's mean over the copy (its median's in brackets), torch.compile's
    and eager's; each empty where not timed."""
    over = {k: times(r["mean_ms"] / r["copy_ms"]) for k, r in got.items()}
    m = got.get("model_new")
    return [f"{over['model_new']} ({times(m['median_ms'] / m['copy_ms'])})" if m else "", over.get("compile", ""),
            over.get("eager", "")]


def train_table(rows):
    """bench/sweep.py --train: each step's mean over the copy timed in its phase (the median in brackets)."""
    out = []
    for (n, c, d), got in by(rows, shape_of).items():
        m, logits = got["model_new"], n * c * (4 if d == "float32" else 2)
        out.append([f"{n} x {c}", d, ms(m["copy_ms"]), ms(m["mean_ms"])] + over_copy(got)
                   + [" / ".join(f"{got[k]['peak_extra_bytes'] / logits:.2f}" if k in got else "-"
                                 for k in ("model_new", "compile", "eager")),
                      yes(all(r["correct"] for r in got.values()))])
    return table(["logits", "dtype", "copy", "ModelNew", "ModelNew / copy (median)", "torch.compile / copy",
                  "eager / copy", "extra memory / logits (ModelNew / compile / eager)", "correct"], out)


def train_headline(files):
    """The training sweeps side by side, a column group per file (its GPU): each step's mean over the copy
    (ModelNew's median in brackets); a cell empty where that file has no such shape."""
    keys = list(dict.fromkeys(shape_of(r) for rows in files.values() for r in rows))
    header, cells = ["logits", "dtype"], []
    for name, rows in files.items():
        gpu = rows[0]["device"].removeprefix("NVIDIA ") if rows and rows[0].get("device") else name
        header += [f"{gpu}: ModelNew / copy (median)", f"{gpu}: torch.compile / copy", f"{gpu}: eager / copy"]
        cells.append(by(rows, shape_of))
    return table(header, [[f"{n} x {c}", d] + sum((over_copy(got.get((n, c, d), {})) for got in cells), [])
                          for n, c, d in keys])


def sweep_table(rows):
    """bench/sweep.py's forward sweep: per shape and dtype, ModelNew's mean as a share of the read's, and
    eager's and torch.compile's over ModelNew's where they ran."""
    body = []
    for (n, c, d), got in by(rows, shape_of).items():
        m, f = got["model_new"], got["floor"]
        body.append([f"{n} x {c}", d, f"{m['bytes'] / 2**20:.1f}", ms(f["mean_ms"]), ms(m["mean_ms"]),
                     pct(f["mean_ms"] / m["mean_ms"])]
                    + [times(got[k]["mean_ms"] / m["mean_ms"]) if k in got else "" for k in ("eager", "compile")])
    return table(["logits", "dtype", "MiB", "read", "ModelNew", "of the read", "eager / ModelNew",
                  "torch.compile / ModelNew"], body)


def options_tables(rows):
    """bench/sweep.py --options, per dtype: ModelNew's time as a share of the read's, and eager's
    time over ModelNew's in brackets where PyTorch has the options."""
    out = []
    for d in dict.fromkeys(r["dtype"] for r in rows):
        mine = [r for r in rows if r["dtype"] == d]
        shapes = list(dict.fromkeys((r["N"], r["C"]) for r in mine))
        cells = by(mine, lambda r: (r["options"], r["N"], r["C"]))
        body = []
        for opt in dict.fromkeys(r["options"] for r in mine):
            of = [r for r in mine if r["options"] == opt]
            row = [opt, "/".join(sorted({str(r["passes"]) for r in of})), yes(all(r["correct"] for r in of))]
            for n, c in shapes:
                m, e = (cells.get((opt, n, c), {}).get(k) for k in ("model_new", "eager"))
                row.append(pct(m["fraction_of_floor"]) + (f" ({times(e['mean_ms'] / m['mean_ms'])})" if e else "")
                           if m else "")
            body.append(row)
        out.append(f"{d}:\n\n" + table(["options", "passes", "correct"] + [f"{n} x {c}" for n, c in shapes], body))
    return "\n\n".join(out)


def kdim_table(rows):
    body = [[" x ".join(map(str, s)), d] + [ms(g[k]["mean_ms"]) for k in ("model_new", "eager", "compile")]
            + [ms(g["model_new"]["floor_ms"]), pct(g["model_new"]["fraction_of_floor"]),
               pct(g["model_new"]["logits_floor_ms"] / g["model_new"]["mean_ms"]),
               yes(all(r["correct"] for r in g.values()))]
            for (s, d), g in by(rows, lambda r: (tuple(r["shape"]), r["dtype"])).items()]
    return table(["shape", "dtype", "ModelNew", "eager", "torch.compile", "read (logits, targets)", "of the read",
                  "of the logits' read", "correct"], body)


def ab_section(name, r):
    """bench/ab.py --json: what it compares, bitwise cases, host time, timing medians, build times."""
    parts = [f"What the file says: {r['what']}." if "what" in r
             else AB_NOTES.get(name, "The file does not record which two versions it compares.")]
    if "bitwise_cases" in r:
        parts.append(f"Bitwise: {r['bitwise_cases']} cases, {r['bitwise_mismatches']} differ.")
    if "bitwise_options_cases" in r:
        parts.append(f"Bitwise, the options build (every option, and the gradients of training steps): "
                     f"{r['bitwise_options_cases']} cases, {r['bitwise_options_mismatches']} differ.")
    if "host_us" in r:
        parts.append("The dispatch's host time per call: "
                     + ", ".join(f"{k} {v:.1f} us" for k, v in r["host_us"].items()) + ".")
    if "timing" in r:
        body = [[f"{t['N']} x {t['C']}", t["dtype"] + (", training step" if t.get("train") else "")]
                + [f"{1000 * t[k + '_median_ms']:.1f}" for k in ("floor", "baseline", "candidate")]
                + [f"{t['candidate_median_ms'] / t['baseline_median_ms']:.3f}",
                   pct(t["floor_median_ms"] / t["candidate_median_ms"]), "yes" if t["flagged"] else ""]
                for t in r["timing"]]
        parts.append("Medians in us; the floor is the read of the logits, for a training step their copy; flagged: "
                     "slower than `bench/ab.py`'s gate allows.\n\n" + table(
                         ["logits", "dtype", "floor", "baseline", "candidate", "candidate / baseline",
                          "candidate of the floor", "flagged"], body))
    builds = {}
    for b in r.get("build_times", []) + [b for run in r.get("runs", []) for b in run]:
        builds.setdefault((b["version"], b["cores"]), []).append(b["seconds"])
    if builds:
        parts.append("Cold imports (the build), in seconds:\n\n" + table(
            ["version", "cores", "each import", "mean"],
            [[v, c, ", ".join(f"{s:.1f}" for s in ss), f"{sum(ss) / len(ss):.1f}"] for (v, c), ss in builds.items()]))
    return "\n\n".join(parts)


def hf_table(r):
    """bench/hf_gpt2.py: one row per loss the model trained with."""
    return table(["loss", "first step", "last step", "largest distance from transformers' curve",
                  "one step's gradient error", "peak memory", "time per step"],
                 [[name, f"{run['losses'][0]:.4f}", f"{run['losses'][-1]:.4f}", f"{run.get('distance', 0.0):.2e}",
                   f"{run['gradient_error']:.2e}" if "gradient_error" in run else "",
                   f"{run['peak_bytes'] / 2**20:.0f} MiB", f"{run['step_ms']:.2f} ms"] for name, run in r["runs"].items()])


def host_table(r):
    """bench/host.py: per case, the forward's and the step's host time against eager's."""
    rows = {}
    for rec in r["host"]:
        rows.setdefault(rec["case"], {})[rec["kind"]] = rec
    body = []
    for case, kinds in rows.items():
        fwd, step = kinds["forward"], kinds["step"]
        model = f"{fwd['ModelNew_us']:.1f}" if "ModelNew_us" in fwd else ""
        summed = f"{step['x.sum()_us']:.1f}" if "x.sum()_us" in step else ""
        body.append([case, f"{fwd['crossent_us']:.1f}", model, f"{fwd['eager_us']:.1f}",
                     times(fwd["crossent_us"] / fwd["eager_us"]), f"{step['crossent_us']:.1f}",
                     f"{step['eager_us']:.1f}", times(step["crossent_us"] / step["eager_us"]), summed])
    return table(["options", "forward", "ModelNew", "eager", "forward / eager", "step", "eager step",
                  "step / eager", "x.sum()'s step"], body)


def step_table(r):
    """bench/step.py: per shape, the copy's median and each step's over it; quack's one kernel where it ran."""
    names = list(dict.fromkeys(k for row in r["rows"] for k in row["median_ms"] if k != "copy"))
    body = [[f"{row['N']} x {row['C']}", row["dtype"], ms(row["median_ms"]["copy"])]
            + [times(row["median_ms"][k] / row["median_ms"]["copy"]) if k in row["median_ms"] else "" for k in names]
            for row in r["rows"]]
    return table(["logits", "dtype", "copy"] + names, body)


def linear_table(rows):
    """bench/linear.py: per N x D x V, each implementation's median, over its floor (the three matmuls,
    or the one for a forward), and the memory it adds."""
    body = [[f"{r['N']} x {r['D']} x {r['V']}", r["impl"], ms(r["median_ms"]),
             times(r["median_ms"] / r["floor_ms"]) + f" {r['floor']}", f"{r['peak_extra_bytes'] / 2**30:.2f} GiB",
             "" if r["correct"] is None else yes(r["correct"])] for r in rows]
    return table(["N x D x V", "implementation", "median", "over the floor", "memory added", "correct"], body)


def parallel_table(rows):
    """bench/parallel.py: per N x V over the ranks, each rank's median, the loss's over the copy of its
    slice plus the all-gather (the worst rank's)."""
    body = []
    for (n, v, ranks), impls in by(rows, lambda r: (r["N"], r["V"], r["ranks"])).items():
        floor = [c + g for c, g in zip(impls["copy"]["median_ms"], impls["all-gather"]["median_ms"])]
        for impl, r in impls.items():
            over = times(max(t / f for t, f in zip(r["median_ms"], floor))) if impl == "crossent" else ""
            body.append([f"{n} x {v} over {ranks}", impl, " / ".join(ms(t) for t in r["median_ms"]), over,
                         "" if r["correct"] is None else yes(r["correct"])])
    return table(["N x V", "implementation", "median per rank", "over copy + all-gather", "correct"], body)


def load(root):
    return {p.name: json.loads(p.read_text()) for p in sorted((root / "bench" / "results").glob("*.json"))}


def group(results, name, backward=None):
    return {n: d for n, d in results.items()
            if kind(d) == name and (backward is None or bool(d.get("backward")) == backward)}


def headlines(results):
    """The README's blocks: run_eval's forward with no options, and the training sweep."""
    fwd = {n: d for n, d in group(results, "run_eval", False).items() if not run_eval_options(d)}
    train = group(results, "train")
    commands = ", ".join(dict.fromkeys(
        f"`python3 run_eval.py{'' if d['precision'] == 'fp32' else ' --precision ' + d['precision']}`"
        for d in fwd.values()))
    shapes = " and ".join(sorted({" x ".join(map(str, d["shape"])) for d in fwd.values()}))
    trials = " and ".join(sorted({str(d["timings"]["model_new"]["num_trials"]) for d in fwd.values()}))
    return {"forward": f"{commands}: logits {shapes}, the mean of {trials} trials. {provenance(fwd)}\n\n"
                       + run_eval_table(fwd, backward=False, headline=True),
            "training": "`python3 bench/sweep.py --train`: the step (the loss and `loss.backward()`), its mean over "
                        f"a copy of the logits, `y.copy_(x)`, timed in the same phase. {provenance(train)}\n\n"
                        + train_headline(train)}


def results_md(root, results):
    out = ["# Results", "",
           "Generated by `python3 bench/report.py` from `bench/results/*.json`; do not edit by hand "
           "(`python3 bench/report.py --check` fails where this file is stale). Times are KernelBench's "
           "cuda_event method (a 256 MB L2 flush before each trial). The files record the GPU and torch "
           "(run_eval's also CUDA), the newer ones the date, but none the commit of the code measured: "
           "`git log -- bench/results/FILE` says when each was committed. The sweeps' files do not record "
           "their trial count."]

    def section(title, files, body, note=""):
        if files:
            out.extend(["", f"## {title}", "", provenance(files)] + [note] * bool(note) + ["", body])
            out.extend(f"\n![{Path(n).stem}.png](results/{Path(n).stem}.png)" for n in files
                       if (root / "bench" / "results" / f"{Path(n).stem}.png").exists())
    fwd, bwd = group(results, "run_eval", False), group(results, "run_eval", True)
    section("`run_eval.py`: the forward", fwd, run_eval_table(fwd, backward=False),
            "Read: a streaming read of the bytes the launch must read (with `--soft-targets`, the logits and "
            "the targets).")
    section("`run_eval.py --backward`: the training step", bwd, run_eval_table(bwd, backward=True),
            "Copy: a copy of the logits, `y.copy_(x)`.")
    for n, rows in group(results, "train").items():
        section(f"`bench/sweep.py --train`: {n}", {n: rows}, train_table(rows),
                "The step (the loss and `loss.backward()`): its mean over a copy of the logits, `y.copy_(x)`, "
                "timed in the same phase (torch.compile in a phase of its own), the median in brackets.")
    for n, rows in group(results, "sweep").items():
        passes = sorted({len(r["pass_means_ms"]) for r in rows if r["impl"] == "model_new"})  # compile: one
        section(f"`bench/sweep.py`: {n}", {n: rows}, sweep_table(rows),
                "The forward (ModelNew: the mean, ignore_index -100) against a streaming read of the same logits, "
                f"the best of {'/'.join(map(str, passes))} passes.")
    for n, rows in group(results, "options").items():
        section(f"`bench/sweep.py --options`: {n}", {n: rows}, options_tables(rows),
                "ModelNew's mean as a share of the read's (of the logits; with probability targets, of both), "
                "the best of the passes; in brackets eager's time over ModelNew's. The options are "
                "`bench/sweep.py`'s OPTIONS, by name.")
    for n, rows in group(results, "kdim").items():
        section(f"`bench/sweep.py --kdim`: {n}", {n: rows}, kdim_table(rows),
                f"The best of {'/'.join(sorted({str(r['passes']) for r in rows}))} passes per implementation.")
    for n, r in group(results, "ab").items():
        section(f"`bench/ab.py`: {n}", {n: r}, ab_section(n, r))
    for n, rows in group(results, "linear").items():
        section(f"`bench/linear.py`: {n}", {n: rows}, linear_table(rows),
                "Linear + cross-entropy in bf16, forward and backward into x and W, the median of CUDA-event "
                "timings; the floor is x W^T, G W and G^T x timed alone in the same run (a forward's: x W^T). "
                "Memory added: the step's peak over its inputs, its gradients included.")
    for n, rows in group(results, "parallel").items():
        section(f"`bench/parallel.py`: {n}", {n: rows}, parallel_table(rows),
                "The vocabulary split evenly over the ranks, bf16; each rank's median of CUDA-event timings "
                "after a barrier. The floor: a copy of the rank's slice plus the all-gather of N x 2 float32 "
                "alone.")
    for n, r in group(results, "hf").items():
        c = r["config"]
        section(f"`bench/hf_gpt2.py`: {n}", {n: r}, hf_table(r),
                f"A GPT-2 of transformers {r['transformers']} built from a config ({c['n_layer']} layers, width "
                f"{c['n_embd']}, vocabulary {c['vocab_size']}), trained {r['steps']} steps of {r['batch']} x "
                f"{r['sequence']} tokens under {r['autocast']} autocast from the same weights, batches and dropout "
                "masks, once per loss in the table. The float64 runs' distances are what rounding alone moves the "
                "curve (of the loss; of the head and the loss); a gradient error is one step's at the initial weights, "
                "against the float64 head's; the time per step includes the optimizer and a sync.")
    for n, r in group(results, "step").items():
        section(f"`bench/step.py`: {n}", {n: r}, step_table(r),
                "The training step (the loss and `loss.backward()` into the logits' gradient) over a copy of the "
                "logits, `y.copy_(x)`: triton's `do_bench` medians in one process, with the defaults and each "
                "option (reduction none: an incoming gradient of ones); quack's one kernel (a loss a row and "
                "the gradient of their sum, no mean, no autograd) where quack-kernels was installed.")
    for n, r in group(results, "host").items():
        section(f"`bench/host.py`: {n}", {n: r}, host_table(r),
                f"Host time per call in us, logits {' x '.join(map(str, r['shape']))} {r['dtype']}: the least of "
                f"{r['rounds']} rounds of {r['calls']} calls and one synchronization, the implementations taking "
                "turns. The step: the loss and its backward into the logits' gradient (incoming gradient ones); "
                "x.sum()'s step: autograd's own cost, whatever the loss.")
    unknown = [f"`{n}`" for n, d in results.items() if kind(d) is None]
    out += ["", f"Not tabulated, in a format this script does not know: {', '.join(unknown)}."] * bool(unknown)
    pngs = [p.name for p in sorted((root / "bench" / "results").glob("*.png")) if f"{p.stem}.json" not in results]
    out += (["", "## Other plots", ""] + [f"![{p}](results/{p})" for p in pngs]) * bool(pngs)
    return "\n".join(out) + "\n"


def fill(text, blocks):
    """text with the inside of each <!-- report:NAME --> ... <!-- /report:NAME --> block replaced."""
    for name, body in blocks.items():
        start, end = f"<!-- report:{name} -->", f"<!-- /report:{name} -->"
        if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
            raise ValueError(f"README.md needs exactly one {start} ... {end} block")
        head, rest = text.split(start)
        text = head + start + "\n" + body + "\n" + end + rest.split(end, 1)[1]
    return text


def outputs(root=ROOT):
    """{path: the text it should hold} for bench/RESULTS.md and README.md."""
    results, readme = load(root), root / "README.md"
    return {root / "bench" / "RESULTS.md": results_md(root, results),
            readme: fill(readme.read_text(), headlines(results))}


def stale(root=ROOT):
    """A unified diff for each generated file that is not what the results give."""
    diffs = []
    for path, want in outputs(root).items():
        have, rel = path.read_text() if path.exists() else "", path.relative_to(root).as_posix()
        if have != want:
            diffs.append("".join(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                                      f"{rel} (as it is)", f"{rel} (from bench/results)")))
    return diffs


def write(root=ROOT):
    for path, text in outputs(root).items():
        path.write_text(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1, with a diff, where a generated file is stale")
    if not ap.parse_args(argv).check:
        write()
        return 0
    diffs = stale()
    sys.stdout.write("".join(diffs) + "stale: run python3 bench/report.py\n" * bool(diffs))
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
