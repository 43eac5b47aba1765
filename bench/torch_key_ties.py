"""How many distinct float32 values torch's exponential keys take (issue 32, Anchors).

bench/torch_anchors.py's shuffle and top-k anchors sort keys
`torch.empty(n).exponential_() / w` (w = torch.rand(n) + 0.5). Keys that tie are ordered by the
sort (on the GPU a radix sort: stable, by index), not at random, so the fewer distinct keys, the
further the anchor's permutation is from uniform. Prints three sets of figures:

1. torch on this machine's CPU (the frameworks venv's torch 2.x, fixed seed): distinct values
   of torch.rand(n), of exponential_() and of the anchor's keys at each N of --sizes. The CPU's
   float32 uniform has 24 random bits (its distinct count matches 2^24 equally likely values);
   its exponential_() is computed from a double uniform, so it does not show what the GPU does.
2. (--enumerate) torch on CUDA, exactly, without a GPU: exponential_() of float32 there is -logf(u) of
   u = curand_uniform (x * 2^-32 + 2^-32/2 in float for a 32-bit x, CUDA's curand_uniform.h;
   u >= 1 - eps/2 gives eps/2: ATen's TransformationHelper.h). All 2^32 values of x are
   enumerated (u is monotone in x): the distinct u, the distinct keys, each key's probability,
   and from those the expected number of distinct keys among N draws (numpy's float32 log
   stands in for CUDA's logf; both are within an ulp or so, which moves these counts little).
3. the anchor's keys e / w on CUDA, simulated here with the same formulas for e and w
   (w = curand_uniform + 0.5 in float) from numpy's Philox, at each N of --sizes.
4. the floor of any float32 key: an exact Exp(1) variable (and Exp(1) / U[0.5, 1.5), the
   anchor's keys) rounded once to float32, the expected distinct values among N draws from its
   density (each float32 value's probability is the density times its spacing).

  python3 bench/torch_key_ties.py [--sizes=10000000] [--enumerate]

Seconds at 1e7; --enumerate takes 1-5 minutes more (2^32 draws, 2 cores), --sizes=100000000
a few minutes and ~6 GB of memory. Figures and conclusion: bench/RESULTS.md, next to torch's.
"""
import argparse
import math
import time

import numpy as np
import torch

TWO32 = 2.0**32
SEED = 20261129


def distinct(t):
    return int(torch.unique(t).numel())


def torch_cpu(n):
    torch.manual_seed(SEED)
    w = torch.rand(n) + 0.5  # bench/torch_anchors.py's weights and keys, in its order.
    e = torch.empty(n).exponential_()
    keys = e / w
    u = torch.rand(n)
    expected_24bit = 2**24 * -math.expm1(-n / 2**24)
    print(f"cpu torch {torch.__version__} N={n}: rand {distinct(u)} distinct "
          f"(24-bit uniform: {expected_24bit:.0f} expected), exponential_ {distinct(e)}, "
          f"keys e/w {distinct(keys)}", flush=True)


def curand_uniform(x):
    """curand_uniform of 32-bit integers: x * 2^-32 + 2^-33 in float (the product is exact,
    so a fused multiply-add and a multiply then an add round the same)."""
    return x.astype(np.float32) * np.float32(2.0**-32) + np.float32(2.0**-33)


def cuda_exponential(u):
    """ATen's transformation::exponential on CUDA, lambda = 1: -log(u), eps/2 near 1."""
    eps = np.finfo(np.float32).eps
    with np.errstate(divide="ignore"):
        log = np.where(u >= np.float32(1.0) - eps / 2, -eps / 2, np.log(u)).astype(np.float32)
    return (np.float32(-1.0) * log).astype(np.float32)


