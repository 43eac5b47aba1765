// Table-driven bad input: every kind of bad request gets the exact status code, a message that
// names the field and the value, and changes nothing (weights, plan, counters).
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/samplerd.grpc.pb.h"
#include "server/server.h"
#include "server/testing/test_server_options.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

class BadInputTest : public ::testing::Test {
 public:  // The table's lambdas call these through a BadInputTest*.
  void SetUp() override {
    Options options = testutil::LoopbackTestOptions();
    options.max_samples_per_job = 1'000'000;
    options.max_jobs = 3;
    options.max_message_bytes = 24 << 20;  // Fits MAX_LOSS_BATCH_PAIRS + 1 pairs (~21 MB).
    options.grace_period = absl::Milliseconds(200);
    server_ = *Server::Create(options);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    stub_ = v1::Sampler::NewStub(channel_);

    // "j": uniform base x loss policy, 4 ranks, some losses already applied in epoch 0.
    v1::CreateJobRequest create;
    create.set_name("j");
    create.mutable_spec()->set_num_samples(100);
    create.mutable_spec()->set_world_size(4);
    create.mutable_spec()->set_seed(3);
    create.mutable_spec()->mutable_policy()->set_loss(v1::LOSS);
    v1::Job job;
    ASSERT_TRUE(
        Call([&](grpc::ClientContext* c) { return stub_->CreateJob(c, create, &job); }).ok());
    const std::vector<uint64_t> shard = ShardOf("j", 0);
    ASSERT_EQ(shard.size(), 25u);
    ASSERT_TRUE(Report(Batch(0, 0, 0, {shard[0], shard[1], shard[2]}, {0.5f, 1.0f, 2.0f})).ok());
    // "st": static weights, not uploaded yet.
    create.set_name("st");
    create.mutable_spec()->mutable_policy()->set_base(v1::STATIC);
    ASSERT_TRUE(
        Call([&](grpc::ClientContext* c) { return stub_->CreateJob(c, create, &job); }).ok());
    // "adv": uniform, 4 ranks, advanced to epoch 2 (epochs 0 and 1 closed).
    create.set_name("adv");
    create.mutable_spec()->clear_policy();
    ASSERT_TRUE(
        Call([&](grpc::ClientContext* c) { return stub_->CreateJob(c, create, &job); }).ok());
    for (uint64_t epoch = 0; epoch < 2; ++epoch) {
      for (uint32_t rank = 0; rank < 4; ++rank) {
        v1::EndEpochRequest end;
        end.set_job("adv");
        end.set_epoch(epoch);
        end.set_rank(rank);
        v1::EndEpochResponse response;
        ASSERT_TRUE(
            Call([&](grpc::ClientContext* c) { return stub_->EndEpoch(c, end, &response); }).ok());
      }
      v1::StreamShardRequest wait;  // Waits until the next epoch is planned.
      wait.set_job("adv");
      wait.set_epoch(epoch + 1);
      wait.set_world_size(4);
      ASSERT_TRUE(Stream(wait).ok());
    }
  }

