// The fuzz targets' checksum repair (docs/HARDENING.md): random bytes almost never carry a valid
// crc32, so a fuzzer that fed them to the readers as they are would stop at the first checksum
// and never reach what lies behind it. A target takes one byte of its input as flags and, where
// they say so, recomputes the checksums of the bytes that follow, so that both the damaged and
// the well-formed-but-strange cases are reached. The formats are record_log.h's and
// snapshot.h's (their readers are the reference; these only write checksums where they would be).
//
// Header-only, testonly (the fuzz targets' only).
#ifndef SAMPLERD_SERVER_PERSISTENCE_FUZZ_CHECKSUMS_H_
#define SAMPLERD_SERVER_PERSISTENCE_FUZZ_CHECKSUMS_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "server/persistence/record_log.h"
#include "zlib.h"

namespace samplerd {
namespace fuzz {

inline uint32_t Crc32(const char* data, size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  if (size > 0) crc = crc32_z(crc, reinterpret_cast<const Bytef*>(data), size);
  return static_cast<uint32_t>(crc);
}

inline uint32_t LoadU32(const std::string& s, size_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}

inline void StoreU32(std::string& s, size_t at, uint32_t v) { std::memcpy(&s[at], &v, 4); }

enum ChecksumFix : uint8_t {
  kFixHeadBlocks = 1,  // Both head blocks of a record log.
  kFixRecords = 2,     // Each record's length and payload checksums, in order, while they fit.
  kFixSnapshot = 4,    // A snapshot's trailing checksum.
};

// Recomputes the checksums `flags` names in `file`, a record log (kFixHeadBlocks, kFixRecords) or
// a snapshot (kFixSnapshot). Bytes that cannot hold them (a file cut short) are left as they are.
inline void FixChecksums(uint8_t flags, std::string& file) {
  constexpr size_t kBlock = 4096;
  if (flags & kFixHeadBlocks) {
    for (size_t at = 0; at + kBlock <= std::min<size_t>(file.size(), 2 * kBlock); at += kBlock) {
      // magic(8) | version(4) | header length(4) | header | sequence(8) | synced(8) | crc(4)
      const uint32_t header_length = LoadU32(file, at + 12);
      if (header_length > kRecordLogMaxHeaderBytes) continue;
      const size_t crc_at = 16 + header_length + 16;
      StoreU32(file, at + crc_at, Crc32(file.data() + at, crc_at));
    }
  }
  if (flags & kFixRecords) {
    for (size_t at = kRecordLogHeadBytes; at + 8 <= file.size();) {
      const uint32_t length = LoadU32(file, at);
      StoreU32(file, at + 4, Crc32(file.data() + at, 4));
      if (at + 8 + uint64_t{length} + 4 > file.size()) break;
      StoreU32(file, at + 8 + length, Crc32(file.data() + at + 8, length));
      at += 12 + uint64_t{length};
    }
  }
  if ((flags & kFixSnapshot) && file.size() >= 4) {
    StoreU32(file, file.size() - 4, Crc32(file.data(), file.size() - 4));
  }
}

}  // namespace fuzz
}  // namespace samplerd

#endif  // SAMPLERD_SERVER_PERSISTENCE_FUZZ_CHECKSUMS_H_
