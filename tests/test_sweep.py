"""bench/sweep.py's bookkeeping, on the CPU: best pass per implementation, files, table."""
import json
import os
import shutil
import sys
import types

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
import step  # noqa: E402
import sweep  # noqa: E402


def test_sweep_keeps_each_implementations_best_pass(tmp_path, monkeypatch):
    calls = []

    def fake_measure(n, c, d, impls, trials, fns):
        calls.append(impls)
        slow = len(calls) == 1  # the first pass is the slow one
        return [{"N": n, "C": c, "dtype": d, "impl": i, "mean_ms": (2.0 if slow else 1.0) + k,
                 "bytes": n * c * 4, "tbps": 1.0} for k, i in enumerate(impls)]

    monkeypatch.setattr(sweep, "measure", fake_measure)
    monkeypatch.setattr(sweep.run_eval, "stream_read_fn", lambda device: None)
    monkeypatch.setattr(sweep.torch.cuda, "get_device_name", lambda *a: "test device")
    monkeypatch.setattr(sweep, "crossent", types.SimpleNamespace(ModelNew=lambda: None))
    monkeypatch.setattr(sweep, "can_plot", lambda: True)
    monkeypatch.setattr(sweep, "plot", lambda rows, path, title: open(path, "w").close())
    out = str(tmp_path / "sweep")
    assert sweep.main(["--shapes", "4x5", "--dtypes", "float32", "--passes", "2", "--out", out]) == 0
    assert calls == [("floor", "model_new", "eager")] * 2 + [("compile",)]
    rows = {r["impl"]: r for r in json.load(open(out + ".json"))}
    assert set(rows) == {"floor", "model_new", "eager", "compile"}
    assert rows["model_new"]["mean_ms"] == 2.0 and rows["model_new"]["pass_means_ms"] == [3.0, 2.0]
    assert rows["compile"]["mean_ms"] == 1.0 and rows["compile"]["pass_means_ms"] == [1.0]
    assert os.path.exists(out + ".png")
    assert "4 x 5" in sweep.table(list(rows.values()))
    calls.clear()  # --no-compile: the two passes alone, and a table and plot without compile's rows
    assert sweep.main(["--shapes", "4x5", "--dtypes", "float32", "--passes", "2", "--no-compile", "--out", out]) == 0
    assert calls == [("floor", "model_new", "eager")] * 2
    rows = json.load(open(out + ".json"))
    assert {r["impl"] for r in rows} == {"floor", "model_new", "eager"} and "nan" in sweep.table(rows)


def test_the_options_sweeps_reference_is_pytorchs():
    """expected_loss (tests/cases.py), which the options sweep checks ModelNew against, is PyTorch's
    loss in float64 (plus z_loss * lse**2 per counted row), block by block."""
    import torch
    x, t, w = torch.randn(300, 7), torch.randint(0, 7, (300,)), torch.rand(7)
    t[::5] = -100
    for reduction in ["none", "sum", "mean"]:
        for weight in [None, w]:
            want = torch.nn.functional.cross_entropy(x.double(), t, None if weight is None else weight.double(),
                                                     reduction=reduction)
            torch.testing.assert_close(sweep.expected_loss(x, t, weight=weight, reduction=reduction), want)
    lse = torch.logsumexp(x.double(), 1)
    z = torch.where(t != -100, 0.5 * lse**2, 0.0)
    torch.testing.assert_close(sweep.expected_loss(x, t, reduction="none", z_loss=0.5),
                               torch.nn.functional.cross_entropy(x.double(), t, reduction="none") + z)
    for weight in [None, w]:
        for reduction in ["none", "mean"]:
            want = torch.nn.functional.cross_entropy(x.double(), t, None if weight is None else weight.double(),
                                                     reduction=reduction, label_smoothing=0.2)
            torch.testing.assert_close(sweep.expected_loss(x, t, weight=weight, reduction=reduction,
                                                             label_smoothing=0.2), want)
    assert set(sweep.OPTIONS["weight, none, ignore 10%"]) <= sweep.PYTORCH_OPTIONS and "defaults" in sweep.OPTIONS


