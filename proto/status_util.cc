#include "proto/status_util.h"

#include <string>

namespace samplerd {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string message(status.message());
  if (message.size() > kMaxErrorMessageBytes) {
    // Cut at a character boundary: job names are UTF-8, and gRPC clients decode the message.
    size_t cut = kMaxErrorMessageBytes - 3;
    while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
    message.resize(cut);
    message += "...";
  }
  // absl::StatusCode and grpc::StatusCode share the canonical numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), message);
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace samplerd
