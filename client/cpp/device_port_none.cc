// The CPU-only implementation of the trainer library's device port (device_port.h): what
// //client/cpp:trainer_cpu links. No device: every device path says so, and nothing here needs a
// CUDA header or library. The CUDA twin is device_port_cuda.cc.
#include "client/cpp/device_port.h"

namespace samplerd {
namespace device_port {

absl::Status Available() {
  return absl::FailedPreconditionError(
      "this is the CPU-only trainer library (//client/cpp:trainer_cpu, libsamplerd_trainer): it "
      "has no device support; link //client/cpp:trainer (libsamplerd_trainer_cuda) for device "
      "memory");
}

absl::StatusOr<std::unique_ptr<Uploader>> NewUploader(int) { return Available(); }

absl::StatusOr<std::unique_ptr<LossStaging>> NewLossStaging(size_t, size_t) { return Available(); }

}  // namespace device_port
}  // namespace samplerd
