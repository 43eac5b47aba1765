// The pass order of a mixture job's group (docs/SAMPLING.md, "Mixture jobs"): a keyed
// pseudo-random bijection of [0, n) computed on the fly, so that a group of n samples is read
// once per pass in a new order each pass, with nothing stored per sample. The same code on host
// and device (like kernels/plan_math.h): header-only, free of Abseil and libm, integer
// arithmetic only. Thread-safe (pure functions, immutable objects).
//
// Definition, for a group of n samples (1 <= n <= 2^63), its pass `pass` under the job's `seed`
// and the group's number `group` (< 2^32):
//   1. The pass's round keys K_0, ..., K_11: the words of
//        Philox4x32_10(counter = (group, pass low, pass high, s), key = (seed low, seed high))
//      for s = 5, 6, 7 in turn (RandomStream::kPassOrder, kPassOrder2, kPassOrder3: no other
//      stream of the job uses these counters), four words each, in order.
//   2. The Feistel network on [0, 2^b), b = BitWidth(n - 1) (0 for n = 1): x is split into a
//      top half A of u = floor(b / 2) bits and a bottom half B of v = b - u bits,
//      x = A 2^v + B. Each of R rounds r = 0, ..., R - 1, R = 12 when b <= 10 and 6 otherwise
//      (PassOrderRounds), maps (A, B), of widths (wa, wb), to (B, A xor (F_r(B) mod 2^wa)), of
//      widths (wb, wa), where
//        F_r(B) = Mix32(B xor K_r)   (32-bit words: B < 2^32 since b <= 63)
//      and Mix32 the fixed bijection of 32-bit words
//        x ^= x >> 16; x *= 0x21f0aaad; x ^= x >> 15; x *= 0x735a2d97; x ^= x >> 15
//      (products mod 2^32). After the (even number of) rounds the widths are (u, v) again and
//      the result is A 2^v + B. Each round is a bijection, whatever F is, so the network is a
//      permutation of [0, 2^b).
//   3. Cycle walking: At(j) for j < n applies the network to j, then again to its result, until
//      the result is below n. The walk from j stays on j's cycle of the permutation, which holds
//      j < n, so it ends, and At is a bijection of [0, n) (the walk from At(j) backwards with
//      the inverse network ends at j: IndexOf).
// Cost: 2^b < 2n, so a walk takes 2^b / n < 2 network evaluations on average over the pass
// (exactly: the lengths of the walks add up to the number of points of [0, 2^b) on cycles that
// meet [0, n), at most 2^b), each R rounds of two 32-bit multiplies, plus three Philox calls per
// pass for the keys. A walk of more than t steps needs t consecutive results at or above n:
// probability about (1 - n / 2^b)^t < 2^-t for a random permutation, so walks beyond ~64 steps
// do not happen in practice; the bound is 2^b - n + 1 < n steps. pass_order_test measures the
// mean and the longest walk.
//
// Why this split: the halves differ by at most one bit (an unbalanced Feistel, as FF1's), so
// the domain is the next power of two, not the next power of four (which a balanced split would
// need): at most 2x the group, not 4x, halving the worst mean walk. Why 6 rounds: 4 rounds of a
// random function already give a pseudo-random permutation (Luby-Rackoff) for large halves.
// Why 12 for groups of at most 2^10: halves of a few bits are where a Feistel network's own
// structure shows; with 6 rounds (of this or of any random round function: the Philox rounds
// before gave the same figures) the position of an element over 64000 passes is visibly
// non-uniform for n = 3 to 20 (chi-square z = 15 at n = 3, 112 at n = 5, 4 at n = 17), with 12
// it is not (z from -0.6 to 3.0 over 20 sizes from 3 to 2000; the largest, 3.0 at n = 3, is
// chance at p ~ 0.02: 12 rounds of random functions leave n = 3 a non-centrality of 0.003 at
// this count); pass_order_test checks n = 5 and 12. Why this round function: the order needs
// statistical quality, not secrecy; a key xor-ed into the input of a fixed, well-mixing
// bijection is the key-alternating structure of block ciphers, and Mix32 is the two-multiply
// 32-bit integer hash [16 21f0aaad 15 735a2d97 15] of C. Wellons's hash-prospector list
// (avalanche bias ~0.107, among the lowest of its kind; public domain). It costs ~1/10 of a
// Philox4x32_10 call (20 multiplies), which the network called 6 times per evaluation before:
// the window's fill took ~6x a plan's shuffle (bench/RESULTS.md, "Mixture windows"). The keys
// stay Philox's (philox.h, checked against the Random123 vectors): identical on host and device.
#ifndef SAMPLERD_KERNELS_MIXTURE_PASS_ORDER_H_
#define SAMPLERD_KERNELS_MIXTURE_PASS_ORDER_H_

#include <cstdint>

#include "kernels/philox.h"
#include "kernels/plan_math.h"

