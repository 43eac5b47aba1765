// The device side of the trainer library as its CPU-only core sees it: a port, the way LevelDB's
// port/ and Reverb's platform/ keep platform code away from portable code. ShardReader,
// LossReporter and EpochLoop are portable C++ over host memory; their device paths
// (ShardReader::NextToDevice, LossReporter::ReportFromDevice, EpochLoop's device delivery) reach
// a device only through the functions below. They have two implementations, and the library a
// trainer links chooses one:
//
//   //client/cpp:trainer      device_port_cuda.cc: the CUDA runtime (DeviceUploader, pinned
//                             staging buffers, events: client/cpp/cuda_support.h). Installed as
//                             libsamplerd_trainer_cuda.a (tools/install_trainer_lib.sh --cuda).
//   //client/cpp:trainer_cpu  device_port_none.cc: no device; every function below returns
//                             FAILED_PRECONDITION saying so. Builds and links without any CUDA
//                             header or library. Installed as libsamplerd_trainer.a.
//
// A binary links exactly one of them (both define these functions). No CUDA header is included
// here or by the core's headers: a stream is a DeviceStream, which is the CUDA runtime's own
// cudaStream_t (`struct CUstream_st*`, driver_types.h) declared without it, so a trainer passes
// its cudaStream_t (or nullptr, the legacy default stream) unchanged. device_port_cuda.cc checks
// at compile time that the two types are the same.
//
// Thread safety: Available() and the factories may be called from any thread; each object is
// used by one thread at a time (see each class).
#ifndef SAMPLERD_CLIENT_CPP_DEVICE_PORT_H_
#define SAMPLERD_CLIENT_CPP_DEVICE_PORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct CUstream_st;  // The CUDA runtime's stream; only ever used through a pointer.

namespace samplerd {

// A CUDA stream (cudaStream_t) as the CPU-only headers name it.
using DeviceStream = CUstream_st*;

namespace device_port {

// OK if a usable device is present; otherwise FAILED_PRECONDITION saying why (the CUDA runtime's
// message, or that the library was built without device support). Cheap after the first call.
absl::Status Available();

// Host arrays into device memory on the caller's stream, through pinned staging buffers: the
// contract of DeviceUploader (client/cpp/device_uploader.h). One thread at a time; the destructor
// waits for the copies still in flight.
class Uploader {
 public:
  virtual ~Uploader() = default;
  // Copies `bytes` from host memory `src` (free to reuse when this returns) to device memory
  // `dst`, enqueued on `stream`. The CUDA runtime's error if staging or enqueueing fails.
  virtual absl::Status Upload(const void* src, size_t bytes, void* dst, DeviceStream stream) = 0;
};

// An Uploader with `slots` (>= 1) staging buffers. FAILED_PRECONDITION as Available() without a
// usable device.
absl::StatusOr<std::unique_ptr<Uploader>> NewUploader(int slots);

// Staging of device pairs (int64 indices, float losses) copied back to host memory: `slots`
// page-locked slots of `slot_pairs` pairs, each with a fence recorded on the caller's stream
// behind its copies. LossReporter's ReportFromDevice enqueues into a free slot under its lock and
// its device thread awaits the slots in order; a slot is reused only after Await returned.
// The destructor requires that no enqueued copy is still un-awaited.
class LossStaging {
 public:
  virtual ~LossStaging() = default;
  // Enqueues on `stream` the copies of n <= slot_pairs pairs into slot `slot`, then its fence.
  // On failure returns the CUDA runtime's error (`what` names the call in it) and sets *fenced
  // to whether the fence could still be recorded: if so, Await(slot) waits for whatever copies
  // were enqueued before the failure; if not, the slot must never be reused.
  virtual absl::Status Enqueue(size_t slot, const int64_t* d_indices, const float* d_losses,
                               size_t n, DeviceStream stream, bool* fenced) = 0;
  // Waits (sleeping, not spinning) until slot `slot`'s copies have landed. The CUDA runtime's
  // error if they failed. Call from a thread bound with BindThread.
  virtual absl::Status Await(size_t slot) = 0;
  // Slot `slot`'s host arrays (slot_pairs entries; the pairs of its last Enqueue after Await).
  virtual const uint64_t* indices(size_t slot) const = 0;  // The int64 indices' bits.
  virtual const float* losses(size_t slot) const = 0;
  // Makes the calling thread use the device the staging was made on (a new thread starts on
  // device 0).
  virtual void BindThread() = 0;
};

// LossStaging on the device current at the call. FAILED_PRECONDITION as Available() without a
// usable device; the CUDA runtime's error if the pinned buffers or the fences cannot be made.
absl::StatusOr<std::unique_ptr<LossStaging>> NewLossStaging(size_t slots, size_t slot_pairs);

}  // namespace device_port
}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_CPP_DEVICE_PORT_H_
