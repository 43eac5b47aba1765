"""samplerd_fuzzer: a libFuzzer target and the test that replays its checked-in corpus.

A fuzz target is one .cc file defining LLVMFuzzerTestOneInput, next to the code it fuzzes
(docs/HARDENING.md). samplerd_fuzzer(name = "x_fuzzer", ...) makes:
  - x_fuzzer: with --config=fuzz (clang, libFuzzer, ASan + UBSan) the fuzzer itself (run it with
    tools/fuzz/run.sh); in any other build the same code linked with
    //fuzz:standalone_main, which runs the inputs given on its command line once each.
  - x_fuzzer_corpus_test: runs x_fuzzer over every input in its corpus directory (`corpus_dir`,
    relative to the package; default fuzz_corpus/x_fuzzer, beside the source file): the seeds and
    every input a fuzzer ever crashed on, so that the normal test suite (and --config=asan)
    replays them.
"""

def samplerd_fuzzer(name, srcs, deps = [], corpus_dir = None, visibility = None):
    native.cc_binary(
        name = name,
        testonly = True,
        srcs = srcs,
        deps = deps + select({
            "//tools/sanitizers:fuzz": [],
            "//conditions:default": ["//fuzz:standalone_main"],
        }),
        linkopts = select({
            "//tools/sanitizers:fuzz": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        visibility = visibility,
    )
    corpus_dir = corpus_dir or ("fuzz_corpus/" + name)
    native.sh_test(
        name = name + "_corpus_test",
        size = "small",
        srcs = ["//fuzz:replay_corpus.sh"],
        args = [
            "$(location :%s)" % name,
            native.package_name() + "/" + corpus_dir,
        ],
        data = [":" + name] + native.glob([corpus_dir + "/*"]),
    )
