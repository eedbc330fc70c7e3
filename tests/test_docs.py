"""The Python snippets in the user guides run as written (each in a fresh namespace, in the
order the guide gives them, in a clean interpreter started in a temporary directory)."""
import pathlib
import re
import subprocess
import sys

import pytest
from helpers import clean_env

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
GUIDES = ["mixed_precision.md", "profiling.md", "torchao.md"]

_RUNNER = """
import pathlib, re, sys
text = pathlib.Path(sys.argv[1]).read_text()
blocks = re.findall(r"```python\\n(.*?)```", text, flags=re.S)
assert blocks, "no python snippets"
for i, code in enumerate(blocks):
    exec(compile(code, f"{sys.argv[1]}[snippet {i}]", "exec"), {"__name__": "__main__"})
print(f"ran {len(blocks)} snippets")
"""


@pytest.mark.parametrize("guide", GUIDES)
def test_guide_snippets_run(guide, tmp_path):
    path = DOCS / guide
    n = len(re.findall(r"```python\n", path.read_text()))
    assert n >= 3, f"{guide} should carry runnable snippets"
    env = clean_env()
    r = subprocess.run([sys.executable, "-c", _RUNNER, str(path)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"ran {n} snippets" in r.stdout