class Runs:
    """Distinct values of a monotone stream, each with its count, taken chunk by chunk."""

    def __init__(self, sizes):
        self.sizes = sizes
        self.distinct = 0
        self.expected = [0.0] * len(sizes)  # Expected distinct values among N draws.
        self.largest = 0
        self.last_value, self.last_count = None, 0

    def _finish(self, counts):
        if len(counts) == 0:
            return
        self.distinct += len(counts)
        self.largest = max(self.largest, int(counts.max()))
        p = counts.astype(np.float64) / TWO32
        for k, n in enumerate(self.sizes):
            self.expected[k] += float(-np.expm1(n * np.log1p(-p)).sum())

    def add(self, values):
        starts = np.flatnonzero(values[1:] != values[:-1]) + 1
        bounds = np.concatenate(([0], starts, [len(values)]))
        run_values = values[bounds[:-1]]
        counts = np.diff(bounds).astype(np.int64)
        if self.last_value is not None:
            if run_values[0] == self.last_value:
                counts[0] += self.last_count
            else:
                self._finish(np.array([self.last_count]))
        self._finish(counts[:-1])
        self.last_value, self.last_count = run_values[-1], int(counts[-1])

    def close(self):
        if self.last_value is not None:
            self._finish(np.array([self.last_count]))
            self.last_value = None


def cuda_enumeration(sizes):
    t0 = time.time()
    uniforms, keys = Runs(sizes), Runs(sizes)
    chunk = 1 << 24
    for start in range(0, 1 << 32, chunk):
        x = np.arange(start, start + chunk, dtype=np.uint64).astype(np.uint32)
        u = curand_uniform(x)
        uniforms.add(u)
        keys.add(cuda_exponential(u))  # Monotone too (decreasing in u).
    uniforms.close()
    keys.close()
    print(f"cuda (exact, all 2^32 draws of curand): curand_uniform takes {uniforms.distinct} "
          f"distinct float32 values, exponential_ {keys.distinct} (most likely key: "
          f"{keys.largest} of 2^32; enumerated in {time.time() - t0:.0f} s)", flush=True)
    for n, expected in zip(sizes, keys.expected):
        print(f"cuda exponential_ N={n}: {expected:.4g} distinct keys expected, "
              f"{n / expected:.3g} draws per key", flush=True)


def cuda_anchor_keys(n):
    rng = np.random.Generator(np.random.Philox(SEED))
    w = curand_uniform(rng.integers(0, 1 << 32, n, dtype=np.uint32)) + np.float32(0.5)
    e = cuda_exponential(curand_uniform(rng.integers(0, 1 << 32, n, dtype=np.uint32)))
    keys = (e / w).astype(np.float32)
    print(f"cuda (simulated) N={n}: exponential_ {len(np.unique(e))} distinct, keys e/w "
          f"{len(np.unique(keys))} distinct ({n / len(np.unique(keys)):.3g} per key)", flush=True)


def rounded_float32_expected(density, n):
    """Expected distinct float32 values among n draws of a variable of this density on
    (0, inf), rounded to float32 once: the integral of (1 - exp(-n f(k) ulp(k))) / ulp(k)."""
    total = 0.0
    for b in range(-60, 8):  # Binades [2^b, 2^(b+1)): the density beyond 2^8 is negligible.
        ulp = 2.0 ** (b - 23)
        k = np.linspace(2.0**b, 2.0 ** (b + 1), 4097)
        total += np.trapezoid(-np.expm1(-n * density(k) * ulp) / ulp, k)
    return total


def exponential_density(k):
    return np.exp(-k)


def anchor_key_density(k):
    """Density of E / W, E ~ Exp(1), W ~ U[0.5, 1.5): the integral of w exp(-k w) dw."""
    k = np.asarray(k, dtype=np.float64)
    small = k < 1e-4
    ks = np.where(small, 1.0, k)
    exact = (np.exp(-0.5 * ks) * (0.5 * ks + 1) - np.exp(-1.5 * ks) * (1.5 * ks + 1)) / ks**2
    return np.where(small, 1.0 - k * (1.5**3 - 0.5**3) / 3, exact)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000000")
    parser.add_argument("--enumerate", action="store_true",
                        help="all 2^32 draws of CUDA's exponential_ (1-5 minutes)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    for n in sizes:
        torch_cpu(n)
    if args.enumerate:
        cuda_enumeration(sorted(set(sizes + [10**7, 10**8, 10**9])))
    for n in sizes:
        cuda_anchor_keys(n)
    for n in sorted(set(sizes + [10**9])):
        e = rounded_float32_expected(exponential_density, n)
        k = rounded_float32_expected(anchor_key_density, n)
        print(f"exact keys rounded to float32, N={n}: Exp(1) {e:.4g} distinct expected "
              f"({n / e:.3g} per value), Exp(1)/U[0.5,1.5) {k:.4g} ({n / k:.3g} per value)",
              flush=True)


if __name__ == "__main__":
    main()
