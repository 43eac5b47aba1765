// Kernels of mlp.h: one thread per output element, inputs summed in index order (deterministic).
#include <cuda_runtime.h>

#include <cstdint>

#include "examples/cpp/mlp.h"

namespace samplerd {
namespace examples {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(size_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__global__ void GatherKernel(const float* __restrict__ x, const uint32_t* __restrict__ y,
                             uint64_t num_rows, int features, const int64_t* __restrict__ indices,
                             size_t n, float* __restrict__ xb, uint32_t* __restrict__ yb,
                             int* __restrict__ bad_index) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n * features) return;
  const size_t k = i / features;
  const int f = static_cast<int>(i % features);
  const int64_t row = indices[k];
  const bool valid = row >= 0 && static_cast<uint64_t>(row) < num_rows;
  xb[i] = valid ? x[static_cast<size_t>(row) * features + f] : 0.0f;
  if (f == 0) {
    yb[k] = valid ? y[row] : 0;
    if (!valid) *bad_index = 1;
  }
}

__global__ void ForwardKernel(MlpShape shape, const float* __restrict__ params,
                              const float* __restrict__ x, size_t n, float* __restrict__ hidden) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n * shape.hidden) return;
  const size_t k = i / shape.hidden;
  const int h = static_cast<int>(i % shape.hidden);
  const float* w1 = params + shape.w1();
  float acc = params[shape.b1() + h];
  for (int f = 0; f < shape.features; ++f)
    acc += x[k * shape.features + f] * w1[f * shape.hidden + h];
  hidden[i] = acc > 0.0f ? acc : 0.0f;
}

// The logits of sample k into z[0, classes).
__device__ void Logits(const MlpShape& shape, const float* params, const float* hidden, size_t k,
                       float* z) {
  const float* w2 = params + shape.w2();
  for (int c = 0; c < shape.classes; ++c) z[c] = params[shape.b2() + c];
  for (int h = 0; h < shape.hidden; ++h) {
    const float a = hidden[k * shape.hidden + h];
    for (int c = 0; c < shape.classes; ++c) z[c] += a * w2[h * shape.classes + c];
  }
}

__global__ void LossKernel(MlpShape shape, const float* __restrict__ params,
                           const float* __restrict__ hidden, const uint32_t* __restrict__ labels,
                           size_t n, float* __restrict__ losses, float* __restrict__ dlogits) {
  const size_t k = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (k >= n) return;
  float z[kMaxClasses];
  Logits(shape, params, hidden, k, z);
  float top = z[0];
  for (int c = 1; c < shape.classes; ++c) top = fmaxf(top, z[c]);
  float total = 0.0f;
  for (int c = 0; c < shape.classes; ++c) total += expf(z[c] - top);
  const uint32_t label = labels[k];
  losses[k] = logf(total) + top - z[label];
  const float inv_n = 1.0f / static_cast<float>(n);
  for (int c = 0; c < shape.classes; ++c) {
    const float p = expf(z[c] - top) / total;
    dlogits[k * shape.classes + c] =
        (p - (static_cast<uint32_t>(c) == label ? 1.0f : 0.0f)) * inv_n;
  }
}

__global__ void PredictKernel(MlpShape shape, const float* __restrict__ params,
                              const float* __restrict__ hidden, size_t n,
                              uint32_t* __restrict__ predictions) {
  const size_t k = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (k >= n) return;
  float z[kMaxClasses];
  Logits(shape, params, hidden, k, z);
  uint32_t best = 0;
  for (int c = 1; c < shape.classes; ++c) {
    if (z[c] > z[best]) best = c;
  }
  predictions[k] = best;
}

// Gradients of W2 and b2: thread t < hidden * classes computes dW2[h, c]; the next `classes`
// threads db2[c].
__global__ void OutputGradKernel(MlpShape shape, const float* __restrict__ hidden,
                                 const float* __restrict__ dlogits, size_t n,
                                 float* __restrict__ grads) {
  const size_t t = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t weights = static_cast<size_t>(shape.hidden) * shape.classes;
  if (t >= weights + shape.classes) return;
  float acc = 0.0f;
  if (t < weights) {
    const int h = static_cast<int>(t / shape.classes);
    const int c = static_cast<int>(t % shape.classes);
    for (size_t k = 0; k < n; ++k)
      acc += hidden[k * shape.hidden + h] * dlogits[k * shape.classes + c];
    grads[shape.w2() + t] = acc;
  } else {
    const int c = static_cast<int>(t - weights);
    for (size_t k = 0; k < n; ++k) acc += dlogits[k * shape.classes + c];
    grads[shape.b2() + c] = acc;
  }
}

