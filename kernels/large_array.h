// Memory for the large arrays of the CPU backend: plans, draw tables, selection keys.
//
// An array of 2 MiB or more is 2 MiB-aligned and advised as transparent huge pages
// (madvise(MADV_HUGEPAGE); a no-op where THP is off). Two effects at N = 1e7:
//   - first touch: one page fault per 2 MiB instead of per 4 KiB; a 40 MB plan costs ~5 ms of
//     faults instead of ~30 ms on the build machine (bench/RESULTS.md);
//   - random access (the draws with replacement read an 80 MB prefix-sum table at random): a
//     handful of TLB entries cover the table instead of one miss per access.
// Elements are default-initialised: resize() leaves integers unwritten (their first writer
// touches the pages, in parallel), where std::vector's value-initialisation would write zeros
// that the writer then overwrites.
#ifndef SAMPLERD_KERNELS_LARGE_ARRAY_H_
#define SAMPLERD_KERNELS_LARGE_ARRAY_H_

#include <cstddef>
#include <new>
#include <utility>
#include <vector>

namespace samplerd {

namespace large_array_internal {
// At least `bytes` bytes (>= 1), 2 MiB-aligned where bytes >= 2 MiB; throws std::bad_alloc.
void* Allocate(size_t bytes);
void Free(void* p);
}  // namespace large_array_internal

// Bytes that an array of `bytes` really takes: arrays of 2 MiB or more are rounded up to whole
// 2 MiB pages (Allocate below). For memory estimates.
inline size_t LargeArrayBytes(size_t bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  return bytes < kHugePage ? bytes : (bytes + kHugePage - 1) / kHugePage * kHugePage;
}

// A std::allocator for LargeVector. Stateless: all instances are equal.
template <typename T>
class LargeArrayAllocator {
 public:
  using value_type = T;

  LargeArrayAllocator() = default;
  template <typename U>
  LargeArrayAllocator(const LargeArrayAllocator<U>&) {}  // NOLINT: rebinding is implicit.

  T* allocate(size_t n) {
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_alloc();
    return static_cast<T*>(large_array_internal::Allocate(n * sizeof(T)));
  }
  void deallocate(T* p, size_t) { large_array_internal::Free(p); }

  // Default-initialisation for `resize(n)` and `T()`-less construction.
  template <typename U>
  void construct(U* p) noexcept(noexcept(::new (static_cast<void*>(p)) U)) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }

  friend bool operator==(const LargeArrayAllocator&, const LargeArrayAllocator&) { return true; }
  friend bool operator!=(const LargeArrayAllocator&, const LargeArrayAllocator&) { return false; }
};

// A vector for large arrays of integers or floats (see above: resize() does not write).
template <typename T>
using LargeVector = std::vector<T, LargeArrayAllocator<T>>;

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_LARGE_ARRAY_H_
