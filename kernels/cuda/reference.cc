#include "kernels/cuda/reference.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace samplerd {
namespace gpu {
namespace reference {

std::vector<uint64_t> SelectEfraimidisSpirakis(uint64_t seed, uint64_t epoch, uint64_t n,
                                               uint64_t m, const float* weights) {
  std::vector<std::pair<uint64_t, uint64_t>> keyed(n);
  for (uint64_t i = 0; i < n; ++i) {
    keyed[i] = {EsKeyBits(seed, epoch, i, weights == nullptr ? 1.0f : weights[i]), i};
  }
  std::nth_element(keyed.begin(), keyed.begin() + (m - 1), keyed.end());
  std::vector<uint64_t> selected(m);
  for (uint64_t k = 0; k < m; ++k) selected[k] = keyed[k].second;
  std::sort(selected.begin(), selected.end());
  return selected;
}

std::vector<uint64_t> Shuffle(uint64_t seed, uint64_t epoch, const std::vector<uint64_t>& inputs,
                              int bucket_bits) {
  const uint64_t buckets = uint64_t{1} << bucket_bits;
  std::vector<std::vector<uint64_t>> bucket(buckets);
  for (uint64_t k = 0; k < inputs.size(); ++k) {
    bucket[ShuffleBucketOf(seed, epoch, bucket_bits, k)].push_back(inputs[k]);
  }
  std::vector<uint64_t> out;
  out.reserve(inputs.size());
  for (uint64_t b = 0; b < buckets; ++b) {
    std::vector<uint64_t>& a = bucket[b];
    SwapWords words(seed, epoch, b);
    for (uint64_t i = a.size(); i-- > 1;) {
      std::swap(a[i], a[words.SwapTarget(static_cast<uint32_t>(i))]);
    }
    out.insert(out.end(), a.begin(), a.end());
  }
  return out;
}

std::vector<uint64_t> QuantisedPrefix(const float* weights, uint64_t n) {
  uint32_t max_bits = 0;
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &weights[i], sizeof bits);
    if (bits != 0x80000000u) max_bits = std::max(max_bits, bits);  // -0 is a zero weight.
  }
  const double scale = QuantisationScale(n, max_bits);
  std::vector<uint64_t> prefix(n + 1, 0);
  for (uint64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + Quantise(weights[i], scale);
  return prefix;
}

std::vector<uint64_t> Draws(const std::vector<uint64_t>& prefix, uint64_t n, uint64_t seed,
                            uint64_t epoch, uint64_t first, uint64_t count) {
  std::vector<uint64_t> out(count);
  for (uint64_t k = 0; k < count; ++k) {
    const uint64_t r = RandomBits64(seed, epoch, RandomStream::kDraw, first + k);
    if (prefix.empty()) {
      out[k] = MulHi64(r, n);
    } else {
      const uint64_t t = MulHi64(r, prefix.back());
      out[k] = static_cast<uint64_t>(std::upper_bound(prefix.begin(), prefix.end(), t) -
                                     prefix.begin() - 1);
    }
  }
  return out;
}

std::vector<uint64_t> Plan(const PlanInputs& in, int (*bucket_bits_rule)(uint64_t)) {
  if (in.sequential) {
    std::vector<uint64_t> plan(in.n);
    for (uint64_t i = 0; i < in.n; ++i) plan[i] = i;
    return plan;
  }
  if (in.replacement) {
    const std::vector<uint64_t> prefix =
        in.weights == nullptr ? std::vector<uint64_t>() : QuantisedPrefix(in.weights, in.n);
    return Draws(prefix, in.n, in.seed, in.epoch, 0, in.m);
  }
  std::vector<uint64_t> selected;
  if (in.m == in.n) {
    selected.resize(in.n);
    for (uint64_t i = 0; i < in.n; ++i) selected[i] = i;
  } else {
    selected = SelectEfraimidisSpirakis(in.seed, in.epoch, in.n, in.m, in.weights);
  }
  return Shuffle(in.seed, in.epoch, selected, bucket_bits_rule(in.m));
}

uint64_t ShardLength(uint64_t plan_length, ShardLayout layout, uint32_t rank) {
  const uint64_t r = layout.world_size;
  switch (layout.uneven) {
    case kUnevenPad:
      return (plan_length + r - 1) / r;
    case kUnevenDropLast:
      return plan_length / r;
    default:
      return plan_length / r + (rank < plan_length % r ? 1 : 0);
  }
}

std::vector<uint64_t> Shard(const std::vector<uint64_t>& plan, ShardLayout layout, uint32_t rank,
                            uint64_t start, uint64_t count) {
  std::vector<uint64_t> out(count);
  for (uint64_t k = 0; k < count; ++k) {
    out[k] = plan[ShardPlanPosition(plan.size(), layout, rank, start + k)];
  }
  return out;
}

}  // namespace reference
}  // namespace gpu
}  // namespace samplerd
