"""The container image (deploy/docker/Dockerfile) without a container runtime.

tools/check_image_start.py starts the real binary as the image's user with the image's layout
and flags, all read from the Dockerfile; these tests run it on the Dockerfile as it is and on
copies with the state directory's ownership broken the ways the image once had it (the check
must then fail the way the image did: "cannot create .../jobs: Permission denied").
"""

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, samplerd_binary

DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
CHECK = ROOT / "tools" / "check_image_start.py"
sys.path.insert(0, str(ROOT / "tools"))
import check_image_start  # noqa: E402  (the Dockerfile parser is the check's own)

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="switching to the image's uid needs root (CI runs as root)")


def run_check(dockerfile: pathlib.Path):
    return subprocess.run([sys.executable, str(CHECK), "--binary", samplerd_binary(),
                           "--dockerfile", str(dockerfile)],
                          capture_output=True, text=True, timeout=120)


def test_image_starts_as_its_user_and_serves():
    result = run_check(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "check_image_start: OK: uid 65534" in result.stdout
    assert "/var/lib/samplerd/jobs created" in result.stdout


def broken_dockerfile(tmp_path, pattern, replacement):
    text = DOCKERFILE.read_text()
    broken, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
    assert count == 1, f"{pattern!r} no longer matches the Dockerfile once"
    path = tmp_path / "Dockerfile"
    path.write_text(broken)
    return path


@pytest.mark.parametrize("pattern,replacement", [
    # The image as it was: nothing makes the state directory.
    (r"^RUN install -d .*/var/lib/samplerd\n", ""),
    # The directory made, but left to root.
    (r"-o 65534 -g 65534", "-o 0 -g 0"),
])
def test_check_fails_when_the_user_does_not_own_the_state_directory(tmp_path, pattern,
                                                                     replacement):
    result = run_check(broken_dockerfile(tmp_path, pattern, replacement))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the server did not start" in result.stderr
    assert re.search(r"cannot create \S*/var/lib/samplerd/jobs: Permission denied",
                     result.stderr), result.stderr


def test_check_refuses_a_root_user_and_shell_form_entrypoint(tmp_path):
    result = run_check(broken_dockerfile(tmp_path, r"^USER 65534:65534$", "USER 0"))
    assert result.returncode == 1 and "USER is root" in result.stderr, result.stderr
    result = run_check(broken_dockerfile(tmp_path, r"^ENTRYPOINT \[.*\]$",
                                         "ENTRYPOINT /usr/local/bin/samplerd --port=50051"))
    assert result.returncode == 1 and "exec form" in result.stderr, result.stderr


def runtime_packages():
    """The packages the final stage's `apt-get install` names."""
    for keyword, argument in check_image_start.final_stage(DOCKERFILE):
        for command in argument.split("&&") if keyword == "RUN" else []:
            words = shlex.split(command)
            if "apt-get" in words and "install" in words:
                rest = words[words.index("install") + 1:]
                return [w for w in rest if not w.startswith("-")]
    pytest.fail("the Dockerfile's final stage installs no packages")


def packages_of(libraries):
    """{library: owning Debian package}, from one dpkg-query call (one per file is slow)."""
    # Debian 12 merged /lib into /usr/lib; dpkg knows each file under one of the two names.
    names = {}
    for library in libraries:
        real = os.path.realpath(library)
        for path in {real, re.sub(r"^/usr/lib/", "/lib/", real),
                     re.sub(r"^/lib/", "/usr/lib/", real)}:
            names[path] = library
    found = subprocess.run(["dpkg-query", "-S", *names], capture_output=True, text=True)
    owners = {}
    for line in found.stdout.splitlines():  # "libc6:amd64: /lib/x86_64-linux-gnu/libc.so.6"
        package, path = line.rsplit(": ", 1)
        if path in names:
            owners[names[path]] = package.split(":")[0].split(", ")[0]
    unowned = set(libraries) - set(owners)
    assert not unowned, f"no Debian package owns {unowned}"
    return owners


def test_runtime_packages_exist_and_cover_every_library_the_binary_links():
    packages = runtime_packages()
    closure = subprocess.run(
        ["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
         "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", *packages],
        capture_output=True, text=True, timeout=60)
    assert closure.returncode == 0, (
        f"apt-cache does not know one of {packages} (Debian 12 names; after apt-get update): "
        f"{closure.stderr}")
    installed = {line for line in closure.stdout.splitlines() if not line.startswith(" ")}
    # debian:12-slim's own packages (Priority: required) need no install line.
    required = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Priority}\n"],
                              capture_output=True, text=True).stdout
    installed |= {line.split()[0] for line in required.splitlines()
                  if line.endswith(" required")}
    ldd = subprocess.run(["ldd", samplerd_binary()], capture_output=True, text=True, check=True)
    libraries = re.findall(r"=> (/\S+)", ldd.stdout)
    missing = {lib: pkg for lib, pkg in packages_of(libraries).items() if pkg not in installed}
    assert not missing, f"the image lacks the packages of {missing}: add them to its apt-get line"
