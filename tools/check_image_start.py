#!/usr/bin/env python3
"""Reproduces the container image's start without a container runtime, and checks it serves.

CI has no Docker daemon, so this runs the built binary the way deploy/docker/Dockerfile starts
it, with everything read from the Dockerfile itself (so the check cannot drift from the image):

  * the final stage's USER (numeric uid:gid) becomes the process's uid/gid and the only group
    (`setpriv --reuid --regid --clear-groups`, as the container runtime does; run this as root);
  * a temporary root directory gets the image's layout: the binary at the ENTRYPOINT's path,
    every directory that a `RUN install -d -o U -g G -m M DIR` line makes, with that owner and
    mode, and every other directory root-owned 0755 as in the base image;
  * the flags are the ENTRYPOINT's and the CMD's, with absolute paths moved under the temporary
    root and --port=0 (a free port, read from the startup line) instead of the fixed one.

It then asserts that the server starts, created its jobs directory in the state directory,
answers the gRPC health check SERVING for "" and for the service the Kubernetes probes ask
about, that the uid really cannot write outside the state directory (so the start did not pass
merely because the check ran as root), and that SIGTERM stops it with exit code 0.

--plaintext: servers that require it without TLS list it in --help; for an older binary that
does not know the flag (it rejects unknown flags) it is dropped, and a line says so.

Usage: tools/check_image_start.py --binary bazel-bin/server/samplerd
         [--dockerfile deploy/docker/Dockerfile] [--timeout 60]
Exit status 0 when every assertion holds, 1 with "check_image_start: FAIL: ..." otherwise.
"""

import argparse
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

ROOT = pathlib.Path(__file__).resolve().parents[1]
LISTENING = "samplerd listening on "
# The names the Kubernetes probes (deploy/k8s) and `grpc_health_probe` ask about.
HEALTH_SERVICES = ("", "samplerd.v1.Sampler")


class CheckFailed(Exception):
    pass


def final_stage(dockerfile: pathlib.Path):
    """Returns the final build stage's instructions as (KEYWORD, argument text) pairs.

    Joins backslash continuations and drops comments; Dockerfile syntax beyond that (heredocs,
    parser directives other than comments) is not used by our Dockerfile.
    """
    logical, pending = [], ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # A comment inside a continued instruction.
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages, current = [], None
    for text in logical:
        keyword, _, argument = text.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            current = []
            stages.append(current)
        elif current is None:
            raise CheckFailed(f"{dockerfile}: '{keyword}' before the first FROM")
        else:
            current.append((keyword, argument.strip()))
    if not stages:
        raise CheckFailed(f"{dockerfile}: no FROM")
    return stages[-1]


def exec_form(keyword: str, argument: str):
    """ENTRYPOINT/CMD must be in JSON exec form: a shell form would run /bin/sh as PID 1,
    which does not forward SIGTERM to samplerd (no graceful drain on pod deletion)."""
    try:
        value = json.loads(argument)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckFailed(f"{keyword} must be a JSON array of strings (exec form), got "
                          f"{argument!r}")
    return value


def image_spec(dockerfile: pathlib.Path):
    """What the image's start depends on: user, directories made, volumes, argv."""
    user, dirs, volumes, entrypoint, cmd = None, {}, [], None, []
    for keyword, argument in final_stage(dockerfile):
        if keyword == "USER":
            match = re.fullmatch(r"(\d+)(?::(\d+))?", argument)
            if not match:
                # Kubernetes' runAsNonRoot can only verify a numeric USER.
                raise CheckFailed(f"USER must be numeric uid[:gid], got {argument!r}")
            uid = int(match.group(1))
            user = (uid, int(match.group(2)) if match.group(2) else uid)
        elif keyword == "RUN":
            for command in re.split(r"&&|;", argument):
                words = shlex.split(command)
                if words[:1] != ["install"] or "-d" not in words:
                    continue
                parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
                parser.add_argument("-d", action="store_true")
                parser.add_argument("-o", default="0")
                parser.add_argument("-g", default="0")
                parser.add_argument("-m", default="0755")
                parser.add_argument("paths", nargs="+")
                try:
                    parsed = parser.parse_args(words[1:])
                    owner = (int(parsed.o), int(parsed.g), int(parsed.m, 8))
                except (argparse.ArgumentError, ValueError):
                    raise CheckFailed(f"cannot read the directory line {command.strip()!r}: "
                                      "use numeric -o UID -g GID -m MODE")
                for path in parsed.paths:
                    dirs[path] = owner
        elif keyword == "VOLUME":
            volumes += (json.loads(argument) if argument.startswith("[")
                        else argument.split())
        elif keyword == "ENTRYPOINT":
            entrypoint = exec_form(keyword, argument)
        elif keyword == "CMD":
            cmd = exec_form(keyword, argument)
    if user is None:
        raise CheckFailed("the final stage has no USER: the image would run as root")
    if user[0] == 0:
        raise CheckFailed("the final stage's USER is root")
    if not entrypoint:
        raise CheckFailed("the final stage has no ENTRYPOINT")
    return user, dirs, volumes, entrypoint, cmd


def flag_value(argv, name):
    value = None
    for arg in argv:
        if arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]  # The last one wins, as for the server's flags.
    return value


def under(root: pathlib.Path, path: str) -> pathlib.Path:
    return root / path.lstrip("/")


