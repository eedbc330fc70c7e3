"""Runs pytest files against the extension built with AddressSanitizer and UBSan (`make sanitize`).

Builds `_C` with `-DNEURONX_SANITIZE=address,undefined` in its own CMake directory (the normal
build and the installed extension are left alone), stages a copy of the `torch_neuronx` package
with that extension beside it, and runs pytest with the staged package first on the path and
gcc's libasan (and libstdc++) preloaded into the interpreter (Python and torch are not instrumented; everything
of ours is). Leak checking is off: the interpreter's own allocations at exit are not ours to fix.
A sanitizer report aborts the test process, so pytest fails.

    python tests/reliability/sanitize_extension.py [--build-dir DIR] TEST_FILE...
"""
import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build(build_dir):
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    torch_root = subprocess.check_output(
        [sys.executable, "-c", "import os, torch; print(os.path.dirname(torch.__file__))"], env=env, text=True).strip()
    if not (build_dir / "build.ninja").exists():
        subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
                               f"-DTORCH_ROOT={torch_root}", f"-DPython3_EXECUTABLE={sys.executable}",
                               "-DNEURONX_SANITIZE=address,undefined", "-DNEURONX_BUILD_TESTS=OFF"])
    subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "_C", "-j", str(os.cpu_count() or 2)])
    return build_dir / "python" / f"_C{sysconfig.get_config_var('EXT_SUFFIX')}"


def stage(build_dir, extension):
    """A copy of the package whose _C is the sanitized one."""
    dest = build_dir / "stage" / "torch_neuronx"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(ROOT / "torch_neuronx", dest, ignore=shutil.ignore_patterns("_C*.so", "__pycache__"))
    shutil.copy2(extension, dest / extension.name)
    return dest.parent


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build-dir", default=str(ROOT / "build-asan-ext"))
    p.add_argument("tests", nargs="+")
    args = p.parse_args()
    build_dir = Path(args.build_dir).resolve()
    staged = stage(build_dir, build(build_dir))
    # libstdc++ preloaded too: the interpreter does not link it, and ASan's __cxa_throw interceptor
    # must find the real one when it starts (otherwise the first C++ exception aborts).
    preload = [subprocess.check_output(["gcc", f"-print-file-name={lib}"], text=True).strip()
               for lib in ("libasan.so", "libstdc++.so")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(staged), os.environ.get("PYTHONPATH")])),
               LD_PRELOAD=" ".join(preload),
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    # -P: the working directory's torch_neuronx (the uninstrumented one) must not come first.
    probe = subprocess.run([sys.executable, "-P", "-c",
                            "import torch, torch_neuronx._C as c; print(c.__file__)"],
                           env=env, capture_output=True, text=True)
    where = probe.stdout.strip()
    if probe.returncode or not where.startswith(str(staged)):
        raise SystemExit(f"the sanitized extension did not load (got {where!r}):\n{probe.stderr[-3000:]}")
    symbols = subprocess.check_output(["nm", "-D", where], text=True)
    if "__asan_report" not in symbols or "__ubsan_handle" not in symbols:
        raise SystemExit(f"{where} is not instrumented with ASan and UBSan")
    print(f"sanitized extension: {where}", flush=True)
    rc = subprocess.call([sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.tests],
                         cwd=ROOT, env=env)
    if rc == 5:
        raise SystemExit("pytest collected no tests")
    raise SystemExit(rc)


if __name__ == "__main__":
    main()
