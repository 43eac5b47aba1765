"""Torch anchors (docs/CONTRIBUTING.md, GPU code), measured in the same run as bench/gpu_benchmark.cu
(tools/gpu/check.sh).

Prints "RESULT torch_<operation> <N> <M> <median ms> <items/s> 0 0" lines in the benchmark's
format (no bandwidth column: torch's bytes are not ours to count). A size that fails (memory,
torch's own limits such as multinomial's 2^24 categories) prints "SKIP ..." with the reason.

  python3 bench/torch_anchors.py [--sizes=10000000,100000000,1000000000] [--device=cuda]

--device=cpu times the same operations on the CPU (wall clock): check.sh's rehearsal on a
machine without a GPU, to run the table's plumbing; its figures are no anchor.

The exponential-key anchors are not uniform permutations: float32 keys tie (at N = 1e9 ~12 draws
per distinct key even after the division by w, ~29 for CUDA's exponential_ alone) and the sort
keeps index order within a tie (bench/torch_key_ties.py; bench/RESULTS.md, next to the figures).
"""
import sys
import time

import torch


def median_ms(fn, reps, device):
    fn()
    times = []
    if device != "cuda":
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - start))
    else:
        torch.cuda.synchronize()
        for _ in range(reps):
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def report(op, n, m, ms):
    print(f"RESULT torch_{op} {n} {m} {ms:.3f} {m / (ms * 1e-3):.4g} 0 0", flush=True)


def run(n, reps, device):
    w = torch.rand(n, device=device) + 0.5

    def exp_sort():
        keys = torch.empty(n, device=device).exponential_() / w
        return torch.sort(keys).indices

    def exp_topk():
        keys = torch.empty(n, device=device).exponential_() / w
        return torch.topk(keys, n // 10, largest=False).indices

    def cumsum_searchsorted():
        cdf = torch.cumsum(w.double(), 0)
        u = torch.rand(n, device=device, dtype=torch.float64) * cdf[-1]
        return torch.searchsorted(cdf, u)

    def multinomial(replacement):
        return lambda: torch.multinomial(w, n, replacement=replacement)

    for op, m, fn in [
        ("exp_keys_sort_M=N", n, exp_sort),
        ("exp_keys_topk_M=N/10", n // 10, exp_topk),
        ("cumsum_searchsorted_M=N", n, cumsum_searchsorted),
        ("multinomial_replacement_M=N", n, multinomial(True)),
        ("multinomial_no_replacement_M=N", n, multinomial(False)),
    ]:
        try:
            report(op, n, m, median_ms(fn, reps, device))
        except (RuntimeError, torch.cuda.OutOfMemoryError) as e:  # noqa: PERF203
            print(f"SKIP torch_{op} {n}: {str(e).splitlines()[0][:120]}", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()


def main():
    sizes = [10_000_000, 100_000_000, 1_000_000_000]
    device = "cuda"
    for arg in sys.argv[1:]:
        if arg.startswith("--sizes="):
            sizes = [int(float(s)) for s in arg[len("--sizes="):].split(",")]
        elif arg.startswith("--device="):
            device = arg[len("--device="):]
        else:
            sys.exit(f"torch_anchors.py: unknown argument {arg!r} (--sizes=N,N --device=cuda|cpu)")
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (no anchor: a rehearsal)"
    print(f"DEVICE {name} torch {torch.__version__}", flush=True)
    for n in sizes:
        run(n, 5 if n >= 1_000_000_000 else 10, device)


if __name__ == "__main__":
    main()
