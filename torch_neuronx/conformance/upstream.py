"""PyTorch's own device-generic test files run against ``neuron``, compared with CPU.

Each file runs twice in a fresh interpreter: instantiated for CPU and for neuron
(``PYTORCH_TESTING_DEVICE_ONLY_FOR``). Tests are matched by name with the device suffix removed;
the measure is how many of the tests that pass on CPU also pass on neuron. A file that does not
finish within its time limit counts every test it did not report as not passing. The files are
read where they are (never copied into the project)::

    python -m torch_neuronx.conformance.upstream --dir ../shared/upstream-tests --docs docs/op_support.md
"""
import argparse
import concurrent.futures
import glob
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

# File -> extra pytest arguments (test_ops.py is large: the subset the issue names).
FILES = {
    "test_ops.py": ["-k", "test_noncontiguous_samples or test_out or test_variant_consistency_eager or test_errors "
                          "or (test_python_ref and float32)"],
    "test_modules.py": [],
    "test_view_ops.py": [],
    "test_shape_ops.py": [],
    "test_sort_and_select.py": [],
    "test_indexing.py": [],
    "test_unary_ufuncs.py": [],
}
# Why a test that passes on CPU does not pass on neuron, where the cause is known and outside
# what a backend should change (shown in the table; the test still counts as not passing).
_GROUP_NORM_GRAD = ("PyTorch's autograd formula for native_group_norm makes the gradient and the input contiguous on "
                    "every device but CPU (derivatives.yaml), so grad_input is contiguous; PyTorch skips this test "
                    "on CUDA, MPS and XPU")
REASONS = {  # file -> {test: why}
    "test_modules.py": {f"TestModule::test_memory_format_nn_GroupNorm_{dt}": _GROUP_NORM_GRAD
                        for dt in ("bfloat16", "float16", "float32", "float64")},
    "test_ops.py": {
        **{t: ("fixed after this run (e6eecbb: host checks of random ops' scalar arguments and of masked_scatter_'s "
               "mask); passes in a rerun of these tests") for t in (
            "TestCommon::test_errors_uniform", "TestCommon::test_errors_vdot",
            "TestCommon::test_variant_consistency_eager_masked_scatter_complex64",
            "TestCommon::test_variant_consistency_eager_masked_scatter_float32")},
        "TestCommon::test_errors_narrow_copy": (
            "expects CUDA's wording for an out-of-range dim on devices other than CPU (IndexError, \"Dimension out "
            "of range\"); neuron raises what CPU's kernel raises (RuntimeError, \"Expected dim < ...\"), as for "
            "every error the CPU kernel words"),
    },
}
# The per-file results behind the docs table, next to the docs file (--docs): a run of some files
# replaces their rows and keeps the others'.
RECORD = "upstream_runs.json"
BEGIN = "<!-- upstream-tests:begin -->"
END = "<!-- upstream-tests:end -->"


def _normalize(classname, name, device):
    cls = classname.rsplit(".", 1)[-1]
    cls = re.sub(r"(CPU|NEURON|PRIVATEUSE1)$", "", cls)
    name = re.sub(rf"_{device}(?=_|$)", "", name, count=1)
    return f"{cls}::{name}"


def _outcomes(xml_path, device):
    """{test: (outcome, message)} from a JUnit XML report."""
    out = {}
    if not os.path.exists(xml_path):
        return out
    try:
        root = ET.parse(xml_path).getroot()
    except ET.ParseError:
        return out
    for case in root.iter("testcase"):
        key = _normalize(case.get("classname", ""), case.get("name", ""), device)
        outcome, msg = "pass", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "fail", "error": "error", "skipped": "skip"}[child.tag]
                msg = (child.get("message") or "").strip().splitlines()[0][:300] if child.get("message") else ""
                break
        out[key] = (outcome, msg)
    return out


