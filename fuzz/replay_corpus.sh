#!/usr/bin/env bash
# replay_corpus.sh FUZZER CORPUS_DIR: runs a fuzz target once over every input of its checked-in
# corpus (fuzz/fuzz.bzl's x_fuzzer_corpus_test). -runs=0: libFuzzer (under --config=fuzz)
# then only executes the corpus; the standalone main ignores flags.
set -euo pipefail
fuzzer="$1"
corpus="$2"
if [[ ! -d "$corpus" ]] || [[ -z "$(ls -A "$corpus")" ]]; then
  echo "replay_corpus: no corpus at $corpus" >&2
  exit 1
fi
exec "$fuzzer" -runs=0 "$corpus"
