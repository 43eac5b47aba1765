"""Torch anchors (docs/CONTRIBUTING.md, GPU code), measured in the same run as bench/gpu_benchmark.cu (run_on_gpu.sh).

Prints "RESULT torch_<operation> <N> <M> <median ms> <items/s> 0 0" lines in the benchmark's
format (no bandwidth column: torch's bytes are not ours to count). A size that fails (memory,
torch's own limits such as multinomial's 2^24 categories) prints "SKIP ..." with the reason.
"""
import sys

import torch


def median_ms(fn, reps):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def report(op, n, m, ms):
    print(f"RESULT torch_{op} {n} {m} {ms:.3f} {m / (ms * 1e-3):.4g} 0 0", flush=True)


def run(n, reps):
    w = torch.rand(n, device="cuda") + 0.5

    def exp_sort():
        keys = torch.empty(n, device="cuda").exponential_() / w
        return torch.sort(keys).indices

    def exp_topk():
        keys = torch.empty(n, device="cuda").exponential_() / w
        return torch.topk(keys, n // 10, largest=False).indices

    def cumsum_searchsorted():
        cdf = torch.cumsum(w.double(), 0)
        u = torch.rand(n, device="cuda", dtype=torch.float64) * cdf[-1]
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
            report(op, n, m, median_ms(fn, reps))
        except (RuntimeError, torch.cuda.OutOfMemoryError) as e:  # noqa: PERF203
            print(f"SKIP torch_{op} {n}: {str(e).splitlines()[0][:120]}", flush=True)
        torch.cuda.empty_cache()


def main():
    sizes = [10_000_000, 100_000_000, 1_000_000_000]
    for arg in sys.argv[1:]:
        if arg.startswith("--sizes="):
            sizes = [int(s) for s in arg[len("--sizes="):].split(",")]
    print(f"DEVICE {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    for n in sizes:
        run(n, 5 if n >= 1_000_000_000 else 10)


if __name__ == "__main__":
    main()