  grpc::Status Call(const std::function<grpc::Status(grpc::ClientContext*)>& f) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return f(&context);
  }

  // Pairs at shard positions 0, 1, ... unless `positions` says otherwise.
  static v1::LossBatch Batch(uint64_t epoch, uint32_t rank, uint64_t seq,
                             std::vector<uint64_t> indices, std::vector<float> losses,
                             const std::string& job = "j", std::vector<uint64_t> positions = {}) {
    v1::LossBatch b;
    b.set_job(job);
    b.set_epoch(epoch);
    b.set_rank(rank);
    b.set_seq(seq);
    for (uint64_t i : indices) b.add_indices(i);
    for (float l : losses) b.add_losses(l);
    if (positions.empty()) {
      for (uint64_t p = 0; p < indices.size(); ++p) b.add_positions(p);
    }
    for (uint64_t p : positions) b.add_positions(p);
    return b;
  }

  // Rank `rank`'s shard of job `name`'s current epoch (world size 4), position k at [k].
  std::vector<uint64_t> ShardOf(const std::string& name, uint32_t rank) {
    v1::StreamShardRequest request;
    request.set_job(name);
    request.set_rank(rank);
    request.set_world_size(4);
    std::vector<uint64_t> shard;
    EXPECT_TRUE(Call([&](grpc::ClientContext* c) {
                  auto reader = stub_->StreamShard(c, request);
                  v1::ShardChunk chunk;
                  while (reader->Read(&chunk)) {
                    shard.insert(shard.end(), chunk.indices32().begin(), chunk.indices32().end());
                  }
                  return reader->Finish();
                }).ok());
    return shard;
  }

  grpc::Status Report(const v1::LossBatch& batch) {
    return Call([&](grpc::ClientContext* c) {
      v1::LossReportSummary summary;
      auto writer = stub_->ReportLosses(c, &summary);
      writer->Write(batch);
      writer->WritesDone();
      return writer->Finish();
    });
  }

  grpc::Status Stream(const v1::StreamShardRequest& request, std::string* indices = nullptr) {
    return Call([&](grpc::ClientContext* c) {
      auto reader = stub_->StreamShard(c, request);
      v1::ShardChunk chunk;
      while (reader->Read(&chunk)) {
        if (indices) indices->append(chunk.SerializeAsString());
      }
      return reader->Finish();
    });
  }

  grpc::Status UploadWeights(const std::vector<v1::UploadWeightsChunk>& chunks) {
    return Call([&](grpc::ClientContext* c) {
      v1::UploadSummary summary;
      auto writer = stub_->UploadWeights(c, &summary);
      for (const auto& chunk : chunks) writer->Write(chunk);
      writer->WritesDone();
      return writer->Finish();
    });
  }

  // Everything observable about a job: its status (timings aside: epoch, plan readiness, per-rank
  // progress, weight statistics, samples seen) and every rank's shard of the current epoch with
  // importance weights (the plan, and 1/w of every drawn sample).
  std::string Fingerprint(const std::string& name) {
    v1::GetJobStatusRequest request;
    request.set_name(name);
    v1::JobStatus status;
    EXPECT_TRUE(Call([&](grpc::ClientContext* c) {
                  return stub_->GetJobStatus(c, request, &status);
                }).ok());
    std::string out;
    if (status.job().plan_ready()) {
      for (uint32_t r = 0; r < 4; ++r) {
        v1::StreamShardRequest s;
        s.set_job(name);
        s.set_epoch(status.job().current_epoch());
        s.set_rank(r);
        s.set_world_size(4);
        s.set_with_is_weights(true);
        EXPECT_TRUE(Stream(s, &out).ok());
      }
      // Streaming records per-rank progress: read the status after it.
      EXPECT_TRUE(Call([&](grpc::ClientContext* c) {
                    return stub_->GetJobStatus(c, request, &status);
                  }).ok());
    }
    status.clear_last_plan_ms();
    status.clear_last_recompute_ms();
    return out + status.DebugString();
  }

  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Sampler::Stub> stub_;
};

