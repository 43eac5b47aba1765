#include "kernels/large_array.h"

#include <cstdlib>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace samplerd {
namespace large_array_internal {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

void* Allocate(size_t bytes) {
  if (bytes < kHugePage) {
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  const size_t rounded = LargeArrayBytes(bytes);
  void* p = std::aligned_alloc(kHugePage, rounded);
  if (p == nullptr) throw std::bad_alloc();
#if defined(MADV_HUGEPAGE)
  madvise(p, rounded, MADV_HUGEPAGE);  // Advice only: failure leaves ordinary pages.
#endif
  return p;
}

void Free(void* p) { std::free(p); }

}  // namespace large_array_internal
}  // namespace samplerd
