"""The conformance tool itself: it runs, reports, survives crashing and hanging cases, and fails
on baseline regressions."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(tmp_path, *args, env=None):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch_neuronx.conformance", "--out", str(out), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})},
                       timeout=300)
    results = None
    if (out / "results.json").exists():
        results = json.loads((out / "results.json").read_text())
    return p, results, out


def by_id(results):
    return {r["id"]: r for r in results["results"]}


def test_sweep_reports_every_category(tmp_path):
    p, res, out = run(tmp_path, "--ops", "add,mm", "--dtypes", "float32,int64", "--modules", "Linear",
                      "--optims", "SGD", "--max-samples", "3", "--jobs", "2")
    assert p.returncode == 0, p.stdout + p.stderr
    cats = {r["cat"] for r in res["results"]}
    assert {"forward", "out", "inplace", "noncontiguous", "backward", "module_forward", "module_backward",
            "optim"} <= cats
    assert all(r["outcome"] in ("pass", "skip") for r in res["results"]), \
        [r for r in res["results"] if r["outcome"] not in ("pass", "skip")]
    ids = by_id(res)
    assert ids["add|float32|forward|0"]["bitwise"] is True
    # No gradients for integer dtypes: no backward cases are generated for them.
    assert not any(i.startswith("mm|int64|backward|") for i in ids)
    assert ids["mm|float32|backward|0"]["outcome"] == "pass"
    md = (out / "report.md").read_text()
    assert "| `add` |" in md and "## Summary" in md and "Linear" in md and "SGD" in md
    assert "op total" in p.stdout


def test_crashing_case_is_an_error_and_the_sweep_goes_on(tmp_path):
    victim = "add|float32|forward|1"
    p, res, _ = run(tmp_path, "--ops", "add", "--dtypes", "float32", "--kinds", "ops", "--max-samples", "3",
                    "--jobs", "1", env={"_TORCH_NEURONX_CONFORMANCE_FAULT": "crash:" + victim})
    ids = by_id(res)
    assert ids[victim]["outcome"] == "error"
    assert "worker process died (signal SIGABRT)" in ids[victim]["detail"]
    # The cases after the crash still ran.
    assert ids["add|float32|forward|2"]["outcome"] == "pass"
    assert ids["add|float32|backward|0"]["outcome"] == "pass"
    assert p.returncode == 1 and "worker crash" in p.stdout


def test_hanging_case_times_out(tmp_path):
    victim = "mul|float32|out|0"
    p, res, _ = run(tmp_path, "--ops", "mul", "--dtypes", "float32", "--kinds", "ops", "--max-samples", "2",
                    "--jobs", "1", "--timeout", "5", env={"_TORCH_NEURONX_CONFORMANCE_FAULT": "hang:" + victim})
    ids = by_id(res)
    assert ids[victim]["outcome"] == "error" and "timed out after 5 s" in ids[victim]["detail"]
    assert ids["mul|float32|out|1"]["outcome"] == "pass"
    assert p.returncode == 1


def test_baseline_regression_fails(tmp_path):
    base = tmp_path / "baseline.txt"
    p, res, _ = run(tmp_path, "--ops", "sub", "--dtypes", "float32", "--kinds", "ops", "--max-samples", "2",
                    "--jobs", "1", "--write-baseline", str(base))
    assert p.returncode == 0, p.stdout + p.stderr
    ids = base.read_text().split()
    assert "sub|float32|forward|0" in ids
    p, _, _ = run(tmp_path, "--ops", "sub", "--dtypes", "float32", "--kinds", "ops", "--max-samples", "2",
                  "--jobs", "1", "--baseline", str(base))
    assert p.returncode == 0 and f"all {len(ids)} cases" in p.stdout
    base.write_text(base.read_text() + "sub|float32|forward|99\n")
    p, _, _ = run(tmp_path, "--ops", "sub", "--dtypes", "float32", "--kinds", "ops", "--max-samples", "2",
                  "--jobs", "1", "--baseline", str(base))
    assert p.returncode == 1 and "sub|float32|forward|99: not run" in p.stdout


def test_error_inputs_compare_exception_types_with_cpu(tmp_path):
    p, res, _ = run(tmp_path, "--ops", "gather,index_select,narrow_copy", "--dtypes", "any", "--kinds", "ops",
                    "--jobs", "1")
    errs = [r for r in res["results"] if r["cat"] == "error_inputs"]
    assert len(errs) >= 5
    assert all(r["outcome"] == "pass" for r in errs), [r for r in errs if r["outcome"] != "pass"]


def test_single_case_mode():
    p = subprocess.run([sys.executable, "-m", "torch_neuronx.conformance", "--case", "mm|float32|forward|0"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0 and "result: (True" in p.stdout


def test_unknown_selection_is_an_error(tmp_path):
    p, _, _ = run(tmp_path, "--ops", "no_such_op", "--kinds", "ops")
    assert p.returncode == 2 and "no op, module or optimizer matches" in p.stderr


@pytest.mark.parametrize("bad", [["--jobs", "x"], ["--kinds", "ops", "--timeout", "nope"]])
def test_bad_arguments(tmp_path, bad):
    p, _, _ = run(tmp_path, *bad)
    assert p.returncode == 2 and "invalid" in p.stderr


def test_upstream_comparison_counts_cpu_passes_and_sets_cpu_only_tests_apart(tmp_path):
    from torch_neuronx.conformance import upstream

    cpu = {"rc": 1, "outcomes": {"A::t1": ("pass", ""), "A::t2": ("pass", ""), "A::t3": ("fail", "x"),
                                 "A::t4": ("pass", ""), "A::t5": ("pass", ""), "A::t6": ("pass", "")}}
    neuron = {"rc": 1, "outcomes": {"A::t1": ("pass", ""), "A::t2": ("fail", "boom"), "A::t3": ("pass", ""),
                                    "A::t4": ("skip", "Only runs on cpu"), "A::t6": ("skip", "other reason")}}
    c = upstream.compare(cpu, neuron)
    # t4 skipped as CPU-only and t5 never instantiated for neuron: apart; t2 failed, t6 skipped.
    assert (c["cpu_pass"], c["neuron_pass"], c["cpu_only"]) == (3, 1, 2)
    assert set(c["missing"]) == {"A::t2", "A::t6"}
    timed_out = upstream.compare(cpu, dict(neuron, rc="timeout"))
    assert timed_out["missing"]["A::t5"][0] == "not run" and timed_out["cpu_only"] == 1
    # The section survives a regenerated conformance report.
    md = upstream.markdown({"torch": "2.13.0", "date": "d", "files": {
        "test_x.py": {"compare": c, "neuron": {"seconds": 1.0, "rc": 1}, "cpu": {"seconds": 1.0, "rc": 0}}}}, "cmd")
    doc = tmp_path / "op_support.md"
    upstream.write_docs(str(doc), md)
    kept = upstream.keep_section(doc.read_text(), "# new report\n")
    assert kept.startswith("# new report") and "`test_x.py` | 3 | 1 | 33.3% | 2 |" in kept
    assert upstream._normalize("test_x.TestFooPRIVATEUSE1", "test_bar_neuron_float32", "neuron") == \
        "TestFoo::test_bar_float32"
    assert upstream._normalize("test_x.TestFooCPU", "test_bar_cpu_float32", "cpu") == "TestFoo::test_bar_float32"
    # A sample of a file (--select) says so in its row.
    md = upstream.markdown({"torch": "2.13.0", "date": "d", "files": {
        "test_y.py": {"compare": c, "neuron": {"seconds": 1.0, "rc": 0, "select": "float32"},
                      "cpu": {"seconds": 1.0, "rc": 0, "select": "float32"}}}}, "cmd")
    assert "| `test_y.py` (only tests matching `-k float32`) | 3 | 1 |" in md


def test_upstream_chunked_run_keeps_finished_chunks_and_resumes(tmp_path):
    """A file run in chunks has one report per chunk; a rerun into the same folder runs only the
    chunks without a report, and the outcomes are merged across chunks."""
    from torch_neuronx.conformance import upstream

    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    runs = tmp_path / "runs.txt"
    (src / "test_fake.py").write_text(
        "import pathlib\n"
        + "".join(f"def test_{i}():\n    pathlib.Path({str(runs)!r}).open('a').write('{i}\\n')\n"
                  + ("    assert False\n" if i == 3 else "") for i in range(5)))
    first = upstream.run_file(str(src), "test_fake.py", "cpu", str(out), timeout=120, chunk=2)
    assert first["chunks"] == 3 and first["rc"] == 1  # a test failed; every chunk ran
    assert sorted(first["outcomes"]) == [f"test_fake::test_{i}" for i in range(5)]
    assert first["outcomes"]["test_fake::test_3"][0] == "fail"
    assert sorted(runs.read_text().split()) == [str(i) for i in range(5)]
    # The middle chunk (tests 2 and 3) lost its report, as a run stopped by its time limit would.
    (out / "test_fake.cpu.001.xml").unlink()
    runs.write_text("")
    again = upstream.run_file(str(src), "test_fake.py", "cpu", str(out), timeout=120, chunk=2)
    assert sorted(runs.read_text().split()) == ["2", "3"]
    assert again["outcomes"] == first["outcomes"]
    assert upstream.load_run(str(out), "test_fake.py", "cpu")["outcomes"] == first["outcomes"]


def test_upstream_record_keeps_other_files_rows(tmp_path):
    """A run of some files replaces their rows in the record behind the docs table and keeps the
    other files' rows, each with the command and date of its own run."""
    from torch_neuronx.conformance import upstream

    c = {"cpu_pass": 4, "neuron_pass": 3, "cpu_only": 0, "missing": {"A::t": ["fail", "boom"]}}
    run = lambda files, date: {"torch": "2.13.0", "date": date, "files": {  # noqa: E731
        f: {"compare": c, "neuron": {"seconds": 1.0, "rc": 1}, "cpu": {"seconds": 1.0, "rc": 0}} for f in files}}
    record = tmp_path / upstream.RECORD
    upstream.merge_record(str(record), run(["test_ops.py", "test_x.py"], "d1"), "cmd1")
    merged = upstream.merge_record(str(record), run(["test_x.py"], "d2"), "cmd2")
    assert list(merged["files"]) == ["test_ops.py", "test_x.py"]
    assert merged["files"]["test_ops.py"]["date"] == "d1" and merged["files"]["test_x.py"]["command"] == "cmd2"
    md = upstream.markdown(merged, "cmd2")
    assert "1. `cmd1` (torch 2.13.0, d1)" in md and "2. `cmd2` (torch 2.13.0, d2)" in md
    assert "| `test_ops.py` | 4 | 3 | 75.0% | 0 | 1.0 s, exit 1 | [1] |" in md
    assert "| `test_x.py` | 4 | 3 | 75.0% | 0 | 1.0 s, exit 1 | [2] |" in md
    assert md.count("| `A::t` | fail | boom |") == 2