TEST_F(BadInputTest, EveryBadRequestIsRejectedPreciselyAndChangesNothing) {
  auto create = [&](std::string name, std::function<void(v1::JobSpec*)> mutate) {
    return [=](BadInputTest* t) {
      v1::CreateJobRequest r;
      r.set_name(name);
      r.mutable_spec()->set_num_samples(100);
      r.mutable_spec()->set_world_size(4);
      r.mutable_spec()->set_seed(3);
      r.mutable_spec()->mutable_policy()->set_loss(v1::LOSS);
      mutate(r.mutable_spec());
      v1::Job job;
      return t->Call([&](grpc::ClientContext* c) { return t->stub_->CreateJob(c, r, &job); });
    };
  };
  auto stream = [](uint64_t epoch, uint32_t rank, uint32_t world, uint64_t offset = 0,
                   uint32_t chunk = 0, std::string job = "j") {
    return [=](BadInputTest* t) {
      v1::StreamShardRequest r;
      r.set_job(job);
      r.set_epoch(epoch);
      r.set_rank(rank);
      r.set_world_size(world);
      r.set_start_offset(offset);
      r.set_max_chunk_size(chunk);
      return t->Stream(r);
    };
  };
  auto report = [](v1::LossBatch b) { return [=](BadInputTest* t) { return t->Report(b); }; };
  auto end_epoch = [](uint64_t epoch, uint32_t rank, std::string job = "j") {
    return [=](BadInputTest* t) {
      v1::EndEpochRequest r;
      r.set_job(job);
      r.set_epoch(epoch);
      r.set_rank(rank);
      v1::EndEpochResponse resp;
      return t->Call([&](grpc::ClientContext* c) { return t->stub_->EndEpoch(c, r, &resp); });
    };
  };
  auto weights = [](std::string job, std::vector<std::pair<uint64_t, std::vector<float>>> chunks) {
    return [=](BadInputTest* t) {
      std::vector<v1::UploadWeightsChunk> out;
      for (const auto& [offset, values] : chunks) {
        v1::UploadWeightsChunk c;
        c.set_job(job);
        c.set_offset(offset);
        for (float v : values) c.add_weights(v);
        out.push_back(c);
      }
      return t->UploadWeights(out);
    };
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> ok_weights(100, 1.0f);
  std::vector<float> nan_weights(100, 1.0f);
  nan_weights[1] = nan;
  std::vector<uint64_t> huge_idx((1 << 20) + 1, 1);
  std::vector<float> huge_loss((1 << 20) + 1, 1.0f);
  // 1.5 M pairs (index, loss, position): about 30 MB on the wire, over the server's 24 MiB
  // message limit.
  std::vector<uint64_t> wire_idx(1'500'000, 1);
  std::vector<float> wire_loss(1'500'000, 1.0f);
  auto labels = [](std::string job, uint32_t count) {
    return [=](BadInputTest* t) {
      return t->Call([&](grpc::ClientContext* c) {
        v1::UploadSummary summary;
        auto writer = t->stub_->UploadLabels(c, &summary);
        v1::UploadLabelsChunk chunk;
        chunk.set_job(job);
        for (uint32_t k = 0; k < count; ++k) chunk.add_labels(k % 3);
        writer->Write(chunk);
        writer->WritesDone();
        return writer->Finish();
      });
    };
  };
  auto unary = [](std::function<grpc::Status(BadInputTest*, grpc::ClientContext*)> f) {
    return
        [=](BadInputTest* t) { return t->Call([&](grpc::ClientContext* c) { return f(t, c); }); };
  };

  const std::vector<uint64_t> j0 = ShardOf("j", 0), j1 = ShardOf("j", 1);
  struct Case {
    std::string what;
    std::function<grpc::Status(BadInputTest*)> call;
    grpc::StatusCode code;
    std::vector<std::string> message_has;
  } cases[] = {
      {"unknown job",
       [](BadInputTest* t) {
         v1::GetJobRequest r;
         r.set_name("nope");
         v1::Job j;
         return t->Call([&](grpc::ClientContext* c) { return t->stub_->GetJob(c, r, &j); });
       },
       grpc::NOT_FOUND,
       {"job = \"nope\""}},
      {"losses for unknown job",
       report(Batch(0, 0, 1, {1}, {1}, "nope")),
       grpc::NOT_FOUND,
       {"job = \"nope\""}},
      {"N = 0",
       create("x", [](v1::JobSpec* s) { s->set_num_samples(0); }),
       grpc::INVALID_ARGUMENT,
       {"spec.num_samples = 0"}},
      {"N over the limit",
       create("x", [](v1::JobSpec* s) { s->set_num_samples(2'000'000); }),
       grpc::RESOURCE_EXHAUSTED,
       {"spec.num_samples = 2000000", "1000000"}},
      {"world_size = 0",
       create("x", [](v1::JobSpec* s) { s->set_world_size(0); }),
       grpc::INVALID_ARGUMENT,
       {"spec.world_size = 0"}},
      {"M > N without replacement",
       create("x", [](v1::JobSpec* s) { s->set_samples_per_epoch(200); }),
       grpc::INVALID_ARGUMENT,
       {"spec.samples_per_epoch = 200", "100"}},
      {"alpha out of range",
       create("x", [](v1::JobSpec* s) { s->mutable_policy()->set_alpha(-1); }),
       grpc::INVALID_ARGUMENT,
       {"policy.alpha = -1"}},
      {"clamp_hi out of range",
       create("x", [](v1::JobSpec* s) { s->mutable_policy()->set_clamp_hi(0.5); }),
       grpc::INVALID_ARGUMENT,
       {"policy.clamp_hi = 0.5"}},
      {"unknown enum",
       create("x", [](v1::JobSpec* s) { s->set_order(static_cast<v1::Order>(9)); }),
       grpc::INVALID_ARGUMENT,
       {"order = 9"}},
      {"bad name", create("a b", [](v1::JobSpec*) {}), grpc::INVALID_ARGUMENT, {"name = \"a b\""}},
      {"conflicting spec",
       create("j", [](v1::JobSpec* s) { s->set_seed(4); }),
       grpc::ALREADY_EXISTS,
       {"name = \"j\""}},
      {"empty batch", report(Batch(0, 0, 1, {}, {})), grpc::INVALID_ARGUMENT, {"indices: empty"}},
      {"oversize batch",
       report(Batch(0, 0, 1, huge_idx, huge_loss)),
       grpc::INVALID_ARGUMENT,
       {"1048577 pairs"}},
      {"index >= N",
       report(Batch(0, 0, 1, {4, 100}, {1, 1})),
       grpc::INVALID_ARGUMENT,
       {"indices[1] = 100", "num_samples = 100"}},
      {"NaN loss",
       report(Batch(0, 0, 1, {4, 5}, {1, nan})),
       grpc::INVALID_ARGUMENT,
       {"losses[1] = nan"}},
      {"inf loss",
       report(Batch(0, 0, 1, {4}, {INFINITY})),
       grpc::INVALID_ARGUMENT,
       {"losses[0] = inf"}},
      {"negative loss",
       report(Batch(0, 0, 1, {4}, {-1})),
       grpc::INVALID_ARGUMENT,
       {"losses[0] = -1"}},
      {"position outside the rank's shard",
       report(Batch(0, 0, 1, {j0[0]}, {1}, "j", {25})),
       grpc::INVALID_ARGUMENT,
       {"positions[0] = 25", "rank 0's shard [0, 25)"}},
      // Issue 11, defect 4: another rank's sample would take that sample's loss of the epoch.
      {"an index not served to the rank at its position",
       report(Batch(0, 0, 1, {j0[5], j1[6]}, {1, 1}, "j", {5, 6})),
       grpc::INVALID_ARGUMENT,
       {absl::StrCat("indices[1] = ", j1[6], " was not served to rank 0 at positions[1] = 6"),
        absl::StrCat("that position holds index ", j0[6])}},
      {"length mismatch",
       report(Batch(0, 0, 1, {4, 5}, {1})),
       grpc::INVALID_ARGUMENT,
       {"indices: 2 entries but losses: 1"}},
      {"loss rank >= world size",
       report(Batch(0, 4, 1, {4}, {1})),
       grpc::INVALID_ARGUMENT,
       {"rank = 4", "world_size = 4"}},
      {"resize to world size 0",
       unary([](BadInputTest* t, grpc::ClientContext* c) {
         v1::ResizeJobRequest r;
         r.set_name("j");
         r.set_world_size(0);
         v1::Job j;
         return t->stub_->ResizeJob(c, r, &j);
       }),
       grpc::INVALID_ARGUMENT,
       {"world_size = 0", "MAX_WORLD_SIZE"}},
      {"resize an epoch that is not the current one",
       unary([](BadInputTest* t, grpc::ClientContext* c) {
         v1::ResizeJobRequest r;
         r.set_name("j");
         r.set_epoch(5);
         r.set_world_size(2);
         v1::Job j;
         return t->stub_->ResizeJob(c, r, &j);
       }),
       grpc::FAILED_PRECONDITION,
       {"epoch = 5", "not the current epoch 0"}},
      {"shard length of a past epoch needs a rank",
       unary([](BadInputTest* t, grpc::ClientContext* c) {
         v1::GetJobRequest r;
         r.set_name("j");
         r.set_epoch(0);
         v1::Job j;
         return t->stub_->GetJob(c, r, &j);
       }),
       grpc::INVALID_ARGUMENT,
       {"epoch = 0 without a rank"}},
      {"losses for a future epoch",
       report(Batch(5, 0, 1, {4}, {1})),
       grpc::FAILED_PRECONDITION,
       {"epoch = 5", "current epoch is 0"}},
      {"wrong world size",
       stream(0, 0, 8),
       grpc::FAILED_PRECONDITION,
       {"world_size = 8", "the 4 ranks that epoch 0 of job 'j' is dealt to"}},
      {"shard rank >= world size", stream(0, 4, 4), grpc::INVALID_ARGUMENT, {"rank = 4"}},
      {"shard epoch out of order",
       stream(3, 0, 4),
       grpc::FAILED_PRECONDITION,
       {"epoch = 3", "current epoch is 0"}},
      {"start_offset past the end",
       stream(0, 0, 4, 999),
       grpc::INVALID_ARGUMENT,
       {"start_offset = 999", "25"}},
      {"chunk too large",
       stream(0, 0, 4, 0, (1 << 20) + 1),
       grpc::INVALID_ARGUMENT,
       {"max_chunk_size = 1048577"}},
      {"end a future epoch", end_epoch(2, 0), grpc::FAILED_PRECONDITION, {"epoch = 2"}},
      {"end with rank >= world size", end_epoch(0, 9), grpc::INVALID_ARGUMENT, {"rank = 9"}},
      {"weights for a uniform job",
       weights("j", {{0, ok_weights}}),
       grpc::FAILED_PRECONDITION,
       {"policy.base = UNIFORM", "STATIC"}},
      {"NaN weight",
       weights("st", {{0, nan_weights}}),
       grpc::INVALID_ARGUMENT,
       {"weights[1] = nan"}},
      {"all-zero weights",
       weights("st", {{0, std::vector<float>(100, 0.0f)}}),
       grpc::INVALID_ARGUMENT,
       {"all 100 weights are 0"}},
      {"too few weights",
       weights("st", {{0, {1, 2, 3}}}),
       grpc::INVALID_ARGUMENT,
       {"weights: 3 values for num_samples 100"}},
      {"non-contiguous chunks",
       weights("st", {{0, {1, 2}}, {5, {1}}}),
       grpc::INVALID_ARGUMENT,
       {"offset = 5", "expected 2"}},
      // ---- More specs.
      {"empty name", create("", [](v1::JobSpec*) {}), grpc::INVALID_ARGUMENT, {"1 to 128"}},
      {"name too long",
       create(std::string(129, 'n'), [](v1::JobSpec*) {}),
       grpc::INVALID_ARGUMENT,
       {"name = \"nnnn", "1 to 128"}},
      {"world_size too large",
       create("x", [](v1::JobSpec* s) { s->set_world_size(1u << 21); }),
       grpc::INVALID_ARGUMENT,
       {"spec.world_size = 2097152"}},
      {"ema_decay = 1",
       create("x", [](v1::JobSpec* s) { s->mutable_policy()->set_ema_decay(1); }),
       grpc::INVALID_ARGUMENT,
       {"policy.ema_decay = 1"}},
      {"mix > 1",
       create("x", [](v1::JobSpec* s) { s->mutable_policy()->set_mix(2); }),
       grpc::INVALID_ARGUMENT,
       {"policy.mix = 2"}},
      {"negative epsilon",
       create("x", [](v1::JobSpec* s) { s->mutable_policy()->set_epsilon(-1); }),
       grpc::INVALID_ARGUMENT,
       {"policy.epsilon = -1"}},
      {"eta too large",
       create("x",
              [](v1::JobSpec* s) {
                s->mutable_policy()->set_loss(v1::MULTIPLICATIVE);
                s->mutable_policy()->set_eta(1000);
              }),
       grpc::INVALID_ARGUMENT,
       {"policy.eta = 1000"}},
      {"negative prior loss",
       create("x", [](v1::JobSpec* s) { s->mutable_policy()->set_prior_loss(-2); }),
       grpc::INVALID_ARGUMENT,
       {"policy.prior_loss = -2"}},
      {"class_balance_beta >= 1",
       create("x",
              [](v1::JobSpec* s) {
                s->mutable_policy()->set_base(v1::CLASS_BALANCED);
                s->mutable_policy()->set_class_balance_beta(1.5);
              }),
       grpc::INVALID_ARGUMENT,
       {"policy.class_balance_beta = 1.5"}},
      {"clamp_lo > 1",
       create("x", [](v1::JobSpec* s) { s->mutable_policy()->set_clamp_lo(2); }),
       grpc::INVALID_ARGUMENT,
       {"policy.clamp_lo = 2"}},
      {"sequential with replacement",
       create("x",
              [](v1::JobSpec* s) {
                s->clear_policy();
                s->set_order(v1::SEQUENTIAL);
                s->set_replacement(true);
              }),
       grpc::INVALID_ARGUMENT,
       {"spec.order = SEQUENTIAL", "replacement = true"}},
      {"max jobs reached",
       create("x", [](v1::JobSpec*) {}),
       grpc::RESOURCE_EXHAUSTED,
       {"max jobs reached: 3", "--max_jobs"}},
      // ---- Unknown jobs on every RPC.
      {"shard of unknown job",
       stream(0, 0, 4, 0, 0, "nope"),
       grpc::NOT_FOUND,
       {"job = \"nope\""}},
      {"end epoch of unknown job", end_epoch(0, 0, "nope"), grpc::NOT_FOUND, {"job = \"nope\""}},
      {"status of unknown job",
       unary([](BadInputTest* t, grpc::ClientContext* c) {
         v1::GetJobStatusRequest r;
         r.set_name("nope");
         v1::JobStatus s;
         return t->stub_->GetJobStatus(c, r, &s);
       }),
       grpc::NOT_FOUND,
       {"job = \"nope\""}},
      {"delete unknown job",
       unary([](BadInputTest* t, grpc::ClientContext* c) {
         v1::DeleteJobRequest r;
         r.set_name("nope");
         v1::DeleteJobResponse s;
         return t->stub_->DeleteJob(c, r, &s);
       }),
       grpc::NOT_FOUND,
       {"job = \"nope\""}},
      {"weights for unknown job",
       weights("nope", {{0, ok_weights}}),
       grpc::NOT_FOUND,
       {"job = \"nope\""}},
      // ---- Epochs out of order on a job at epoch 2.
      {"shard of a closed epoch",
       stream(1, 0, 4, 0, 0, "adv"),
       grpc::FAILED_PRECONDITION,
       {"epoch = 1", "is closed", "current epoch is 2"}},
      {"shard two epochs ahead",
       stream(4, 0, 4, 0, 0, "adv"),
       grpc::FAILED_PRECONDITION,
       {"epoch = 4", "current epoch is 2"}},
      {"losses for the next epoch",
       report(Batch(3, 0, 1, {4}, {1}, "adv")),
       grpc::FAILED_PRECONDITION,
       {"epoch = 3", "current epoch is 2"}},
      {"end a future epoch of adv",
       end_epoch(3, 0, "adv"),
       grpc::FAILED_PRECONDITION,
       {"epoch = 3", "current epoch is 2"}},
      {"end with rank >= world size on adv",
       end_epoch(2, 4, "adv"),
       grpc::INVALID_ARGUMENT,
       {"rank = 4", "world_size = 4"}},
      // ---- Uploads.
      {"labels for a uniform job",
       labels("j", 100),
       grpc::FAILED_PRECONDITION,
       {"policy.base = UNIFORM", "CLASS_BALANCED"}},
      {"negative weight",
       weights("st", {{0, std::vector<float>(99, 1.0f)}, {99, {-1.0f}}}),
       grpc::INVALID_ARGUMENT,
       {"weights[99] = -1"}},
      {"too many weights",
       weights("st", {{0, ok_weights}, {100, {1.0f}}}),
       grpc::INVALID_ARGUMENT,
       {"weights: 101 values for num_samples 100"}},
      {"chunks naming two jobs",
       [](BadInputTest* t) {
         std::vector<v1::UploadWeightsChunk> chunks(2);
         chunks[0].set_job("st");
         chunks[0].add_weights(1);
         chunks[1].set_job("j");
         chunks[1].set_offset(1);
         chunks[1].add_weights(1);
         return t->UploadWeights(chunks);
       },
       grpc::INVALID_ARGUMENT,
       {"job = \"j\"", "\"st\""}},
      {"empty upload", weights("st", {}), grpc::INVALID_ARGUMENT, {"weights: empty upload"}},
      // ---- Transport limit.
      {"batch over the message limit",
       report(Batch(0, 0, 1, wire_idx, wire_loss)),
       grpc::RESOURCE_EXHAUSTED,
       {"larger than max"}},
  };

  auto fingerprint_all = [&] {
    v1::ListJobsResponse jobs;
    EXPECT_TRUE(Call([&](grpc::ClientContext* c) {
                  return stub_->ListJobs(c, v1::ListJobsRequest(), &jobs);
                }).ok());
    std::string names;
    for (const v1::Job& job : jobs.jobs()) names += job.name() + ",";
    return std::vector<std::string>{names, Fingerprint("j"), Fingerprint("st"), Fingerprint("adv")};
  };
  const std::vector<std::string> before = fingerprint_all();
  ASSERT_EQ(before[0], "adv,j,st,");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const grpc::Status s = c.call(this);
    EXPECT_EQ(s.error_code(), c.code) << s.error_message();
    for (const std::string& part : c.message_has) {
      EXPECT_THAT(s.error_message(), HasSubstr(part));
    }
    const std::vector<std::string> after = fingerprint_all();
    EXPECT_TRUE(after[0] == before[0]) << "the job list changed: " << after[0];
    EXPECT_TRUE(after[1] == before[1]) << "job 'j' changed";
    EXPECT_TRUE(after[2] == before[2]) << "job 'st' changed";
    EXPECT_TRUE(after[3] == before[3]) << "job 'adv' changed";
  }
  // And the fingerprint does see changes: a valid report changes it.
  ASSERT_TRUE(Report(Batch(0, 1, 9, {j1[0]}, {1.0f})).ok());
  EXPECT_FALSE(Fingerprint("j") == before[1]);
}

}  // namespace
}  // namespace samplerd
