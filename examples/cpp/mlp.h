// A two-layer perceptron (features -> ReLU hidden -> softmax over classes) trained with plain
// SGD, as CUDA kernels: the model of the C++ DDP trainer example (ddp_trainer.cc).
//
// Plain C++ over the CUDA runtime (no Abseil), so that nvcc compiles the kernels without the
// workspace's host libraries. Every function only enqueues work on `stream` and returns the
// launch's error (cudaGetLastError after the launch); none synchronises.
//
// Determinism: no atomics and no reduction whose order depends on scheduling. Every output
// element is computed by one thread that loops over its inputs in index order (the batch sums of
// the gradients included), so two runs with the same data, seed and indices produce the same
// bits. The sizes are small (tens of features, a hidden layer of ~64, a few classes, batches of
// hundreds): these loops cost microseconds, not enough to need cuBLAS, which /usr/local/cuda
// ships only as shared libraries of several hundred MB (too large to carry to the GPU machine).
#ifndef SAMPLERD_EXAMPLES_CPP_MLP_H_
#define SAMPLERD_EXAMPLES_CPP_MLP_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

// The layout accessors run on the host and in the kernels.
#if defined(__CUDACC__)
#define SAMPLERD_MLP_HD __host__ __device__
#else
#define SAMPLERD_MLP_HD
#endif

namespace samplerd {
namespace examples {

// Most classes a model may have: the loss kernel keeps one sample's logits in registers.
inline constexpr int kMaxClasses = 64;

// The model's sizes and the layout of its parameters in one contiguous float array (so that one
// ncclAllReduce sums every gradient): W1 [features x hidden], b1 [hidden], W2 [hidden x classes],
// b2 [classes], each row-major.
struct MlpShape {
  int features = 0;
  int hidden = 0;
  int classes = 0;

  SAMPLERD_MLP_HD size_t w1() const { return 0; }
  SAMPLERD_MLP_HD size_t b1() const { return w1() + static_cast<size_t>(features) * hidden; }
  SAMPLERD_MLP_HD size_t w2() const { return b1() + hidden; }
  SAMPLERD_MLP_HD size_t b2() const { return w2() + static_cast<size_t>(hidden) * classes; }
  SAMPLERD_MLP_HD size_t param_count() const { return b2() + classes; }
};

// xb[k, :] = x[indices[k], :] and yb[k] = y[indices[k]] for k < n (x: num_rows x features,
// row-major). An index >= num_rows is not read: its row is zeroed, its label set to 0, and
// *bad_index set to 1 (the caller checks the flag; the server never sends such an index).
cudaError_t GatherBatch(const float* x, const uint32_t* y, uint64_t num_rows, int features,
                        const int64_t* indices, size_t n, float* xb, uint32_t* yb, int* bad_index,
                        cudaStream_t stream);

// hidden[k, :] = relu(x[k, :] W1 + b1) for k < n.
cudaError_t Forward(const MlpShape& shape, const float* params, const float* x, size_t n,
                    float* hidden, cudaStream_t stream);

// Per-sample cross-entropy losses[k] = logsumexp(z_k) - z_k[labels[k]] of the logits
// z_k = hidden[k, :] W2 + b2, and the gradient of the batch's mean loss with respect to the
// logits: dlogits[k, c] = (softmax(z_k)_c - [c == labels[k]]) / n. Labels must be < classes.
cudaError_t LossAndLogitGrad(const MlpShape& shape, const float* params, const float* hidden,
                             const uint32_t* labels, size_t n, float* losses, float* dlogits,
                             cudaStream_t stream);

// predictions[k] = argmax_c z_k[c] (the lowest c on ties).
cudaError_t Predict(const MlpShape& shape, const float* params, const float* hidden, size_t n,
                    uint32_t* predictions, cudaStream_t stream);

// grads = d(mean loss)/d(params) from the forward pass's x and hidden and LossAndLogitGrad's
// dlogits; dhidden is scratch of n x hidden floats. Overwrites grads (param_count floats).
cudaError_t Backward(const MlpShape& shape, const float* params, const float* x,
                     const float* hidden, const float* dlogits, size_t n, float* dhidden,
                     float* grads, cudaStream_t stream);

// params[i] -= scale * grads[i] for i < count (scale: learning rate / world size, as the
// gradients arrive summed over the ranks).
cudaError_t SgdUpdate(float* params, const float* grads, size_t count, float scale,
                      cudaStream_t stream);

// *sum = losses[0] + ... + losses[n - 1], in a fixed tree order (one block).
cudaError_t SumLosses(const float* losses, size_t n, float* sum, cudaStream_t stream);

}  // namespace examples
}  // namespace samplerd

#endif  // SAMPLERD_EXAMPLES_CPP_MLP_H_
