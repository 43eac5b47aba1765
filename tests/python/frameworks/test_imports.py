"""Each integration module imports nothing of the other frameworks (so it imports with only its
own installed): in a fresh interpreter, after importing it, none of them is in sys.modules."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
FRAMEWORKS = {"samplerd.lightning": "lightning", "samplerd.accelerate": "accelerate",
              "samplerd.transformers": "transformers", "samplerd.torchdata": "torchdata"}
# What each module needs besides torch (the Trainer is built on Accelerate).
NEEDS = {"samplerd.transformers": {"accelerate"}}


@pytest.mark.parametrize("module", sorted(FRAMEWORKS))
def test_module_imports_without_the_other_frameworks(module):
    pytest.importorskip(FRAMEWORKS[module])
    blocked = sorted(set(FRAMEWORKS.values()) - {FRAMEWORKS[module]} - NEEDS.get(module, set()))
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'client' / 'python')!r})\n"
            + f"import {module}\n"
            + f"loaded = [b for b in {blocked!r} if b in sys.modules]\n"
            + "assert not loaded, loaded\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr


def test_the_package_is_typed():
    assert (ROOT / "client" / "python" / "samplerd" / "py.typed").exists()
    assert 'samplerd = ["py.typed"]' in (ROOT / "client" / "python" / "pyproject.toml").read_text()
