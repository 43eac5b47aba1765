"""The text-mixture benchmark's domains (bench/text_mixture_benchmark.py): real text that is on
a Debian machine, plus one unlearnable domain of random bytes. Nothing is downloaded.

  c_headers   C headers, /usr/include/**/*.h (libc6-dev, linux-libc-dev, ...)
  python      the Python standard library's source, /usr/lib/python3.*/**/*.py (no tests, no
              site- or dist-packages)
  changelogs  Debian changelogs, /usr/share/doc/*/changelog.Debian.gz
  licenses    license texts, /usr/share/common-licenses/* and /usr/share/doc/*/copyright:
              English legal prose
  man         manual pages, /usr/share/man/man[1-8]/*.gz (troff source)
  random      uniformly random bytes (numpy's PCG64, seed RANDOM_SEED): unlearnable, its best
              possible loss is ln 256 = 5.545 nats per byte
Their sizes are one of CAP_SETS (the benchmark's --caps): the largest domain 14x the smallest.

Each text domain reads its files in a fixed order (sorted by the SHA-1 of the path, so a cap
takes a spread of packages, not the first directory), decompresses the .gz ones, and keeps the
first `cap` bytes. The text is cut into blocks of BLOCK bytes; every HOLDOUT_EVERY-th block is
held out (never trained on), the others are cut into training chunks of CHUNK bytes. The
held-out evaluation set is up to EVAL_CHUNKS chunks spread evenly over the held-out blocks.

A domain whose files are missing (another distribution, a slim image) is skipped with a clear
message by `available`; on a Debian machine all five are there by default (tools/install_deps.sh
installs the headers and the man pages).
"""

import glob
import gzip
import hashlib
import os
from typing import Dict, List, NamedTuple

import numpy as np

CHUNK = 64             # Bytes per sample: the model predicts bytes 1..63 from their prefix.
BLOCK = 4096           # Bytes per split block.
HOLDOUT_EVERY = 8      # Every 8th block is held out.
EVAL_CHUNKS = 96       # Held-out chunks per domain in each evaluation.
RANDOM_SEED = 20231129
# The domains in the job's group order, with their byte caps: two sets of domain sizes, the
# largest 14x the smallest. headers_large: the C headers largest (the domain this model finds
# hardest at that size: xz compresses headers best, but by long-range repeats that a 31-byte
# context cannot see); python_large: the Python standard library largest, the C headers
# smallest (100 KB of a few files: then the easiest, the manual pages the hardest).
CAP_SETS = {
    "headers_large": {"c_headers": 1_400_000, "python": 500_000, "changelogs": 300_000,
                      "licenses": 200_000, "man": 100_000, "random": 200_000},
    "python_large": {"python": 1_400_000, "changelogs": 500_000, "licenses": 300_000,
                     "man": 200_000, "c_headers": 100_000, "random": 200_000},
}
CAPS = CAP_SETS["headers_large"]
DOMAINS = tuple(CAPS)
LEARNABLE = tuple(d for d in DOMAINS if d != "random")
MIN_BYTES = 8 * BLOCK  # A domain with less text than this is skipped.


def _python_sources():
    paths = []
    for root in glob.glob("/usr/lib/python3.[0-9]*"):
        for p in glob.glob(os.path.join(root, "**", "*.py"), recursive=True):
            rel = os.path.relpath(p, root)
            parts = rel.split(os.sep)
            if any(x in ("test", "tests", "idle_test", "site-packages", "dist-packages")
                   for x in parts):
                continue
            paths.append(p)
    return paths


def _sources(domain):
    """(paths, gzipped) of a text domain."""
    if domain == "c_headers":
        return glob.glob("/usr/include/**/*.h", recursive=True), False
    if domain == "python":
        return _python_sources(), False
    if domain == "changelogs":
        return glob.glob("/usr/share/doc/*/changelog.Debian.gz"), True
    if domain == "licenses":
        return (glob.glob("/usr/share/common-licenses/*")
                + glob.glob("/usr/share/doc/*/copyright")), False
    if domain == "man":
        return glob.glob("/usr/share/man/man[1-8]/*.gz"), True
    raise ValueError(f"unknown domain {domain!r}; the domains are {', '.join(DOMAINS)}")


def domain_text(domain, cap):
    """The first `cap` bytes of the domain, read in its fixed order."""
    if domain == "random":
        return np.random.Generator(np.random.PCG64(RANDOM_SEED)).integers(
            0, 256, cap, dtype=np.uint8).tobytes()
    paths, gz = _sources(domain)
    paths = sorted(set(p for p in paths if os.path.isfile(p)),
                   key=lambda p: hashlib.sha1(p.encode()).hexdigest())
    out = bytearray()
    for p in paths:
        try:
            with (gzip.open(p) if gz else open(p, "rb")) as f:
                out += f.read(cap - len(out))
        except (OSError, EOFError):  # An unreadable or truncated file: the next one.
            continue
        if len(out) >= cap:
            break
    return bytes(out)


def available(domain):
    """None if the domain has at least MIN_BYTES of text here, else why not."""
    if domain == "random":
        return None
    paths, _ = _sources(domain)
    if not paths:
        return (f"domain {domain}: no files here (see bench/text_mixture_data.py for where it "
                f"reads; tools/install_deps.sh installs them on Debian)")
    n = len(domain_text(domain, MIN_BYTES))
    if n < MIN_BYTES:
        return f"domain {domain}: only {n} bytes here, fewer than {MIN_BYTES}"
    return None


class Domain(NamedTuple):
    name: str
    train: np.ndarray   # uint8 [n, CHUNK]: the training chunks (the job's group, in order)
    held: np.ndarray    # uint8 [<= EVAL_CHUNKS, CHUNK]: the held-out evaluation chunks
    text_bytes: int     # bytes read (train + held-out blocks)


def split(name, text):
    """Cuts a domain's text into training chunks and held-out evaluation chunks."""
    nblocks = len(text) // BLOCK
    blocks = np.frombuffer(text[:nblocks * BLOCK], dtype=np.uint8).reshape(nblocks, BLOCK)
    held_mask = (np.arange(nblocks) % HOLDOUT_EVERY) == HOLDOUT_EVERY - 1
    train = blocks[~held_mask].reshape(-1, CHUNK)
    held = blocks[held_mask].reshape(-1, CHUNK)
    if len(held) > EVAL_CHUNKS:
        held = held[np.linspace(0, len(held) - 1, EVAL_CHUNKS).round().astype(int)]
    return Domain(name, np.ascontiguousarray(train), np.ascontiguousarray(held),
                  nblocks * BLOCK)


def load(caps=CAPS, scale=1.0):
    """The domains of `caps` ({name: bytes}, in the job's group order) that are available here;
    prints why each missing one is skipped. `scale` multiplies every cap (the smoke test uses a
    small one)."""
    out: List[Domain] = []
    for d, cap in caps.items():
        why = available(d)
        if why:
            print(f"text_mixture: skipping {why}", flush=True)
            continue
        out.append(split(d, domain_text(d, max(MIN_BYTES, int(cap * scale)))))
    return out


def describe(domains: List[Domain]) -> Dict[str, Dict[str, int]]:
    return {d.name: {"train_chunks": len(d.train), "held_chunks": len(d.held),
                     "bytes": d.text_bytes} for d in domains}
