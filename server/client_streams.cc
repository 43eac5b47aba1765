#include "server/client_streams.h"

#include "absl/types/span.h"
#include "server/loss_batch.h"

namespace samplerd {

WeightsUpload MakeWeightsUpload(JobRegistry* registry, Caller caller, v1::UploadSummary* response) {
  return WeightsUpload(
      registry, std::move(caller), "weights",
      [](const v1::UploadWeightsChunk& c) -> const auto& { return c.weights(); },
      [](Job& job, std::vector<float> values) { return job.UploadWeights(std::move(values)); },
      response);
}

LabelsUpload MakeLabelsUpload(JobRegistry* registry, Caller caller, v1::UploadSummary* response) {
  return LabelsUpload(
      registry, std::move(caller), "labels",
      [](const v1::UploadLabelsChunk& c) -> const auto& { return c.labels(); },
      [](Job& job, std::vector<uint32_t> values) { return job.UploadLabels(values); }, response);
}

IrreducibleLossesUpload MakeIrreducibleLossesUpload(JobRegistry* registry, Caller caller,
                                                    v1::UploadSummary* response) {
  return IrreducibleLossesUpload(
      registry, std::move(caller), "irreducible_losses",
      [](const v1::UploadIrreducibleLossesChunk& c) -> const auto& { return c.losses(); },
      [](Job& job, std::vector<float> values) {
        return job.UploadIrreducibleLosses(std::move(values));
      },
      response);
}

std::optional<grpc::Status> LossStream::Add(const grpc::ByteBuffer& raw) {
  if (!parser_.Parse(raw, &batch_)) {
    if (absl::Status synced = Sync(); !synced.ok()) return ToGrpcStatus(synced);
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat(parser_.status().message(), "; batches before it applied: ", parser_.parsed(),
                     "; nothing after it was read")));
  }
  if (!job_ || job_->name() != batch_.job()) {
    if (absl::Status s = Sync(); !s.ok()) return ToGrpcStatus(s);
    if (absl::Status s = caller_.MayUseJob(batch_.job()); !s.ok()) return Failed(s);
    absl::StatusOr<std::shared_ptr<Job>> found = registry_->Get(batch_.job());
    if (!found.ok()) return ToGrpcStatus(found.status());
    job_ = *std::move(found);
  }
  const LossBatchView view = ViewOf(batch_);
  const v1::LossReportSummary before = *response_;
  if (absl::Status s = job_->ReportLosses(view, response_); !s.ok()) {
    if (absl::Status synced = Sync(); !synced.ok()) return ToGrpcStatus(synced);
    return Failed(s);
  }
  metrics_->CountLosses(batch_.job(), before, *response_);
  response_->set_batches(response_->batches() + 1);
  return std::nullopt;
}

grpc::Status LossStream::Failed(const absl::Status& s) const {
  return ToGrpcStatus(absl::Status(
      s.code(), absl::StrCat("batch seq = ", batch_.seq(), " of rank ", batch_.rank(), ": ",
                             s.message(), " (earlier batches of this stream were applied)")));
}

}  // namespace samplerd