// dhidden[k, h] = relu'(hidden[k, h]) * sum_c dlogits[k, c] W2[h, c].
__global__ void HiddenGradKernel(MlpShape shape, const float* __restrict__ params,
                                 const float* __restrict__ hidden,
                                 const float* __restrict__ dlogits, size_t n,
                                 float* __restrict__ dhidden) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n * shape.hidden) return;
  const size_t k = i / shape.hidden;
  const int h = static_cast<int>(i % shape.hidden);
  float acc = 0.0f;
  if (hidden[i] > 0.0f) {
    const float* w2 = params + shape.w2();
    for (int c = 0; c < shape.classes; ++c)
      acc += dlogits[k * shape.classes + c] * w2[h * shape.classes + c];
  }
  dhidden[i] = acc;
}

// Gradients of W1 and b1: thread t < features * hidden computes dW1[f, h]; the next `hidden`
// threads db1[h].
__global__ void InputGradKernel(MlpShape shape, const float* __restrict__ x,
                                const float* __restrict__ dhidden, size_t n,
                                float* __restrict__ grads) {
  const size_t t = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t weights = static_cast<size_t>(shape.features) * shape.hidden;
  if (t >= weights + shape.hidden) return;
  float acc = 0.0f;
  if (t < weights) {
    const int f = static_cast<int>(t / shape.hidden);
    const int h = static_cast<int>(t % shape.hidden);
    for (size_t k = 0; k < n; ++k) acc += x[k * shape.features + f] * dhidden[k * shape.hidden + h];
    grads[shape.w1() + t] = acc;
  } else {
    const int h = static_cast<int>(t - weights);
    for (size_t k = 0; k < n; ++k) acc += dhidden[k * shape.hidden + h];
    grads[shape.b1() + h] = acc;
  }
}

__global__ void SgdKernel(float* __restrict__ params, const float* __restrict__ grads, size_t count,
                          float scale) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < count) params[i] -= scale * grads[i];
}

// One block: each thread sums a strided slice in index order, then a fixed tree.
__global__ void SumKernel(const float* __restrict__ values, size_t n, float* __restrict__ sum) {
  __shared__ float partial[kThreads];
  float acc = 0.0f;
  for (size_t i = threadIdx.x; i < n; i += kThreads) acc += values[i];
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) *sum = partial[0];
}

}  // namespace

cudaError_t GatherBatch(const float* x, const uint32_t* y, uint64_t num_rows, int features,
                        const int64_t* indices, size_t n, float* xb, uint32_t* yb, int* bad_index,
                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  GatherKernel<<<Blocks(n * features), kThreads, 0, stream>>>(x, y, num_rows, features, indices, n,
                                                              xb, yb, bad_index);
  return cudaGetLastError();
}

cudaError_t Forward(const MlpShape& shape, const float* params, const float* x, size_t n,
                    float* hidden, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ForwardKernel<<<Blocks(n * shape.hidden), kThreads, 0, stream>>>(shape, params, x, n, hidden);
  return cudaGetLastError();
}

cudaError_t LossAndLogitGrad(const MlpShape& shape, const float* params, const float* hidden,
                             const uint32_t* labels, size_t n, float* losses, float* dlogits,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (shape.classes < 1 || shape.classes > kMaxClasses) return cudaErrorInvalidValue;
  LossKernel<<<Blocks(n), kThreads, 0, stream>>>(shape, params, hidden, labels, n, losses, dlogits);
  return cudaGetLastError();
}

cudaError_t Predict(const MlpShape& shape, const float* params, const float* hidden, size_t n,
                    uint32_t* predictions, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (shape.classes < 1 || shape.classes > kMaxClasses) return cudaErrorInvalidValue;
  PredictKernel<<<Blocks(n), kThreads, 0, stream>>>(shape, params, hidden, n, predictions);
  return cudaGetLastError();
}

cudaError_t Backward(const MlpShape& shape, const float* params, const float* x,
                     const float* hidden, const float* dlogits, size_t n, float* dhidden,
                     float* grads, cudaStream_t stream) {
  const size_t output_threads = static_cast<size_t>(shape.hidden) * shape.classes + shape.classes;
  OutputGradKernel<<<Blocks(output_threads), kThreads, 0, stream>>>(shape, hidden, dlogits, n,
                                                                    grads);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (n > 0) {
    HiddenGradKernel<<<Blocks(n * shape.hidden), kThreads, 0, stream>>>(shape, params, hidden,
                                                                        dlogits, n, dhidden);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  const size_t input_threads = static_cast<size_t>(shape.features) * shape.hidden + shape.hidden;
  InputGradKernel<<<Blocks(input_threads), kThreads, 0, stream>>>(shape, x, dhidden, n, grads);
  return cudaGetLastError();
}

cudaError_t SgdUpdate(float* params, const float* grads, size_t count, float scale,
                      cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  SgdKernel<<<Blocks(count), kThreads, 0, stream>>>(params, grads, count, scale);
  return cudaGetLastError();
}

cudaError_t SumLosses(const float* losses, size_t n, float* sum, cudaStream_t stream) {
  SumKernel<<<1, kThreads, 0, stream>>>(losses, n, sum);
  return cudaGetLastError();
}

}  // namespace examples
}  // namespace samplerd
