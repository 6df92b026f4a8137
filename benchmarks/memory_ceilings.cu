// Copyright 2026 The haste_hf Authors. Apache-2.0.
//
// Measures the memory ceilings that bound the group-sparse tail kernels on this GPU, for
// benchmarks/kernel_floors.py: device-memory copy; writes and reads of a [B, L] bf16 tensor by the
// bytes each warp instruction covers in a row (8 warps of a block side by side); 16-byte gathers
// from an L2-resident x^T; 16-byte read-modify-writes of an fp32 shared-memory accumulator; fp32
// reductions into an L2-resident buffer.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o memory_ceilings benchmarks/memory_ceilings.cu
//   ./memory_ceilings
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(call)                                                                        \
  do {                                                                                     \
    cudaError_t err = (call);                                                              \
    if (err != cudaSuccess) {                                                              \
      std::printf("%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err));             \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

__device__ __forceinline__ uint32_t mix(uint32_t x) {
  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
  return x;
}

__global__ void copy_kernel(const uint4* src, uint4* dst, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) dst[i] = src[i];
}

// Blocks walk (label span, batch tile) tiles; a warp instruction covers CHUNK16 16-byte vectors of
// each of 32 / CHUNK16 rows, and the 8 warps of a block cover 8 adjacent label spans.
template <int CHUNK16, bool WRITE>
__global__ void rows_kernel(uint4* buf, int64_t L, int B, uint4* sink) {
  constexpr int kRowsPerTile = 64, kRowsPerInstr = 32 / CHUNK16;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t block_span = CHUNK16 * 8 * 8, label_tiles = L / block_span, batch_tiles = B / kRowsPerTile;
  uint4 acc = make_uint4(0, 0, 0, 0);
  const uint4 v = make_uint4(lane, 1, 2, 3);
  for (int64_t tile = blockIdx.x; tile < label_tiles * batch_tiles; tile += gridDim.x) {
    const int64_t label = (tile / batch_tiles) * block_span + warp * CHUNK16 * 8 + (lane % CHUNK16) * 8;
    const int64_t row0 = (tile % batch_tiles) * kRowsPerTile + lane / CHUNK16;
#pragma unroll 4
    for (int r = 0; r < kRowsPerTile; r += kRowsPerInstr) {
      uint4* p = buf + ((row0 + r) * L + label) / 8;
      if (WRITE) {
        *p = v;
      } else {
        const uint4 u = __ldg(p);
        acc.x ^= u.x;
        acc.y ^= u.y;
      }
    }
  }
  if (!WRITE && acc.x == 0x9e3779b9u) *sink = acc;
}

// Each quad of lanes reads 64 contiguous bytes of a random row of x^T [rows][row16 * 16 bytes].
__global__ void gather_kernel(const uint4* src, int rows, int row16, int iters, uint4* sink) {
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x & 31;
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (int i = 0; i < iters; i += 4) {
    uint4 v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      v[j] = __ldg(src + (size_t)(mix((tid >> 2) * 977u + i + j) % rows) * row16 + (lane & 3) + 4 * ((i + j) % (row16 / 4)));
#pragma unroll
    for (int j = 0; j < 4; ++j) acc.x ^= v[j].x;
  }
  if (acc.x == 0x9e3779b9u) sink[tid] = acc;
}

// fp32 accumulator [d][36] as in the feature gradient. PATTERN 0: each warp updates its own
// contiguous 512 bytes (conflict-free, no ordering); 1: random feature rows, warps in turns between
// barriers (the feature gradient's scheme); 2: random feature rows, shared-memory atomicAdd.
template <int PATTERN>
__global__ void shared_rmw_kernel(int iters, int d, float* sink) {
  constexpr int kRow = 36;
  extern __shared__ float acc[];
  for (int i = threadIdx.x; i < d * kRow; i += blockDim.x) acc[i] = 0.f;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  for (int it = 0; it < iters; ++it) {
    int offset[8];
#pragma unroll
    for (int e = 0; e < 8; ++e)
      offset[e] = PATTERN == 0 ? ((warp * 8 + e + it) % (d * kRow / 128)) * 128 + lane * 4
                               : (int)(mix(blockIdx.x * 7919u + it * 64 + warp * 8 + e + 977 * t) % d) * kRow + 4 * g;
    if (PATTERN == 1) {
      for (int w = 0; w < 8; ++w) {
        if (w == warp) {
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            float4* p = reinterpret_cast<float4*>(acc + offset[e]);
            float4 v = *p;
            v.x += 1.f; v.y += 1.f; v.z += 1.f; v.w += 1.f;
            *p = v;
          }
        }
        __syncthreads();
      }
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float* p = acc + offset[e];
        if (PATTERN == 0) {
          float4 v = *reinterpret_cast<float4*>(p);
          v.x += 1.f; v.y += 1.f; v.z += 1.f; v.w += 1.f;
          *reinterpret_cast<float4*>(p) = v;
        } else {
#pragma unroll
          for (int k = 0; k < 4; ++k) atomicAdd(p + k, 1.f);
        }
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) sink[blockIdx.x] = acc[lane];
}

// 16-byte fp32 reductions into an L2-resident buffer: a warp covers 512 contiguous bytes (COALESCED)
// or each lane a random 16-byte slot.
template <bool COALESCED>
__global__ void reduce_kernel(float* buf, int slots16, int iters) {
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x & 31;
  for (int i = 0; i < iters; ++i) {
    const uint32_t slot = COALESCED ? (mix((tid >> 5) * 131u + i) % (slots16 / 32)) * 32 + lane : mix(tid * 131u + i) % slots16;
    float* p = buf + 4 * (size_t)slot;
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(1.f), "f"(2.f), "f"(3.f), "f"(4.f) : "memory");
  }
}

template <typename Launch>
float median_ms(Launch launch, int repeats = 11) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  launch();
  CHECK(cudaDeviceSynchronize());
  std::vector<float> times;
  for (int i = 0; i < repeats; ++i) {
    CHECK(cudaEventRecord(start));
    launch();
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  CHECK(cudaGetLastError());
  std::sort(times.begin(), times.end());
  return times[repeats / 2];
}

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("# %s, %d SMs, memory ceilings (medians of 11 runs)\n", prop.name, sms);

  const size_t copy_bytes = size_t(2) << 30;
  uint4 *a, *b, *sink;
  CHECK(cudaMalloc(&a, copy_bytes));
  CHECK(cudaMalloc(&b, copy_bytes));
  CHECK(cudaMalloc(&sink, 64 << 20));
  CHECK(cudaMemset(a, 1, copy_bytes));
  float ms = median_ms([&] { copy_kernel<<<sms * 8, 256>>>(a, b, copy_bytes / 16); });
  std::printf("%-58s %8.2f TB/s\n", "device copy (bytes read + written)", 2.0 * copy_bytes / ms / 1e9);

  const int B = 512;
  const int64_t L = 2752512;  // a multiple of every block span below
  uint4* rows;
  CHECK(cudaMalloc(&rows, size_t(B) * L * 2));
  CHECK(cudaMemset(rows, 1, size_t(B) * L * 2));
  const double row_bytes = double(B) * L * 2;
  const int chunk_bytes[] = {32, 64, 128, 512};
  const float writes[] = {
      median_ms([&] { rows_kernel<2, true><<<sms * 2, 256>>>(rows, L, B, sink); }),
      median_ms([&] { rows_kernel<4, true><<<sms * 2, 256>>>(rows, L, B, sink); }),
      median_ms([&] { rows_kernel<8, true><<<sms * 2, 256>>>(rows, L, B, sink); }),
      median_ms([&] { rows_kernel<32, true><<<sms * 2, 256>>>(rows, L, B, sink); })};
  const float reads[] = {
      median_ms([&] { rows_kernel<2, false><<<sms * 2, 256>>>(rows, L, B, sink); }),
      median_ms([&] { rows_kernel<4, false><<<sms * 2, 256>>>(rows, L, B, sink); }),
      median_ms([&] { rows_kernel<8, false><<<sms * 2, 256>>>(rows, L, B, sink); }),
      median_ms([&] { rows_kernel<32, false><<<sms * 2, 256>>>(rows, L, B, sink); })};
  for (int i = 0; i < 4; ++i) {
    char label[96];
    std::snprintf(label, sizeof label, "[B, L] bf16, %3d B of a row per warp instruction: write", chunk_bytes[i]);
    std::printf("%-58s %8.2f TB/s\n", label, row_bytes / writes[i] / 1e9);
    std::snprintf(label, sizeof label, "[B, L] bf16, %3d B of a row per warp instruction: read", chunk_bytes[i]);
    std::printf("%-58s %8.2f TB/s\n", label, row_bytes / reads[i] / 1e9);
  }

  const int gather_iters = 512;
  ms = median_ms([&] { gather_kernel<<<sms * 8, 256>>>(a, 768, 1024 / 16, gather_iters, sink); });
  std::printf("%-58s %8.2f TB/s\n", "16-byte gathers from x^T [768][512] bf16 (L2)",
              double(sms) * 8 * 256 * gather_iters * 16 / ms / 1e9);

  const int d = 768, smem = d * 36 * 4, rmw_iters = 200;
  CHECK(cudaFuncSetAttribute(shared_rmw_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute(shared_rmw_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute(shared_rmw_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const double floats = double(sms) * 2 * 256 * rmw_iters * 8 * 4;
  const char* rmw_names[] = {"shared fp32 16-byte RMW, conflict-free, no ordering",
                             "shared fp32 16-byte RMW, random rows, warps in turns",
                             "shared fp32 atomicAdd, random rows"};
  const float rmw[] = {
      median_ms([&] { shared_rmw_kernel<0><<<sms * 2, 256, smem>>>(rmw_iters, d, reinterpret_cast<float*>(sink)); }),
      median_ms([&] { shared_rmw_kernel<1><<<sms * 2, 256, smem>>>(rmw_iters, d, reinterpret_cast<float*>(sink)); }),
      median_ms([&] { shared_rmw_kernel<2><<<sms * 2, 256, smem>>>(rmw_iters, d, reinterpret_cast<float*>(sink)); })};
  for (int i = 0; i < 3; ++i) std::printf("%-58s %8.1f G floats/s\n", rmw_names[i], floats / rmw[i] / 1e6);

  float* acc;
  const int slots16 = 768 * 512 / 4, red_iters = 256;
  CHECK(cudaMalloc(&acc, 768 * 512 * 4));
  CHECK(cudaMemset(acc, 0, 768 * 512 * 4));
  const double reds = double(sms) * 8 * 256 * red_iters * 4;
  ms = median_ms([&] { reduce_kernel<true><<<sms * 8, 256>>>(acc, slots16, red_iters); });
  std::printf("%-58s %8.1f G floats/s\n", "red.global.add.v4.f32, 512 B per warp (L2)", reds / ms / 1e6);
  ms = median_ms([&] { reduce_kernel<false><<<sms * 8, 256>>>(acc, slots16, red_iters); });
  std::printf("%-58s %8.1f G floats/s\n", "red.global.add.v4.f32, random 16-byte slots (L2)", reds / ms / 1e6);
  return 0;
}
