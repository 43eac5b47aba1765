#include "tools/gpu/backend_compare.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/gpu/synthetic_inputs.h"

namespace samplerd {
namespace gpu_e2e {
namespace {

// Losses per LossBatch and batches per ReportLosses call: the API's batch limit is far above
// (v1::MAX_LOSS_BATCH_PAIRS); a few MB per call keeps the client's memory bounded at N = 1e7.
constexpr size_t kPairsPerBatch = 65536;
constexpr size_t kBatchesPerCall = 16;
static_assert(kPairsPerBatch <= v1::MAX_LOSS_BATCH_PAIRS, "batch over the API's limit");

struct JobCase {
  std::string name;
  v1::JobSpec spec;
};

const char* BaseName(v1::BasePolicy base) {
  switch (base) {
    case v1::STATIC:
      return "static";
    case v1::CLASS_BALANCED:
      return "balanced";
    default:
      return "uniform";
  }
}

const char* LossName(v1::LossPolicy loss) {
  switch (loss) {
    case v1::LOSS:
      return "loss";
    case v1::MULTIPLICATIVE:
      return "mult";
    default:
      return "none";
  }
}

// The 39 jobs of one N (see backend_compare.h); `k` numbers the variations that do not need a
// job of their own (world size, partition, uneven policy, policy parameters).
std::vector<JobCase> JobsFor(uint64_t n, const std::string& prefix) {
  std::vector<JobCase> jobs;
  int k = 0;
  auto add = [&](std::string name, v1::JobSpec spec) {
    spec.set_num_samples(n);
    spec.set_seed(Hash(n, k, 0x5eed));
    spec.set_world_size(k % 2 == 0 ? 2 : 3);
    spec.set_partition(k % 4 < 2 ? v1::INTERLEAVED : v1::CONTIGUOUS);
    const v1::UnevenPolicy uneven[] = {v1::PAD, v1::DROP_LAST, v1::UNEVEN};
    spec.set_uneven(uneven[k % 3]);
    jobs.push_back({absl::StrCat(prefix, "-n", n, "-", name, "-w", spec.world_size()), spec});
    ++k;
  };
  v1::JobSpec sequential;
  sequential.set_order(v1::SEQUENTIAL);
  add("sequential", sequential);
  for (v1::BasePolicy base : {v1::UNIFORM, v1::STATIC, v1::CLASS_BALANCED}) {
    for (v1::LossPolicy loss : {v1::NONE, v1::LOSS, v1::MULTIPLICATIVE}) {
      for (bool replacement : {false, true}) {
        for (uint64_t m : {n / 10, n}) {
          v1::JobSpec spec;
          spec.set_order(v1::WEIGHTED_RANDOM);
          spec.set_replacement(replacement);
          spec.set_samples_per_epoch(m);
          v1::WeightPolicy* policy = spec.mutable_policy();
          policy->set_base(base);
          policy->set_loss(loss);
          if (base == v1::CLASS_BALANCED && k % 2 == 1) policy->set_class_balance_beta(0.99);
          if (loss == v1::LOSS) {
            policy->set_alpha(1.5);
            policy->set_ema_decay(0.8);
            policy->set_mix(0.05);
            if (k % 2 == 0) policy->set_prior_loss(0.5);
          } else if (loss == v1::MULTIPLICATIVE) {
            policy->set_eta(0.5);
            policy->set_clamp_lo(0.2);
            policy->set_clamp_hi(5);
          }
          add(absl::StrCat(BaseName(base), "-", LossName(loss), "-",
                           replacement ? "repl" : "norepl", "-m", m),
              spec);
        }
      }
    }
  }
  // Mixture jobs (docs/SAMPLING.md, "Mixture jobs"): each server's backend computes the windows.
  // Groups of 1 and 3 samples (smaller than the window: several passes per window), a window
  // of N / 10 + 3 (a multiple of nothing in particular); static weights changed by
  // SetGroupWeights (CompareJob: in force from epoch 2), and EXP3 weights learned from the
  // losses.
  for (bool online : {false, true}) {
    v1::JobSpec spec;
    spec.set_samples_per_epoch(n / 10 + 3);
    v1::MixtureSpec* mixture = spec.mutable_mixture();
    uint64_t rest = n;
    for (uint64_t size : {uint64_t{1}, uint64_t{3}, n / 100 + 1, n / 20 + 1}) {
      mixture->add_group_sizes(size);
      rest -= size;
    }
    mixture->add_group_sizes(rest);
    for (double w : {0.5, 2.0, 1.0, 0.25, 3.0}) mixture->add_group_weights(w);
    if (online) mixture->set_rule(v1::EXP3);
    add(online ? "mixture-exp3" : "mixture-static", spec);
  }
  return jobs;
}

// The static weights a mixture job is given by SetGroupWeights during epoch kReweightEpoch (so in
// force from the next one).
constexpr int kReweightEpoch = 1;
const double kNewGroupWeights[] = {4.0, 0.0, 1.0, 2.0, 0.5};

// Runs f(0) (server a) and f(1) (server b) at once: the two servers work in parallel.
template <typename F>
void OnBoth(F&& f) {
  std::thread b([&] { f(1); });
  f(0);
  b.join();
}

absl::Status Annotated(const absl::Status& s, const std::string& where) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
}

// The first of two statuses that is not OK (a's first).
absl::Status FirstError(const absl::Status (&s)[2]) { return !s[0].ok() ? s[0] : s[1]; }

uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

uint64_t DoubleBits(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  return bits;
}

struct Shard {
  std::vector<uint64_t> indices;
  std::vector<float> is_weights;
};

absl::Status ReadShard(SamplerClient& client, const std::string& job, uint64_t epoch, uint32_t rank,
                       uint32_t world, Shard* shard) {
  shard->indices.clear();
  shard->is_weights.clear();
  StreamShardOptions options;
  options.with_is_weights = true;
  return client.StreamShard(job, epoch, rank, world, options, [&](const ShardSlice& slice) {
    if (slice.is_weights.size() != slice.indices.size()) {
      return absl::DataLossError(absl::StrCat("a chunk at offset ", slice.offset, " has ",
                                              slice.indices.size(), " indices but ",
                                              slice.is_weights.size(), " importance weights"));
    }
    shard->indices.insert(shard->indices.end(), slice.indices.begin(), slice.indices.end());
    shard->is_weights.insert(shard->is_weights.end(), slice.is_weights.begin(),
                             slice.is_weights.end());
    return absl::OkStatus();
  });
}

// Empty if equal; else the first difference.
std::string CompareShards(const Shard& a, const Shard& b) {
  const size_t common = std::min(a.indices.size(), b.indices.size());
  for (size_t p = 0; p < common; ++p) {
    if (a.indices[p] != b.indices[p] || FloatBits(a.is_weights[p]) != FloatBits(b.is_weights[p])) {
      return absl::StrFormat(
          "position=%d: a index=%d is_weight=%.9g (%a) | b index=%d is_weight=%.9g (%a)", p,
          a.indices[p], a.is_weights[p], a.is_weights[p], b.indices[p], b.is_weights[p],
          b.is_weights[p]);
    }
  }
  if (a.indices.size() != b.indices.size()) {
    return absl::StrCat("shard length: a ", a.indices.size(), " | b ", b.indices.size());
  }
  return "";
}

// Empty if the weight summaries and loss counts agree bit for bit; else the field that differs.
std::string CompareStatus(const v1::JobStatus& a, const v1::JobStatus& b) {
  auto diff_double = [](const char* field, double x, double y) -> std::string {
    if (DoubleBits(x) == DoubleBits(y)) return "";
    return absl::StrFormat("JobStatus.%s: a %.17g (%a) | b %.17g (%a)", field, x, x, y, y);
  };
  const v1::WeightStats& wa = a.weights();
  const v1::WeightStats& wb = b.weights();
  for (std::string d : {diff_double("weights.min", wa.min(), wb.min()),
                        diff_double("weights.max", wa.max(), wb.max()),
                        diff_double("weights.mean", wa.mean(), wb.mean()),
                        diff_double("weights.effective_sample_size", wa.effective_sample_size(),
                                    wb.effective_sample_size())}) {
    if (!d.empty()) return d;
  }
  if (wa.zero_count() != wb.zero_count()) {
    return absl::StrCat("JobStatus.weights.zero_count: a ", wa.zero_count(), " | b ",
                        wb.zero_count());
  }
  if (a.samples_seen() != b.samples_seen()) {
    return absl::StrCat("JobStatus.samples_seen: a ", a.samples_seen(), " | b ", b.samples_seen());
  }
  if (a.job().current_epoch() != b.job().current_epoch()) {
    return absl::StrCat("JobStatus.job.current_epoch: a ", a.job().current_epoch(), " | b ",
                        b.job().current_epoch());
  }
  // A mixture job's groups: weights, window counts and cursors.
  const v1::MixtureStatus& ma = a.mixture();
  const v1::MixtureStatus& mb = b.mixture();
  if (ma.top_groups_size() != mb.top_groups_size()) {
    return absl::StrCat("JobStatus.mixture.top_groups: a ", ma.top_groups_size(), " groups | b ",
                        mb.top_groups_size());
  }
  for (int g = 0; g < ma.top_groups_size(); ++g) {
    const v1::GroupStatus& ga = ma.top_groups(g);
    const v1::GroupStatus& gb = mb.top_groups(g);
    if (ga.group() != gb.group() || DoubleBits(ga.weight()) != DoubleBits(gb.weight()) ||
        ga.window_count() != gb.window_count() || ga.pass() != gb.pass() ||
        ga.position() != gb.position()) {
      auto text = [](const v1::GroupStatus& x) {
        return absl::StrFormat("group=%d weight=%.17g count=%d pass=%d position=%d", x.group(),
                               x.weight(), x.window_count(), x.pass(), x.position());
      };
      return absl::StrCat("JobStatus.mixture.top_groups[", g, "]: a ", text(ga), " | b ", text(gb));
    }
  }
  return "";
}

// Reports the synthetic loss of every position of `shard` (rank `rank`, epoch `epoch`), in shard
// order; adds the pairs accepted to *accepted. `bump_first` adds 1 to the first loss (the
// test-only perturbation).
absl::Status ReportShardLosses(SamplerClient& client, const std::string& job, uint64_t seed,
                               uint64_t epoch, uint32_t rank, const Shard& shard, bool bump_first,
                               uint64_t* accepted) {
  std::vector<v1::LossBatch> batches;
  uint64_t seq = 0;
  auto flush = [&]() -> absl::Status {
    if (batches.empty()) return absl::OkStatus();
    absl::StatusOr<v1::LossReportSummary> summary = client.ReportLosses(batches);
    batches.clear();
    if (!summary.ok()) return summary.status();
    *accepted += summary->accepted();
    return absl::OkStatus();
  };
  for (size_t begin = 0; begin < shard.indices.size(); begin += kPairsPerBatch) {
    const size_t end = std::min(shard.indices.size(), begin + kPairsPerBatch);
    v1::LossBatch& batch = batches.emplace_back();
    batch.set_job(job);
    batch.set_epoch(epoch);
    batch.set_rank(rank);
    batch.set_seq(seq++);
    batch.set_first_position(begin);
    batch.mutable_indices()->Reserve(static_cast<int>(end - begin));
    batch.mutable_losses()->Reserve(static_cast<int>(end - begin));
    for (size_t p = begin; p < end; ++p) {
      batch.add_indices(shard.indices[p]);
      float loss = SyntheticLoss(seed, epoch, shard.indices[p]);
      if (bump_first && p == 0) loss += 1.0f;
      batch.add_losses(loss);
    }
    if (batches.size() == kBatchesPerCall) {
      if (absl::Status s = flush(); !s.ok()) return s;
    }
  }
  return flush();
}

absl::Status Upload(SamplerClient& client, const JobCase& job) {
  const uint64_t n = job.spec.num_samples();
  // One seed per N, not the job's: both servers get the same weights even when the test-only
  // perturbation changes the plan seed of b.
  const uint64_t seed = Hash(n, 0x1b1b);
  switch (job.spec.policy().base()) {
    case v1::STATIC: {
      // Zero weights, except where the plan must draw every sample once.
      const bool zeros = job.spec.replacement() || job.spec.samples_per_epoch() < n;
      std::vector<float> weights(n);
      for (uint64_t i = 0; i < n; ++i) weights[i] = SyntheticWeight(seed, i, zeros);
      return client.UploadWeights(job.name, weights);
    }
    case v1::CLASS_BALANCED: {
      std::vector<uint32_t> labels(n);
      for (uint64_t i = 0; i < n; ++i) labels[i] = SyntheticLabel(seed, i);
      return client.UploadLabels(job.name, labels);
    }
    default:
      return absl::OkStatus();
  }
}

// One job on both servers, epoch by epoch. Returns the first difference in *difference.
absl::Status CompareJob(SamplerClient* clients[2], const JobCase& job,
                        const CompareOptions& options, CompareSummary* summary,
                        std::string* difference) {
  const char* side[2] = {"a", "b"};
  const uint32_t world = job.spec.world_size();
  const uint64_t loss_seed = job.spec.seed();
  absl::Status status[2];
  OnBoth([&](int s) {
    v1::JobSpec spec = job.spec;
    if (s == 1) spec.set_seed(spec.seed() ^ options.testonly_b_seed_xor);
    // A job of this name left by an earlier run fails here (ALREADY_EXISTS for another spec,
    // FAILED_PRECONDITION past epoch 0) or at the upload (already started).
    absl::StatusOr<v1::Job> created = clients[s]->CreateJob(job.name, spec);
    status[s] = created.ok() ? Upload(*clients[s], job) : created.status();
    status[s] = Annotated(status[s], absl::StrCat("server ", side[s], ": job ", job.name));
  });
  if (absl::Status s = FirstError(status); !s.ok()) return s;

  uint64_t indices = 0;
  v1::JobStatus last[2];
  for (int epoch = 0; epoch <= options.epochs; ++epoch) {
    // Every rank's shard from both servers (waits for the epoch's plan).
    std::vector<Shard> shards[2];
    OnBoth([&](int s) {
      shards[s].resize(world);
      for (uint32_t r = 0; r < world && status[s].ok(); ++r) {
        status[s] = Annotated(ReadShard(*clients[s], job.name, epoch, r, world, &shards[s][r]),
                              absl::StrCat("server ", side[s], ": job ", job.name, " epoch ", epoch,
                                           " rank ", r, ": StreamShard"));
      }
      if (status[s].ok()) {
        absl::StatusOr<v1::JobStatus> got = clients[s]->GetJobStatus(job.name);
        status[s] = Annotated(
            got.status(), absl::StrCat("server ", side[s], ": job ", job.name, ": GetJobStatus"));
        if (got.ok()) last[s] = *std::move(got);
      }
    });
    if (absl::Status s = FirstError(status); !s.ok()) return s;
    const std::string where = absl::StrCat("job=", job.name, " epoch=", epoch);
    for (uint32_t r = 0; r < world; ++r) {
      if (std::string d = CompareShards(shards[0][r], shards[1][r]); !d.empty()) {
        *difference = absl::StrCat(where, " rank=", r, " ", d);
        return absl::OkStatus();
      }
      indices += shards[0][r].indices.size();
    }
    if (std::string d = CompareStatus(last[0], last[1]); !d.empty()) {
      *difference = absl::StrCat(where, " ", d);
      return absl::OkStatus();
    }
    if (epoch == options.epochs) break;  // Only compared: the recompute of the last epoch.
    if (job.spec.has_mixture() && job.spec.mixture().rule() == v1::STATIC_WEIGHTS &&
        epoch == kReweightEpoch) {
      OnBoth([&](int s) {
        status[s] = Annotated(clients[s]->SetGroupWeights(job.name, kNewGroupWeights).status(),
                              absl::StrCat("server ", side[s], ": job ", job.name, " epoch ", epoch,
                                           ": SetGroupWeights"));
      });
      if (absl::Status s = FirstError(status); !s.ok()) return s;
    }

    // The same losses to both, rank by rank in the same order (so that "first arrival wins"
    // sees the same order), then every rank ends the epoch.
    uint64_t accepted[2] = {0, 0};
    OnBoth([&](int s) {
      for (uint32_t r = 0; r < world && status[s].ok(); ++r) {
        const bool bump = s == 1 && options.testonly_b_loss_changed && epoch == 0 && r == 0;
        status[s] = Annotated(ReportShardLosses(*clients[s], job.name, loss_seed, epoch, r,
                                                shards[s][r], bump, &accepted[s]),
                              absl::StrCat("server ", side[s], ": job ", job.name, " epoch ", epoch,
                                           " rank ", r, ": ReportLosses"));
      }
      for (uint32_t r = 0; r < world && status[s].ok(); ++r) {
        status[s] = Annotated(clients[s]->EndEpoch(job.name, epoch, r).status(),
                              absl::StrCat("server ", side[s], ": job ", job.name, " epoch ", epoch,
                                           " rank ", r, ": EndEpoch"));
      }
    });
    if (absl::Status s = FirstError(status); !s.ok()) return s;
    if (accepted[0] != accepted[1]) {
      *difference = absl::StrCat(where, " losses accepted: a ", accepted[0], " | b ", accepted[1]);
      return absl::OkStatus();
    }
  }
  OnBoth([&](int s) {
    status[s] = Annotated(clients[s]->DeleteJob(job.name),
                          absl::StrCat("server ", side[s], ": job ", job.name, ": DeleteJob"));
  });
  if (absl::Status s = FirstError(status); !s.ok()) return s;

  summary->backend_a = last[0].backend();
  summary->backend_b = last[1].backend();
  summary->indices_compared += indices;
  ++summary->jobs_compared;
  if (options.log) {
    const v1::WeightStats& w = last[0].weights();
    options.log(absl::StrFormat(
        "OK %-44s epochs=%d indices=%d weights: min=%.6g max=%.6g ess=%.6g zero=%d (a=%s b=%s)",
        job.name, options.epochs + 1, indices, w.min(), w.max(), w.effective_sample_size(),
        w.zero_count(), summary->backend_a, summary->backend_b));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CompareSummary> CompareBackends(SamplerClient& a, SamplerClient& b,
                                               const CompareOptions& options) {
  if (options.sizes.empty()) return absl::InvalidArgumentError("sizes: empty");
  for (uint64_t n : options.sizes) {
    if (n < 10) {
      return absl::InvalidArgumentError(
          absl::StrCat("sizes: N = ", n, " is below 10 (M = N / 10 must be >= 1)"));
    }
  }
  if (options.epochs < 1) {
    return absl::InvalidArgumentError(absl::StrCat("epochs = ", options.epochs, " must be >= 1"));
  }
  if (options.job_prefix.empty()) return absl::InvalidArgumentError("job_prefix: empty");
  SamplerClient* clients[2] = {&a, &b};
  CompareSummary summary;
  for (uint64_t n : options.sizes) {
    for (const JobCase& job : JobsFor(n, options.job_prefix)) {
      if (!options.job_filter.empty() &&
          std::none_of(
              options.job_filter.begin(), options.job_filter.end(),
              [&](const std::string& part) { return absl::StrContains(job.name, part); })) {
        continue;
      }
      if (absl::Status s = CompareJob(clients, job, options, &summary, &summary.difference);
          !s.ok()) {
        return s;
      }
      if (!summary.difference.empty()) return summary;
    }
  }
  return summary;
}

}  // namespace gpu_e2e
}  // namespace samplerd
