"""Builds torch_neuronx._C with CMake + ninja (+ ccache) against the installed torch.

The CMake build directory (build/) persists between builds, so rebuilding after
a change recompiles only what changed; `pip install -e . --no-build-isolation`
works and places the extension inside the source package.
"""
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        # Only torch's location is needed: do not autoload device backends (a stale or
        # half-installed torch_neuronx would otherwise break its own rebuild).
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        import torch

        build_dir = Path(os.environ.get("NEURONX_BUILD_DIR", ROOT / "build"))
        build_dir.mkdir(parents=True, exist_ok=True)
        torch_root = Path(torch.__file__).resolve().parent
        cfg = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
            f"-DTORCH_ROOT={torch_root}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DCMAKE_BUILD_TYPE={os.environ.get('NEURONX_BUILD_TYPE', 'RelWithDebInfo')}",
        ]
        if not (build_dir / "build.ninja").exists() or os.environ.get("NEURONX_RECONFIGURE"):
            subprocess.check_call(cfg)
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 2))
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "_C", "-j", jobs])
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = build_dir / "python" / f"_C{suffix}"
        dest = Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        _replace(built, dest)

    def copy_file(self, infile, outfile, *args, **kwargs):
        # `--inplace` copies the library into the source tree through here.
        _replace(Path(infile), Path(outfile))
        return str(outfile), 1


def _replace(src, dest):
    # Copy then rename: a process that has the old library loaded keeps its
    # mapping (writing over it in place would crash that process).
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.copy2(src, tmp)
    os.replace(tmp, dest)


setup(ext_modules=[CMakeExtension("torch_neuronx._C")], cmdclass={"build_ext": CMakeBuild})