def make_layout(root: pathlib.Path, binary: str, image_binary: str, dirs, data_dir: str):
    root.chmod(0o755)
    # The base image has the state directory's parents (/var/lib), root-owned.
    under(root, data_dir).parent.mkdir(parents=True, exist_ok=True)
    target = under(root, image_binary)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(binary, target)  # A copy: the build tree may be unreadable to the image's uid.
    target.chmod(0o755)
    for path, (uid, gid, mode) in dirs.items():
        directory = under(root, path)
        directory.parent.mkdir(parents=True, exist_ok=True)
        directory.mkdir(exist_ok=True)
        os.chown(directory, uid, gid)
        directory.chmod(mode)
    for directory in root.rglob("*"):  # Parents made above: root-owned 0755, as in the base.
        if directory.is_dir() and directory.as_posix() not in {
                under(root, p).as_posix() for p in dirs}:
            directory.chmod(0o755)


def server_knows_flag(binary: str, name: str) -> bool:
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
    return f"--{name} " in out.stdout + out.stderr or f"--{name}=" in out.stdout + out.stderr


def as_user(user):
    uid, gid = user
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]


def health_statuses(address: str):
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        statuses = {}
        for service in HEALTH_SERVICES:
            try:
                response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
                statuses[service] = health_pb2.HealthCheckResponse.ServingStatus.Name(
                    response.status)
            except grpc.RpcError as error:
                statuses[service] = error.code().name
        return statuses


def check(dockerfile: pathlib.Path, binary: str, timeout: float):
    if os.geteuid() != 0:
        raise CheckFailed("run as root: setpriv must switch to the image's uid")
    user, dirs, volumes, entrypoint, cmd = image_spec(dockerfile)
    argv = entrypoint[1:] + cmd
    data_dir = flag_value(argv, "data_dir")
    if not data_dir:
        raise CheckFailed("the ENTRYPOINT/CMD set no --data_dir: jobs would not survive a restart")
    if data_dir not in volumes:
        raise CheckFailed(f"--data_dir={data_dir} is not a VOLUME: its state would live in the "
                          f"container's writable layer (VOLUMEs: {volumes})")
    if "--plaintext" in argv and not server_knows_flag(binary, "plaintext"):
        print("check_image_start: this binary has no --plaintext flag (an older build); "
              "starting it without")
        argv = [a for a in argv if a != "--plaintext"]

    with tempfile.TemporaryDirectory(prefix="image-root-") as tmp:
        root = pathlib.Path(tmp)
        make_layout(root, binary, entrypoint[0], dirs, data_dir)
        flags = []
        for arg in argv:
            name, eq, value = arg.partition("=")
            if name == "--port":
                value = "0"
            elif eq and value.startswith("/"):
                value = under(root, value).as_posix()
            flags.append(f"{name}{eq}{value}")
        command = as_user(user) + [under(root, entrypoint[0]).as_posix()] + flags
        print("check_image_start: running", shlex.join(command))
        with tempfile.TemporaryFile("w+") as stderr:
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                    env={"PATH": "/usr/bin:/bin"})
            timer = threading.Timer(timeout, proc.kill)
            timer.start()
            try:
                line = proc.stdout.readline()
                if not line.startswith(LISTENING):
                    proc.kill()
                    proc.wait()
                    stderr.seek(0)
                    raise CheckFailed(f"the server did not start (exit code {proc.returncode})"
                                      f"; its stderr:\n{stderr.read()}")
                address = line[len(LISTENING):].strip()
                port = address.rsplit(":", 1)[1]
                state = under(root, data_dir)
                jobs = state / "jobs"
                if not jobs.is_dir() or jobs.stat().st_uid != user[0]:
                    raise CheckFailed(f"{jobs} is missing or not owned by uid {user[0]}")
                statuses = health_statuses(f"127.0.0.1:{port}")
                if any(status != "SERVING" for status in statuses.values()):
                    raise CheckFailed(f"health is not SERVING: {statuses}")
                # The uid must not be able to write outside the state directory: otherwise
                # the start above proves nothing about the directory's owner.
                for elsewhere in (state.parent, under(root, entrypoint[0]).parent):
                    probe = elsewhere / "write-probe"
                    denied = subprocess.run(as_user(user) + ["touch", probe.as_posix()],
                                            capture_output=True, text=True)
                    if denied.returncode == 0:
                        raise CheckFailed(f"uid {user[0]} could write {probe}: the check does "
                                          "not run as the image's user")
                proc.send_signal(signal.SIGTERM)
                if proc.wait() != 0:
                    stderr.seek(0)
                    raise CheckFailed(f"SIGTERM: exit code {proc.returncode}, not 0; stderr:\n"
                                      f"{stderr.read()}")
                if not timer.is_alive():
                    raise CheckFailed(f"the server took longer than {timeout} s")
            finally:
                timer.cancel()
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    print(f"check_image_start: OK: uid {user[0]} started {entrypoint[0]} with {shlex.join(argv)}"
          f"; {data_dir}/jobs created; health {statuses}; no write access outside {data_dir}; "
          "SIGTERM exit 0")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True, help="the built samplerd")
    parser.add_argument("--dockerfile", default=str(ROOT / "deploy" / "docker" / "Dockerfile"))
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds the whole start-serve-stop may take")
    args = parser.parse_args()
    try:
        check(pathlib.Path(args.dockerfile), args.binary, args.timeout)
    except CheckFailed as failure:
        print(f"check_image_start: FAIL: {failure}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
