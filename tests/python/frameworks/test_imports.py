"""Each integration module imports with only its own framework installed: in a fresh
interpreter whose site-packages lacks the other frameworks (a copy of this environment's made of
links, without their packages and metadata), importing it works and loads none of them."""

import os
import pathlib
import subprocess
import sys
import sysconfig

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
# Module -> the framework it is for; and the distributions each framework is made of.
FRAMEWORKS = {"samplerd.lightning": "lightning", "samplerd.accelerate": "accelerate",
              "samplerd.transformers": "transformers", "samplerd.torchdata": "torchdata"}
DISTRIBUTIONS = {"lightning": ("lightning", "pytorch_lightning"), "accelerate": ("accelerate",),
                 "transformers": ("transformers",), "torchdata": ("torchdata",)}
# What a module needs besides its own framework (the Trainer is built on Accelerate).
NEEDS = {"samplerd.transformers": {"accelerate"}}


def _site_without(tmp_path, names):
    site = pathlib.Path(sysconfig.get_paths()["purelib"])
    out = tmp_path / "site-packages"
    out.mkdir()
    for entry in os.listdir(site):
        top = entry.split("-")[0].lower()
        if top not in names:  # "transformers", "transformers-5.24.0.dist-info"
            (out / entry).symlink_to(site / entry)
    return out


@pytest.mark.parametrize("module", sorted(FRAMEWORKS))
def test_module_imports_without_the_other_frameworks(module, tmp_path):
    pytest.importorskip(FRAMEWORKS[module])
    others = set(FRAMEWORKS.values()) - {FRAMEWORKS[module]} - NEEDS.get(module, set())
    names = {d for f in others for d in DISTRIBUTIONS[f]}
    site = _site_without(tmp_path, names)
    code = (f"import {module}, sys\n"
            f"loaded = [n for n in {sorted(names)!r} if n in sys.modules]\n"
            "assert not loaded, loaded\n")
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'client' / 'python'}{os.pathsep}{site}")
    result = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr


def test_the_package_is_typed():
    assert (ROOT / "client" / "python" / "samplerd" / "py.typed").exists()
    assert 'samplerd = ["py.typed"]' in (ROOT / "client" / "python" / "pyproject.toml").read_text()
