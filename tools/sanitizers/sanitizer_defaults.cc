// The sanitizer runtimes' default options and suppressions for samplerd's binaries, linked into
// every binary built with --config=asan, --config=tsan or --config=fuzz (tools/sanitizers/BUILD,
// through //third_party:absl). The runtimes call these functions at start-up; an environment
// variable (ASAN_OPTIONS, TSAN_OPTIONS, ...) set by a developer still overrides an option.
//
// Suppressions: only for third-party code, each one with the reason it is there
// (docs/HARDENING.md). A report in samplerd's own code is fixed, never suppressed.

extern "C" {

// Abort on the first report with a stack trace; a test that hits one fails.
// allocator_may_return_null=1: an allocation beyond ASan's limit (2^40 bytes) fails as the C++
// library's does, with nullptr (operator new: std::bad_alloc), instead of ASan aborting the
// process. samplerd's large arrays turn a failed allocation into bad_alloc, and the memory
// budget relies on it (kernels/large_array_test ImpossibleSizesThrowBadAlloc).
const char* __asan_default_options() {
  return "abort_on_error=1:detect_stack_use_after_return=1:strict_string_checks=1:"
         "check_initialization_order=1:detect_leaks=1:allocator_may_return_null=1";
}

const char* __ubsan_default_options() { return "print_stacktrace=1:halt_on_error=1"; }

const char* __tsan_default_options() {
  // second_deadlock_stack: both stacks of a lock-order inversion (pthread mutexes; see
  // tsan_absl_sync.cc for absl::Mutex). history_size=4: older accesses kept, so that a report
  // shows both stacks instead of "failed to restore the stack". allocator_may_return_null=1: as
  // for ASan above (TSan's limit is 2^40 bytes too; kernels/large_array_test under the whole
  // suite with --config=tsan, 2026-11-29).
  return "halt_on_error=1:second_deadlock_stack=1:history_size=4:allocator_may_return_null=1";
}

// libcares.so (Debian's c-ares, gRPC's DNS resolver; not instrumented): 10 bytes allocated by
// malloc inside it, with no frame of samplerd's or gRPC's code on the stack LeakSanitizer
// printed (it ends in libcares.so), still held at exit. Found by the whole suite under
// --config=asan (//tests:tls_test, which resolves "localhost" for its certificates), 2026-11-29.
const char* __lsan_default_suppressions() { return "leak:libcares.so\n"; }

// --config=tsan_deps (Abseil, protobuf and gRPC instrumented): the reports whose every frame is
// in a library that stays uninstrumented, each with its reason in tsan_suppressions.txt.
// --config=tsan: none.
const char* __tsan_default_suppressions() {
#if defined(SAMPLERD_TSAN_SUPPRESSIONS_FILE)
  return
#include "tools/sanitizers/tsan_suppressions.inc"
      ;
#else
  return "";
#endif
}

}  // extern "C"
