// The client-streaming methods of samplerd.v1.Sampler, one message at a time, free of gRPC's
// call objects: UploadWeights and UploadLabels (UploadStream) and ReportLosses (LossStream).
// Each Stream processes one call: Add takes a raw message (a status: the call ends with it; a
// message that does not parse is INVALID_ARGUMENT naming its position), End the end of the
// stream. Each message's job must be one the call's Caller may use (PERMISSION_DENIED
// otherwise, with the effect of a message that does not parse). The ClientStreamReactor
// (client_stream_reactor.h) runs them on the WorkPool, one message at a time.
//
// Not thread-safe: one call's, used by one thread at a time.
#ifndef SAMPLERD_SERVER_CLIENT_STREAMS_H_
#define SAMPLERD_SERVER_CLIENT_STREAMS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/samplerd.pb.h"
#include "proto/status_util.h"
#include "server/auth/authorizer.h"
#include "server/job.h"
#include "server/job_registry.h"
#include "server/raw_request.h"
#include "server/service_metrics.h"

namespace samplerd {

// A chunked upload (weights or labels) into one vector of N values, applied at its end: nothing
// of it is applied unless all of it is. Chunks must name the same job and arrive in order
// (offset == values received so far).
template <typename Chunk, typename T>
class UploadStream {
 public:
  using Response = v1::UploadSummary;
  using ValuesOf = const google::protobuf::RepeatedField<T>& (*)(const Chunk&);
  // Applies the values to the job (Job::UploadWeights or UploadLabels).
  using Apply = absl::Status (*)(Job& job, std::vector<T> values);

  UploadStream(JobRegistry* registry, Caller caller, const char* field, ValuesOf values_of,
               Apply apply, Response* response)
      : registry_(registry),
        caller_(std::move(caller)),
        field_(field),
        values_of_(values_of),
        apply_(apply),
        response_(response) {}

  std::optional<grpc::Status> Add(const grpc::ByteBuffer& raw) {
    if (!parser_.Parse(raw, &chunk_)) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat(parser_.status().message(), "; nothing of the upload was applied")));
    }
    if (absl::Status s = Check(); !s.ok()) return ToGrpcStatus(s);
    const auto& v = values_of_(chunk_);
    values_.insert(values_.end(), v.begin(), v.end());
    return std::nullopt;
  }

  grpc::Status End() {
    if (parser_.parsed() == 0) {
      return ToGrpcStatus(
          absl::InvalidArgumentError(absl::StrCat(field_, ": empty upload stream")));
    }
    const uint64_t received = values_.size();
    if (absl::Status s = apply_(*job_, std::move(values_)); !s.ok()) return ToGrpcStatus(s);
    response_->set_received(received);
    return grpc::Status::OK;
  }

 private:
  absl::Status Check() {
    if (parser_.parsed() == 1) {
      name_ = chunk_.job();
      if (absl::Status s = caller_.MayUseJob(name_); !s.ok()) return s;
      absl::StatusOr<std::shared_ptr<Job>> found = registry_->Get(name_);
      if (!found.ok()) return found.status();
      job_ = *std::move(found);
    } else if (chunk_.job() != name_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job = \"", chunk_.job(), "\" differs from the stream's first chunk \"", name_, "\""));
    }
    if (chunk_.offset() != values_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "offset = ", chunk_.offset(), ": chunks must be contiguous; expected ", values_.size()));
    }
    const uint64_t n = job_->config().plan.num_samples;
    const uint64_t after = values_.size() + values_of_(chunk_).size();
    if (after > n) {
      return absl::InvalidArgumentError(
          absl::StrCat(field_, ": ", after, " values for num_samples ", n));
    }
    return absl::OkStatus();
  }

  JobRegistry* const registry_;
  const Caller caller_;
  const char* const field_;
  const ValuesOf values_of_;
  const Apply apply_;
  Response* const response_;
  RequestStreamParser parser_;
  Chunk chunk_;
  std::string name_;
  std::shared_ptr<Job> job_;
  std::vector<T> values_;
};

using WeightsUpload = UploadStream<v1::UploadWeightsChunk, float>;
using LabelsUpload = UploadStream<v1::UploadLabelsChunk, uint32_t>;

// An UploadWeights call (Job::UploadWeights) / an UploadLabels call (Job::UploadLabels).
WeightsUpload MakeWeightsUpload(JobRegistry* registry, Caller caller, v1::UploadSummary* response);
LabelsUpload MakeLabelsUpload(JobRegistry* registry, Caller caller, v1::UploadSummary* response);

// A ReportLosses call: each batch applied as it arrives (Job::ReportLosses, which checks the
// batch's rank claim). The summary acknowledges the batches: they are made durable first (one
// sync per job and call, not per batch); it counts the batches processed in batches(). So is
// what an error keeps: the batches before it were applied, and made durable.
class LossStream {
 public:
  using Response = v1::LossReportSummary;

  // `registry`, `metrics` and `response` must outlive the stream.
  LossStream(JobRegistry* registry, ServiceMetrics* metrics, Caller caller, Response* response)
      : registry_(registry), metrics_(metrics), caller_(std::move(caller)), response_(response) {}

  std::optional<grpc::Status> Add(const grpc::ByteBuffer& raw);
  grpc::Status End() { return ToGrpcStatus(Sync()); }

 private:
  absl::Status Sync() { return job_ ? job_->Sync() : absl::OkStatus(); }
  // `s`, naming the batch that failed.
  grpc::Status Failed(const absl::Status& s) const;

  JobRegistry* const registry_;
  ServiceMetrics* const metrics_;
  const Caller caller_;
  Response* const response_;
  RequestStreamParser parser_;
  v1::LossBatch batch_;
  std::shared_ptr<Job> job_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_CLIENT_STREAMS_H_
