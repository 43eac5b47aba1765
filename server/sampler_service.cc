#include "server/sampler_service.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "proto/status_util.h"
#include "server/claim_reactor.h"
#include "server/client_stream_reactor.h"
#include "server/client_streams.h"
#include "server/raw_request.h"
#include "server/shard_stream_reactor.h"

namespace samplerd {

// ---- The service.

SamplerService::SamplerService(JobRegistry* registry, ComputeBackend* backend,
                               int max_message_bytes, uint64_t max_stream_buffer_bytes,
                               const Authorizer* authorizer, metrics::Registry* metrics,
                               int max_handler_threads)
    : registry_(registry),
      backend_(backend),
      max_message_bytes_(max_message_bytes),
      stream_budget_(max_stream_buffer_bytes),
      metrics_(metrics),
      gate_(authorizer),
      calls_(max_handler_threads) {
  if (metrics == nullptr) return;
  metrics->AddGaugeCallback(
      "samplerd_calls_waiting",
      "Of the calls held, those waiting without a thread: StreamShard for its epoch's plan, and "
      "any call queued for a handler thread; by method.",
      {"method"}, [this] {
        std::vector<metrics::GaugeSample> samples;
        for (int m = 0; m < kMethodCount; ++m) {
          const auto method = static_cast<SamplerMethod>(m);
          samples.push_back(
              {{SamplerMethodName(method)}, static_cast<double>(calls_.Waiting(method))});
        }
        return samples;
      });
  metrics->AddGaugeCallback(
      "samplerd_rank_claims",
      "Rank claims held now (open ClaimRank calls: one per trainer process that claimed its "
      "rank, peers each), by job.",
      {"job_name"}, [this] {
        std::vector<metrics::GaugeSample> samples;
        for (const auto& job : registry_->List()) {
          samples.push_back({{job->name()}, static_cast<double>(job->claims().open())});
        }
        return samples;
      });
  auto load = [this](double (*value)(const WorkPool::Load&)) {
    return [this, value] { return std::vector<metrics::GaugeSample>{{{}, value(calls_.load())}}; };
  };
  metrics->AddGaugeCallback(
      "samplerd_handler_threads",
      "Threads started to run calls' blocking work (at most --max_server_threads).", {},
      load([](const WorkPool::Load& l) { return static_cast<double>(l.threads); }));
  metrics->AddGaugeCallback(
      "samplerd_handler_threads_busy", "Handler threads running a call's work now.", {},
      load([](const WorkPool::Load& l) { return static_cast<double>(l.busy); }));
  metrics->AddGaugeCallback(
      "samplerd_handler_queue_length", "Calls' work waiting for a handler thread.", {},
      load([](const WorkPool::Load& l) { return static_cast<double>(l.queued); }));
  metrics->AddGaugeCallback(
      "samplerd_handler_queue_oldest_seconds",
      "How long the oldest work waiting for a handler thread has waited, in seconds.", {},
      load([](const WorkPool::Load& l) { return absl::ToDoubleSeconds(l.oldest_queued); }));
  metrics
      ->AddGauge("samplerd_handler_threads_limit",
                 "Most threads that run calls' blocking work (--max_server_threads).")
      ->WithLabels({})
      ->Set(static_cast<double>(max_handler_threads));
}

SamplerService::~SamplerService() = default;

template <typename Request, typename Response>
grpc::ServerUnaryReactor* SamplerService::Unary(
    SamplerMethod method, grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* raw_response, bool blocking,
    grpc::Status (SamplerService::*handler)(absl::Time, const Request&, Response*)) {
  calls_.Begin(method);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto finish = [this, method, reactor](const grpc::Status& status) {
    reactor->Finish(status);
    calls_.End(method);
  };
  absl::StatusOr<Caller> caller = gate_.CallerOf(*context);
  if (!caller.ok()) {
    finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  auto request = std::make_shared<Request>();
  if (absl::Status s = ParseRequest(*raw, request.get()); !s.ok()) {
    finish(ToGrpcStatus(s));
    return reactor;
  }
  if (absl::Status s = gate_.Check(method, *caller, *request); !s.ok()) {
    finish(ToGrpcStatus(s));
    return reactor;
  }
  auto run = [this, handler, request, raw_response, finish, deadline = DeadlineOf(*context)] {
    Response response;
    grpc::Status status = (this->*handler)(deadline, *request, &response);
    if (status.ok()) status = SerializeResponse(response, raw_response);
    finish(status);
  };
  if (blocking) {
    calls_.Schedule(method, std::move(run));
  } else {
    run();
  }
  return reactor;
}

// Planning, disk syncs and job teardown block: on the WorkPool. Reads of a job's state take its
// lock briefly: on gRPC's thread.
grpc::ServerUnaryReactor* SamplerService::CreateJob(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return Unary(kCreateJob, context, request, response, true, &SamplerService::DoCreateJob);
}
grpc::ServerUnaryReactor* SamplerService::GetJob(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  return Unary(kGetJob, context, request, response, false, &SamplerService::DoGetJob);
}
grpc::ServerUnaryReactor* SamplerService::ListJobs(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  return Unary(kListJobs, context, request, response, false, &SamplerService::DoListJobs);
}
grpc::ServerUnaryReactor* SamplerService::DeleteJob(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return Unary(kDeleteJob, context, request, response, true, &SamplerService::DoDeleteJob);
}
grpc::ServerUnaryReactor* SamplerService::RewindJob(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return Unary(kRewindJob, context, request, response, true, &SamplerService::DoRewindJob);
}
grpc::ServerUnaryReactor* SamplerService::ResizeJob(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return Unary(kResizeJob, context, request, response, true, &SamplerService::DoResizeJob);
}
grpc::ServerUnaryReactor* SamplerService::SetGroupWeights(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  return Unary(kSetGroupWeights, context, request, response, true,
               &SamplerService::DoSetGroupWeights);
}
grpc::ServerUnaryReactor* SamplerService::EndEpoch(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  return Unary(kEndEpoch, context, request, response, true, &SamplerService::DoEndEpoch);
}
grpc::ServerUnaryReactor* SamplerService::GetJobStatus(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  return Unary(kGetJobStatus, context, request, response, false, &SamplerService::DoGetJobStatus);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* SamplerService::UploadWeights(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return ClientStreamReactor<WeightsUpload>::Start(
      &calls_, &gate_, kUploadWeights, context, response,
      [this](Caller caller, v1::UploadSummary* summary) {
        return MakeWeightsUpload(registry_, std::move(caller), summary);
      });
}

grpc::ServerReadReactor<grpc::ByteBuffer>* SamplerService::UploadLabels(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return ClientStreamReactor<LabelsUpload>::Start(
      &calls_, &gate_, kUploadLabels, context, response,
      [this](Caller caller, v1::UploadSummary* summary) {
        return MakeLabelsUpload(registry_, std::move(caller), summary);
      });
}

grpc::ServerReadReactor<grpc::ByteBuffer>* SamplerService::UploadIrreducibleLosses(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return ClientStreamReactor<IrreducibleLossesUpload>::Start(
      &calls_, &gate_, kUploadIrreducibleLosses, context, response,
      [this](Caller caller, v1::UploadSummary* summary) {
        return MakeIrreducibleLossesUpload(registry_, std::move(caller), summary);
      });
}

grpc::ServerReadReactor<grpc::ByteBuffer>* SamplerService::ReportLosses(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return ClientStreamReactor<LossStream>::Start(
      &calls_, &gate_, kReportLosses, context, response,
      [this](Caller caller, v1::LossReportSummary* summary) {
        return LossStream(registry_, &metrics_, std::move(caller), summary);
      });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* SamplerService::StreamShard(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return ShardStreamReactor::Start(
      {&calls_, &gate_, registry_, backend_, max_message_bytes_, &stream_budget_, &metrics_},
      context, request);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* SamplerService::ClaimRank(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return ClaimReactor::Start(&calls_, &gate_, registry_, context, request);
}

// ---- The unary methods.

grpc::Status SamplerService::DoCreateJob(absl::Time deadline, const v1::CreateJobRequest& request,
                                         v1::Job* response) {
  absl::StatusOr<std::shared_ptr<Job>> job =
      registry_->Create(request.name(), request.spec(), deadline, request.resume());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = (*job)->Describe();
  return grpc::Status::OK;
}

grpc::Status SamplerService::DoGetJob(absl::Time, const v1::GetJobRequest& request,
                                      v1::Job* response) {
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request.name());
  if (!job.ok()) return ToGrpcStatus(job.status());
  if (!request.has_rank()) {
    if (request.has_epoch()) {
      return ToGrpcStatus(
          absl::InvalidArgumentError(absl::StrCat("epoch = ", request.epoch(),
                                                  " without a rank: it selects the epoch of "
                                                  "the rank's shard length")));
    }
    *response = (*job)->Describe();
    return grpc::Status::OK;
  }
  absl::StatusOr<v1::Job> described = (*job)->DescribeForRank(
      request.rank(),
      request.has_epoch() ? std::optional<uint64_t>(request.epoch()) : std::nullopt);
  if (!described.ok()) return ToGrpcStatus(described.status());
  *response = *std::move(described);
  return grpc::Status::OK;
}

grpc::Status SamplerService::DoListJobs(absl::Time, const v1::ListJobsRequest&,
                                        v1::ListJobsResponse* response) {
  for (const auto& job : registry_->List()) *response->add_jobs() = job->Describe();
  return grpc::Status::OK;
}

grpc::Status SamplerService::DoDeleteJob(absl::Time, const v1::DeleteJobRequest& request,
                                         v1::DeleteJobResponse*) {
  absl::Status deleted = registry_->Delete(request.name());
  if (!absl::IsNotFound(deleted)) metrics_.ForgetJob(request.name());
  return ToGrpcStatus(deleted);
}

grpc::Status SamplerService::DoRewindJob(absl::Time, const v1::RewindJobRequest& request,
                                         v1::Job* response) {
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request.name());
  if (!job.ok()) return ToGrpcStatus(job.status());
  if (absl::Status s = (*job)->Rewind(request.epoch()); !s.ok()) return ToGrpcStatus(s);
  *response = (*job)->Describe();
  return grpc::Status::OK;
}

grpc::Status SamplerService::DoResizeJob(absl::Time, const v1::ResizeJobRequest& request,
                                         v1::Job* response) {
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request.name());
  if (!job.ok()) return ToGrpcStatus(job.status());
  absl::StatusOr<v1::Job> resized = (*job)->Resize(request.epoch(), request.world_size());
  if (!resized.ok()) return ToGrpcStatus(resized.status());
  *response = *std::move(resized);
  return grpc::Status::OK;
}

grpc::Status SamplerService::DoSetGroupWeights(absl::Time,
                                               const v1::SetGroupWeightsRequest& request,
                                               v1::Job* response) {
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request.job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  absl::StatusOr<v1::Job> set = (*job)->SetGroupWeights(
      std::vector<double>(request.group_weights().begin(), request.group_weights().end()));
  if (!set.ok()) return ToGrpcStatus(set.status());
  if (absl::Status s = (*job)->Sync(); !s.ok()) return ToGrpcStatus(s);  // Durable first.
  for (uint64_t e : (*job)->RewindableEpochs()) set->add_rewindable_epochs(e);
  *response = *std::move(set);
  return grpc::Status::OK;
}

grpc::Status SamplerService::DoEndEpoch(absl::Time, const v1::EndEpochRequest& request,
                                        v1::EndEpochResponse* response) {
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request.job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  absl::StatusOr<v1::EndEpochResponse> r =
      (*job)->EndEpoch(request.epoch(), request.deal(), request.rank(), request.incarnation());
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status SamplerService::DoGetJobStatus(absl::Time, const v1::GetJobStatusRequest& request,
                                            v1::JobStatus* response) {
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request.name());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = (*job)->Status(request.weight_history());
  return grpc::Status::OK;
}

}  // namespace samplerd
