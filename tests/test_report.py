"""bench/report.py on the CPU: the committed tables are what the committed results give, and a stale
one is caught."""
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("report", ROOT / "bench" / "report.py")
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


@pytest.fixture
def tree(tmp_path):
    """A copy of what report.py reads and writes: bench/results/, bench/RESULTS.md, README.md."""
    shutil.copytree(ROOT / "bench" / "results", tmp_path / "bench" / "results")
    for name in ("README.md", "bench/RESULTS.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def block(text, name):
    start, end = f"<!-- report:{name} -->", f"<!-- /report:{name} -->"
    return text.split(start)[1].split(end)[0]


def test_the_committed_tables_are_current():
    assert report.stale() == [], "run python3 bench/report.py"
    assert report.main(["--check"]) == 0


def test_every_results_file_has_a_table():
    text = (ROOT / "bench" / "RESULTS.md").read_text()
    for path in (ROOT / "bench" / "results").glob("*.json"):
        assert report.kind(json.loads(path.read_text())) is not None, path.name
        assert f"`bench/results/{path.name}`" in text
    for path in (ROOT / "bench" / "results").glob("*.png"):
        assert f"](results/{path.name})" in text


def test_the_readme_blocks_are_short_and_name_their_source():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150  # read in minutes: full tables in RESULTS.md, the rest in docs/
    for name in ("forward", "training"):
        body = block(readme, name)
        assert "Source: `bench/results/" in body and "Date: " in body
        assert 3 <= sum(line.startswith("| ") for line in body.splitlines()) <= 12  # header + <= 10 rows


def test_a_hand_edited_readme_block_is_caught(tree):
    report.write(tree)  # from a current tree, whatever the checkout's state
    readme = tree / "README.md"
    text = readme.read_text()
    body = block(text, "forward")
    edited = body.replace("| fp32 |", "| fp32 (edited) |")
    assert edited != body
    readme.write_text(text.replace(body, edited))
    diffs = report.stale(tree)
    assert len(diffs) == 1 and "README.md" in diffs[0] and "(edited)" in diffs[0]
    report.write(tree)
    assert report.stale(tree) == [] and readme.read_text() == text


def test_a_changed_result_makes_both_files_stale(tree):
    path = tree / "bench" / "results" / "h100_train.json"
    rows = json.loads(path.read_text())
    rows[0]["mean_ms"] *= 2  # the first row: ModelNew's step at the first shape
    path.write_text(json.dumps(rows))
    diffs = report.stale(tree)
    assert sorted(d.splitlines()[0].split()[1] for d in diffs) == ["README.md", "bench/RESULTS.md"]


def test_a_missing_marker_is_an_error(tree):
    readme = tree / "README.md"
    readme.write_text(readme.read_text().replace("<!-- /report:training -->", ""))
    with pytest.raises(ValueError, match="report:training"):
        report.stale(tree)


def test_a_file_without_a_date_says_so_and_one_with_a_date_gives_it():
    assert report.provenance({"a.json": {"device": "GPU", "torch": "2.x"}}).endswith(
        "Date: not recorded in the file.")
    assert "Date: 2030-01-02." in report.provenance({"a.json": {"device": "GPU", "torch": "2.x", "date": "2030-01-02"}})
    both = report.provenance({"a.json": {"device": "GPU"}, "b.json": {"device": "GPU", "date": "2030-01-02"}})
    assert both.endswith("Date: not recorded (a.json); 2030-01-02 (b.json).")


def test_steps_are_tabulated_over_the_copy(tree):
    """bench/step.py's file: a row per shape, the copy's median and each step's over it."""
    times = {"copy": 0.1, "defaults": 0.12, "label smoothing": 0.125, "quack one kernel": 0.105}
    data = {"device": "GPU", "torch": "2.x", "date": "2030-01-02", "quack": True,
            "rows": [{"N": 8, "C": 4096, "dtype": "bfloat16", "median_ms": times}]}
    (tree / "bench" / "results" / "gpu_step.json").write_text(json.dumps(data))
    report.write(tree)
    text = (tree / "bench" / "RESULTS.md").read_text()
    assert "| logits | dtype | copy | defaults | label smoothing | quack one kernel |" in text
    assert "| 8 x 4096 | bfloat16 | 0.100 ms | 1.20x | 1.25x | 1.05x |" in text


def test_host_times_are_tabulated_against_eager(tree):
    """bench/host.py's file: a row per case, each time beside eager's and their ratio."""
    rows = [{"case": "defaults", "kind": "forward", "crossent_us": 12.0, "ModelNew_us": 11.0, "eager_us": 16.0},
            {"case": "defaults", "kind": "step", "crossent_us": 80.0, "eager_us": 180.0}]
    data = {"device": "GPU", "torch": "2.x", "date": "2030-01-02", "shape": [1024, 1000], "dtype": "bfloat16",
            "calls": 300, "rounds": 5, "host": rows}
    (tree / "bench" / "results" / "gpu_host.json").write_text(json.dumps(data))
    report.write(tree)
    text = (tree / "bench" / "RESULTS.md").read_text()
    assert "| defaults | 12.0 | 11.0 | 16.0 | 0.75x | 80.0 | 180.0 | 0.44x |" in text


def test_linear_and_parallel_results_are_tabulated_against_their_floors(tree):
    """bench/linear.py's rows: time over the floor the row names, memory in GiB; bench/parallel.py's:
    each rank's time, the loss's worst rank over its copy plus the all-gather."""
    common = {"device": "GPU", "torch": "2.x", "date": "2030-01-02", "dtype": "bfloat16"}
    linear = [dict(common, N=8, D=4, V=16, impl=impl, median_ms=t, floor=f, floor_ms=ft, peak_extra_bytes=2**30,
                   correct=c) for impl, t, f, ft, c in (("matmuls", 10.0, "matmuls", 10.0, None),
                                                         ("crossent", 10.5, "matmuls", 10.0, True))]
    parallel = [dict(common, N=8, V=16, ranks=2, impl=impl, median_ms=t, correct=c)
                for impl, t, c in (("copy", [1.0, 1.0], None), ("all-gather", [0.1, 0.2], None),
                                   ("crossent", [2.2, 2.4], True))]
    (tree / "bench" / "results" / "gpu_linear.json").write_text(json.dumps(linear))
    (tree / "bench" / "results" / "gpu_parallel.json").write_text(json.dumps(parallel))
    report.write(tree)
    text = (tree / "bench" / "RESULTS.md").read_text()
    assert "| 8 x 4 x 16 | crossent | 10.5 ms | 1.05x matmuls | 1.00 GiB | yes |" in text
    assert "| 8 x 16 over 2 | crossent | 2.20 ms / 2.40 ms | 2.00x | yes |" in text


def test_the_forward_sweep_is_tabulated_against_the_read(tree):
    """bench/sweep.py's forward rows: a row per shape and dtype, ModelNew's share of the read, and eager's
    time over ModelNew's; torch.compile's cell empty where it was not timed."""
    rows = [{"N": 8, "C": 4096, "dtype": "bfloat16", "impl": impl, "mean_ms": t, "bytes": 8 * 4096 * 2, "tbps": 1.0,
             "pass_means_ms": [t] * (1 if impl == "compile" else 2), "device": "GPU", "torch": "2.x",
             "date": "2030-01-02"} for impl, t in (("floor", 0.097), ("model_new", 0.1), ("eager", 0.4))]
    rows.append({**rows[1], "N": 16, "impl": "compile", "mean_ms": 0.2, "pass_means_ms": [0.2]})
    rows += [{**r, "N": 16} for r in rows[:3]]
    (tree / "bench" / "results" / "gpu_sweep.json").write_text(json.dumps(rows))
    report.write(tree)
    text = (tree / "bench" / "RESULTS.md").read_text()
    assert "the best of 2 passes" in text  # ModelNew's passes: torch.compile is timed once
    assert "| 8 x 4096 | bfloat16 | 0.1 | 0.0970 ms | 0.100 ms | 97.0% | 4.00x |  |" in text
    assert "| 16 x 4096 | bfloat16 | 0.1 | 0.0970 ms | 0.100 ms | 97.0% | 4.00x | 2.00x |" in text


def test_the_training_headline_keeps_each_gpus_figures_in_its_columns():
    """Sweeps of different shapes side by side: a shape one file lacks leaves that file's cells empty,
    and a file that records no GPU is named by its file name."""
    def row(n, impl, mean, device):
        return {"N": n, "C": 10, "dtype": "float32", "impl": impl, "mean_ms": mean, "median_ms": mean, "copy_ms": 1.0,
                **({"device": device} if device else {})}
    files = {"a.json": [row(1, "model_new", 1.5, "NVIDIA A"), row(2, "model_new", 2.5, "NVIDIA A")],
             "b.json": [row(2, "model_new", 3.5, None), row(2, "eager", 7.0, None)]}
    text = report.train_headline(files)
    assert "| A: ModelNew / copy (median) |" in text and "| b.json: ModelNew / copy (median) |" in text
    assert "| 1 x 10 | float32 | 1.50x (1.50x) |  |  |  |  |  |" in text
    assert "| 2 x 10 | float32 | 2.50x (2.50x) |  |  | 3.50x (3.50x) |  | 7.00x |" in text