def test_the_options_sweep_keeps_each_rows_best_pass_and_every_passs_check(tmp_path, monkeypatch):
    calls = []

    def fake(n, c, d, trials, floor_fn, sets):
        assert sets == ["sum", "softcap, none, ignore 10%"]
        calls.append(n)
        k = len(calls)
        return [{"N": n, "C": c, "dtype": d, "options": "sum", "impl": "model_new", "mean_ms": [3.0, 1.0, 2.0][k - 1],
                 "floor_ms": 1.0, "fraction_of_floor": 1 / [3.0, 1.0, 2.0][k - 1], "correct": k != 3}]

    monkeypatch.setattr(sweep, "measure_options", fake)
    monkeypatch.setattr(sweep.run_eval, "stream_read_fn", lambda device: None)
    monkeypatch.setattr(sweep.torch.cuda, "get_device_name", lambda *a: "test device")
    out = str(tmp_path / "options")
    assert sweep.main(["--options", "--shapes", "8192x8192,4x5", "--dtypes", "float32", "--passes", "3",
                       "--sets", "sum;softcap, none, ignore 10%", "--out", out]) == 1  # the third pass failed its check
    assert calls == [8192] * 3  # 4 x 5 is under 64 MiB
    (row,) = json.load(open(out + ".json"))
    assert row["mean_ms"] == 1.0 and row["correct"] is False and row["passes"] == 3


@pytest.mark.parametrize("kind", ["options", "kdim"])
def test_the_committed_options_and_kdim_sweeps_redraw(kind, tmp_path):
    """--plot-only draws each committed sweep's rows (a panel per dtype, or a bar per shape and dtype)."""
    pytest.importorskip("matplotlib", reason="matplotlib (the bench extra) draws the plots")
    out = tmp_path / f"h200_{kind}"
    shutil.copyfile(os.path.join(ROOT, "bench", "results", f"h200_{kind}.json"), out.with_suffix(".json"))
    assert sweep.main(["--plot-only", f"--{kind}", "--out", str(out)]) == 0
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_training_sweep_takes_the_shapes_the_targets_name(tmp_path, monkeypatch):
    """KernelBench's shape in both precisions and the LLM vocabularies in bfloat16, every forward sweep
    shape of 64 MiB or more in bfloat16 among them; --plot-only redraws the training plot."""
    assert {(32768, 4096, "float32"), (32768, 4096, "bfloat16"), (16384, 32000, "bfloat16"),
            (8192, 128256, "bfloat16"), (4096, 256000, "bfloat16")} <= set(sweep.TRAIN_SHAPES)
    big = {(n, c) for n, c in sweep.SHAPES if n * c * 2 >= sweep.OPTIONS_MIN_BYTES}
    assert big <= {(n, c) for n, c, d in sweep.TRAIN_SHAPES if d == "bfloat16"}
    out = str(tmp_path / "train")
    rows = [{"N": 4, "C": 5, "dtype": "float32", "impl": "model_new", "mean_ms": 1.0, "copy_ms": 1.0,
             "peak_extra_bytes": 80, "device": "test device"}]
    json.dump(rows, open(out + ".json", "w"))
    drawn = []
    monkeypatch.setattr(sweep, "plot_train", lambda rows, path: drawn.append((rows, path)))
    assert sweep.main(["--train", "--plot-only", "--out", out]) == 0
    assert drawn == [(rows, out + ".png")]


def test_the_step_bench_times_every_option_beside_the_copy(tmp_path, monkeypatch):
    """bench/step.py: each shape's figures as measure gives them, whether quack ran, and the issue's shapes."""
    assert {(32768, 4096, "float32"), (32768, 4096, "bfloat16"), (8192, 50257, "bfloat16"),
            (65536, 1000, "bfloat16")} <= set(step.SHAPES)
    got = []

    def fake_measure(n, c, dtype, quack, rep):
        got.append((n, c, dtype, quack, rep))
        return {"copy": 1.0, **{name: 1.1 for name in step.OPTIONS}}

    monkeypatch.setattr(step, "measure", fake_measure)
    monkeypatch.setattr(step, "quack_step", lambda: None)
    monkeypatch.setattr(step.torch.cuda, "get_device_name", lambda *a: "test device")
    out = tmp_path / "step.json"
    assert step.main(["--shapes", "4x5:float32,6x7", "--rep", "3", "--json", str(out)]) == 0  # bfloat16 unnamed
    assert got == [(4, 5, step.torch.float32, None, 3), (6, 7, step.torch.bfloat16, None, 3)]
    data = json.loads(out.read_text())
    assert data["quack"] is False and data["device"] == "test device"
    assert [(r["N"], r["C"], r["dtype"]) for r in data["rows"]] == [(4, 5, "float32"), (6, 7, "bfloat16")]
    assert set(data["rows"][0]["median_ms"]) == {"copy", *step.OPTIONS}