def _pytest(directory, targets, device, xml, log, timeout):
    """One pytest run of `targets` (a file and its arguments, or test ids) for `device`; its exit
    status, or "timeout"."""
    env = dict(os.environ, PYTORCH_TESTING_DEVICE_ONLY_FOR=device)
    cmd = [sys.executable, "-m", "pytest", *targets, "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
           "-o", "junit_logging=no"]
    with open(log, "w") as f:
        try:
            return subprocess.run(cmd, cwd=directory, env=env, stdout=f, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return "timeout"


def _chunks(directory, name, device, stem, args, chunk):
    """The file's test ids for `device` in chunks of `chunk`, collected once and kept in
    STEM.chunks.json, so that a resumed run splits the file the same way."""
    path = stem + ".chunks.json"
    if os.path.exists(path):
        return json.load(open(path))
    env = dict(os.environ, PYTORCH_TESTING_DEVICE_ONLY_FOR=device)
    out = subprocess.run([sys.executable, "-m", "pytest", name, "-q", "--collect-only", "-p", "no:cacheprovider",
                          *args], cwd=directory, env=env, capture_output=True, text=True)
    ids = [line for line in out.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if not ids:
        raise RuntimeError(f"collecting {name} for {device} found no tests:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    chunks = [ids[i:i + chunk] for i in range(0, len(ids), chunk)]
    with open(path, "w") as f:
        json.dump(chunks, f)
    return chunks


def run_file(directory, name, device, out_dir, timeout, select=None, chunk=0):
    """Runs one file for one device; select: a pytest -k expression replacing the file's own.

    With `chunk`, the file runs as pytest runs of `chunk` tests each, every one with its own
    JUnit report (STEM.NNN.xml): a run that stops at its time limit keeps the chunks it finished,
    and running again into the same folder resumes with the chunks that have no report yet."""
    stem = os.path.join(out_dir, f"{name[:-3]}.{device}")
    args = ["-k", select] if select else FILES.get(name, [])
    start = time.time()
    if not chunk:
        rc = _pytest(directory, [name, *args], device, stem + ".xml", stem + ".log", timeout)
        run = {"rc": rc, "seconds": round(time.time() - start, 1), "select": select}
    else:
        chunks = _chunks(directory, name, device, stem, args, chunk)
        rc, before = 0, 0.0
        if os.path.exists(stem + ".json"):
            before = json.load(open(stem + ".json")).get("seconds") or 0.0
        for i, ids in enumerate(chunks):
            xml = f"{stem}.{i:03d}.xml"
            if os.path.exists(xml):
                continue
            left = timeout - (time.time() - start)
            got = _pytest(directory, ids, device, xml, f"{stem}.{i:03d}.log", left) if left > 0 else "timeout"
            if got == "timeout":
                if os.path.exists(xml):
                    os.remove(xml)
                rc = "timeout"
                break
            rc = rc or got
        run = {"rc": rc, "seconds": round(before + time.time() - start, 1), "select": select, "chunks": len(chunks)}
    with open(stem + ".json", "w") as f:
        json.dump(run, f)
    return {**run, "outcomes": _outcomes_of(stem)}


def _outcomes_of(stem):
    """Outcomes from STEM.xml, or merged from a chunked run's STEM.NNN.xml reports."""
    if os.path.exists(stem + ".xml"):
        return _outcomes(stem + ".xml", _device_of(stem))
    out = {}
    for path in sorted(glob.glob(stem + ".[0-9][0-9][0-9].xml")):
        out.update(_outcomes(path, _device_of(stem)))
    return out


def _device_of(stem):
    return stem.rsplit(".", 1)[1]


def load_run(out_dir, name, device):
    """A run_file result from the files an earlier run left in out_dir (None if absent)."""
    stem = os.path.join(out_dir, f"{name[:-3]}.{device}")
    if not os.path.exists(stem + ".xml") and not glob.glob(stem + ".[0-9][0-9][0-9].xml"):
        return None
    if os.path.exists(stem + ".json"):
        run = json.load(open(stem + ".json"))
    else:  # a run from before the .json files: finished if pytest printed its summary
        tail = open(stem + ".log").read()[-400:] if os.path.exists(stem + ".log") else ""
        run = {"rc": 0 if re.search(r"\d+ (passed|failed)", tail) else "timeout", "seconds": None}
    return {**run, "outcomes": _outcomes_of(stem)}


# Tests PyTorch instantiates for CPU only (onlyCPU, or dtypes listed for CPU alone): CUDA does
# not run them either, so they are counted apart, not as failures.
CPU_ONLY_SKIP = "Only runs on cpu"


def compare(cpu, neuron):
    """Counts of the tests passing on CPU that run on other devices too, and which of those do
    not pass on neuron (with why)."""
    finished = neuron["rc"] != "timeout"
    passing, cpu_only, missing = [], 0, {}
    for t, (o, _) in cpu["outcomes"].items():
        if o != "pass":
            continue
        got = neuron["outcomes"].get(t)
        if (got and got[0] == "skip" and got[1].startswith(CPU_ONLY_SKIP)) or (got is None and finished):
            cpu_only += 1  # skipped as CPU-only, or not instantiated for neuron at all
            continue
        passing.append(t)
        o, msg = got or ("not run", "the neuron run ended (time limit) before this test")
        if o != "pass":
            missing[t] = (o, msg)
    return {"cpu_pass": len(passing), "neuron_pass": len(passing) - len(missing), "cpu_only": cpu_only,
            "missing": missing}


def markdown(results, command):
    """The section: one row per file. A file's row shows the run it comes from: its own
    ``command``/``date``/``torch`` when the results carry them (rows kept from earlier runs,
    RECORD), else this run's ``command``."""
    runs = []  # distinct (command, date, torch), numbered in the order rows use them

    def run_of(r):
        key = (r.get("command", command), r.get("date", results["date"]), r.get("torch", results["torch"]))
        if key not in runs:
            runs.append(key)
        return runs.index(key) + 1

    rows = []
    for name, r in results["files"].items():
        c = r["compare"]
        rate = 100.0 * c["neuron_pass"] / c["cpu_pass"] if c["cpu_pass"] else 100.0
        secs = r["neuron"]["seconds"]
        shown = f"`{name}`" + (f" (only tests matching `-k {r['neuron']['select']}`)" if r["neuron"].get("select") else "")
        rows.append(f"| {shown} | {c['cpu_pass']} | {c['neuron_pass']} | {rate:.1f}% | {c['cpu_only']} | "
                    f"{'' if secs is None else f'{secs} s, '}exit {r['neuron']['rc']} | [{run_of(r)}] |")
    lines = [BEGIN, "## PyTorch's own test files on `neuron`", "",
             "Each file runs instantiated for CPU and for `neuron`; a test counts when it passes on CPU, and "
             "passes on `neuron` when it passes there too. Tests PyTorch instantiates for CPU alone (`onlyCPU`, "
             "dtypes listed for CPU only) are counted apart: CUDA does not run them either. The files are "
             "PyTorch's, unmodified. Each row is the latest run of its file (kept, with its command, in "
             f"`{os.path.basename(RECORD)}` next to this file); the runs:", ""]
    lines += [f"{i}. `{cmd}` (torch {torch_version}, {date})" for i, (cmd, date, torch_version) in enumerate(runs, 1)]
    lines += ["", "| file | pass on CPU | of those, pass on neuron | rate | CPU-only tests | neuron run | run |",
              "|---|---|---|---|---|---|---|"] + rows
    lines += ["", "Tests that pass on CPU and not on `neuron`:", "",
              "| file | test | outcome on neuron | message | known cause |", "|---|---|---|---|---|"]
    for name, r in results["files"].items():
        for t, (o, msg) in sorted(r["compare"]["missing"].items()):
            why = REASONS.get(name, {}).get(t, "")
            lines.append(f"| `{name}` | `{t}` | {o} | {msg.replace('|', '/')[:200]} | {why} |")
    lines.append(END)
    return "\n".join(lines) + "\n"


def merge_record(path, results, command):
    """Results of every file run so far: the record at path (earlier runs' files, each with the
    command, date and torch of its run), updated with this run's files."""
    record = {"files": {}}
    if os.path.exists(path):
        with open(path) as f:
            record = json.load(f)
    for name, r in results["files"].items():
        record["files"][name] = {**r, "command": command, "date": results["date"], "torch": results["torch"]}
    order = [n for n in FILES if n in record["files"]] + sorted(n for n in record["files"] if n not in FILES)
    record["files"] = {n: record["files"][n] for n in order}
    with open(path, "w") as f:
        json.dump(record, f, indent=1, sort_keys=False)
        f.write("\n")
    return {"torch": results["torch"], "date": results["date"], "files": record["files"]}


def keep_section(docs_text, markdown):
    """markdown, followed by the upstream section found in docs_text (if any)."""
    if BEGIN in docs_text and END in docs_text:
        section = docs_text[docs_text.index(BEGIN):docs_text.index(END) + len(END)]
        return markdown.rstrip("\n") + "\n\n" + section + "\n"
    return markdown


def write_docs(path, section):
    """Puts the section into path between its markers (the conformance report keeps it)."""
    text = open(path).read() if os.path.exists(path) else ""
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END) + 1:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    with open(path, "w") as f:
        f.write(text)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True, help="folder holding PyTorch's test files")
    p.add_argument("--files", default=",".join(FILES), help="comma-separated test files")
    p.add_argument("--out", default="build/upstream", help="folder for logs, JUnit XML and results.json")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per file and device")
    p.add_argument("--docs", help="Markdown file to write the table into (between its markers)")
    p.add_argument("--select", action="append", default=[], metavar="FILE=EXPR",
                   help="run only the tests of FILE matching the pytest -k EXPR (a sample of a file too large "
                        "to run whole); the table says so")
    p.add_argument("--chunk", type=int, default=0, metavar="N",
                   help="run each file as pytest runs of N tests, each with its own report: a run stopped by "
                        "--timeout keeps what it finished, and a rerun into the same --out resumes")
    p.add_argument("--devices", default="cpu,neuron",
                   help="devices to run now; the others' results are read from --out (an earlier run)")
    p.add_argument("--collect", help="comma-separated folders of earlier runs: build the table from their "
                                     "results (per file, the first folder holding both runs) instead of running")
    a = p.parse_args(argv)
    import torch

    selects = dict(sel.split("=", 1) for sel in a.select)
    os.makedirs(a.out, exist_ok=True)
    results = {"torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "files": {}}
    for name in a.files.split(","):
        if a.collect:
            runs = None
            for folder in a.collect.split(","):
                found = {dev: load_run(folder, name, dev) for dev in ("cpu", "neuron")}
                if all(found.values()):
                    runs = found
                    break
            if runs is None:
                print(f"{name}: no earlier run holds both results; left out", flush=True)
                continue
        else:
            # The CPU and neuron runs of a file side by side (separate processes).
            devices = a.devices.split(",")
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                futures = {dev: pool.submit(run_file, a.dir, name, dev, os.path.abspath(a.out), a.timeout,
                                            selects.get(name), a.chunk)
                           for dev in devices}
                runs = {dev: f.result() for dev, f in futures.items()}
            for dev in ("cpu", "neuron"):
                if dev not in runs:
                    runs[dev] = load_run(a.out, name, dev)
                    if runs[dev] is None:
                        raise SystemExit(f"{name}: --devices {a.devices} needs an earlier {dev} run in {a.out}")
        c = compare(runs["cpu"], runs["neuron"])
        results["files"][name] = {"compare": c, **{d: {k: v for k, v in r.items() if k != "outcomes"}
                                                   for d, r in runs.items()}}
        print(f"{name}: {c['neuron_pass']}/{c['cpu_pass']} of CPU's passing tests pass on neuron "
              f"({runs['neuron']['seconds']} s)", flush=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    if a.docs:
        shown = ["python -m torch_neuronx.conformance.upstream --dir ../shared/upstream-tests"]
        if a.files != ",".join(FILES):
            shown.append(f"--files {a.files}")
        for name, r in results["files"].items():
            if r["neuron"].get("select"):
                shown.append(f"--select {name}={r['neuron']['select']}")
        if a.chunk:
            shown.append(f"--chunk {a.chunk}")
        command = " ".join(shown + [f"--docs {a.docs}"])
        merged = merge_record(os.path.join(os.path.dirname(os.path.abspath(a.docs)), RECORD), results, command)
        write_docs(a.docs, markdown(merged, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
