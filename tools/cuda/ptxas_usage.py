#!/usr/bin/env python3
"""Registers, spills and shared memory of each kernel of .cu files, as ptxas compiles them.

Compiles each file with the flags of tools/cuda/cuda.bzl (NVCC_FLAGS, read from there: one home
for the determinism flags), for one architecture only (default sm_90, what the bundle runs on
the H200), plus `-Xptxas -v`, and prints one line per kernel: registers per thread, spill stores
and loads (bytes per thread), stack frame, static shared memory (bytes per block), the kernel's
name. Needs nvcc (/usr/local/cuda), no GPU. From the repository root:

    python3 tools/cuda/ptxas_usage.py kernels/cuda/device_weights.cu kernels/cuda/shuffle.cu

--filter=REGEX keeps the kernels whose demangled name matches. What a GPU runs is then measured
by ncu (tools/gpu/check.sh step 4.3: registers, theoretical and achieved occupancy).
"""
import argparse
import ast
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def nvcc_flags():
    """NVCC and NVCC_FLAGS of tools/cuda/cuda.bzl (plain assignments of literals)."""
    with open(os.path.join(ROOT, "tools/cuda/cuda.bzl")) as f:
        module = ast.parse(f.read())
    found = {}
    for node in module.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            name = getattr(node.targets[0], "id", None)
            if name in ("NVCC", "NVCC_FLAGS"):
                found[name] = ast.literal_eval(node.value)
    return found["NVCC"], found["NVCC_FLAGS"]


def usage(nvcc, flags, arch, source):
    """(registers, spill stores, spill loads, stack, shared, name) per kernel of `source`."""
    # One architecture: the -gencode flags of cuda.bzl are replaced by this one.
    flags = [f for f in flags if not f.startswith("-gencode=")]
    flags.append("-gencode=arch=compute_%s,code=sm_%s" % (arch, arch))
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run(
            [nvcc] + flags + ["-Xptxas", "-v", "-I.", "-c", source, "-o",
                              os.path.join(tmp, "k.o")],
            cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit("ptxas_usage: nvcc failed on %s:\n%s" % (source, result.stderr[-4000:]))
    rows, name = [], None
    for line in result.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\S+)' for 'sm_%s'" % arch, line)
        if m:
            name = m.group(1)
            spills = (0, 0, 0)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m and name:
            spills = tuple(int(g) for g in m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            shared = re.search(r"(\d+) bytes smem", line)
            rows.append((int(m.group(1)), spills[1], spills[2], spills[0],
                         int(shared.group(1)) if shared else 0, name))
            name = None
    return rows


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                         text=True).stdout.splitlines()
    # Shorter: the project's namespaces, the return type and the parameter list go.
    short = []
    for n in out:
        n = re.sub(r"samplerd::(gpu::)?(\(anonymous namespace\)::)?", "", n)
        n = re.sub(r"^void ", "", n)
        depth = 0
        for k, ch in enumerate(n):
            depth += (ch == "<") - (ch == ">")
            if ch == "(" and depth == 0:
                n = n[:k]
                break
        short.append(n)
    return short


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sources", nargs="+", help=".cu files, relative to the repository root")
    parser.add_argument("--arch", default="90", help="compute capability (default 90)")
    parser.add_argument("--filter", default="", help="regex on the demangled kernel names")
    args = parser.parse_args()
    nvcc, flags = nvcc_flags()
    print("%4s %6s %6s %6s %7s  %s" % ("regs", "spillS", "spillL", "stack", "smem", "kernel"))
    for source in args.sources:
        rows = usage(nvcc, flags, args.arch, source)
        names = demangle([r[-1] for r in rows])
        print("# %s (sm_%s)" % (source, args.arch))
        for row, name in sorted(zip(rows, names), key=lambda x: x[1]):
            if re.search(args.filter, name):
                print("%4d %6d %6d %6d %7d  %s" % (row[:5] + (name,)))


if __name__ == "__main__":
    main()