namespace samplerd {
namespace mixture {

// The rounds of the Feistel network (part of the definition: changing it changes every plan):
// kPassOrderRounds, or kSmallPassOrderRounds when b <= kSmallPassOrderBits.
constexpr int kPassOrderRounds = 6;
constexpr int kSmallPassOrderRounds = 12;
constexpr uint32_t kSmallPassOrderBits = 10;

SAMPLERD_HD int PassOrderRounds(uint32_t bits) {
  return bits <= kSmallPassOrderBits ? kSmallPassOrderRounds : kPassOrderRounds;
}

// The largest group a pass order covers: 2^63 (b <= 63 keeps both halves within 32 bits).
constexpr uint64_t kMaxGroupSize = uint64_t{1} << 63;

// The round keys of one pass of one group (step 1 of the definition).
struct PassKey {
  uint32_t k[kSmallPassOrderRounds];
};

SAMPLERD_HD PassKey MakePassKey(uint64_t seed, uint32_t group, uint64_t pass) {
  const Philox4x32Key key = {{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
  PassKey out;
  const RandomStream streams[3] = {RandomStream::kPassOrder, RandomStream::kPassOrder2,
                                   RandomStream::kPassOrder3};
  for (int t = 0; t < 3; ++t) {
    const Philox4x32Counter block =
        Philox4x32_10({{group, static_cast<uint32_t>(pass), static_cast<uint32_t>(pass >> 32),
                        static_cast<uint32_t>(streams[t])}},
                      key);
    for (int w = 0; w < 4; ++w) out.k[4 * t + w] = block.v[w];
  }
  return out;
}

// The fixed bijection of the round function (step 2): F_r(B) = Mix32(B xor K_r).
SAMPLERD_HD uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x21f0aaadu;
  x ^= x >> 15;
  x *= 0x735a2d97u;
  x ^= x >> 15;
  return x;
}

// The bijection of [0, n) of one pass: At(j) is the pass's j-th sample of the group.
class PassOrder {
 public:
  // n in [1, kMaxGroupSize] (the caller validates: GroupLayout does).
  SAMPLERD_HD PassOrder(const PassKey& key, uint64_t n)
      : key_(key),
        n_(n),
        bits_(n > 1 ? plan_math::BitWidth(n - 1) : 0),
        rounds_(PassOrderRounds(bits_)) {}

  SAMPLERD_HD uint64_t size() const { return n_; }

  // The j-th entry of the pass (j < n); *steps, if given, receives the network evaluations of
  // the cycle walk (>= 1, or 0 for n = 1).
  SAMPLERD_HD uint64_t At(uint64_t j, uint32_t* steps = nullptr) const {
    uint32_t count = 0;
    uint64_t x = j;
    if (bits_ > 0) {
      do {
        x = Network(x);
        ++count;
      } while (x >= n_);
    }
    if (steps != nullptr) *steps = count;
    return x;
  }

  // The inverse: the j with At(j) == x (x < n).
  SAMPLERD_HD uint64_t IndexOf(uint64_t x) const {
    uint64_t j = x;
    if (bits_ > 0) {
      do {
        j = InverseNetwork(j);
      } while (j >= n_);
    }
    return j;
  }

  // The Feistel network on [0, 2^b) (step 2), and its inverse; x < 2^b.
  SAMPLERD_HD uint64_t Network(uint64_t x) const {
    uint32_t wa = bits_ / 2, wb = bits_ - bits_ / 2;
    uint64_t a = x >> wb, b = x & Mask(wb);
    for (int r = 0; r < rounds_; ++r) {
      const uint64_t c = a ^ (Round(r, b) & Mask(wa));
      a = b;
      b = c;
      const uint32_t w = wa;
      wa = wb;
      wb = w;
    }
    return (a << wb) | b;
  }

  SAMPLERD_HD uint64_t InverseNetwork(uint64_t y) const {
    // After the rounds the widths are (u, v) again; undo the rounds from the last one.
    uint32_t wa = bits_ / 2, wb = bits_ - bits_ / 2;
    uint64_t a = y >> wb, b = y & Mask(wb);
    for (int r = rounds_ - 1; r >= 0; --r) {
      // (a, b) = (B, A xor F_r(B)) of widths (wa, wb): the round's input had widths (wb, wa).
      const uint64_t prev_b = a;
      const uint64_t prev_a = b ^ (Round(r, prev_b) & Mask(wb));
      a = prev_a;
      b = prev_b;
      const uint32_t w = wa;
      wa = wb;
      wb = w;
    }
    return (a << wb) | b;
  }

 private:
  SAMPLERD_HD static uint64_t Mask(uint32_t width) { return (uint64_t{1} << width) - 1; }

  // F_r(half) = Mix32(half xor K_r); half < 2^32.
  SAMPLERD_HD uint64_t Round(int r, uint64_t half) const {
    return Mix32(static_cast<uint32_t>(half) ^ key_.k[r]);
  }

  PassKey key_;
  uint64_t n_;
  uint32_t bits_;
  int rounds_;
};

}  // namespace mixture
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_MIXTURE_PASS_ORDER_H_
