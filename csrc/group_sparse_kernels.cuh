// Copyright 2026 The haste_hf Authors. Apache-2.0.
//
// Kernels of the group-shared fixed fan-in linear map (see haste_hf/sparse_ops.py for the math).
// Layouts: x [B, d], weight [K, G, F], supports [K, F] int32, out / grad_out [B, L = K * G].
//
// Two families:
//  * tensor-core kernels (bf16 / fp16, mma.sync m16n8k16, fp32 accumulators) for G % 16 == 0 and
//    F % 32 == 0 within the shared-memory envelope computed by the launcher;
//  * generic kernels (fp32 FFMA, any dtype, any G >= 1, F >= 1).
//
// The tensor-core kernels never stage the weights or the logit gradients in shared memory: their
// 16-byte loads go straight into mma fragments. This works because the order of a reduction axis
// inside an mma is free: each kernel picks the k-slot order that makes its 16-byte loads land in
// the fragment registers, and feeds the other operand in the same order (gathered rows through
// ldmatrix, or a register transpose through movmatrix).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace haste {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// Batch rows of the feature tile that the forward kernel keeps in shared memory.
constexpr int kFwdBatchTile = 64;
// Batch rows of the fp32 feature-gradient accumulator of one feature-gradient block.
constexpr int kBwdBatchTile = 32;
// Padding (elements) of shared-memory rows: spreads the rows that one instruction touches over the
// banks (16 bytes, one access width).
constexpr int kFwdRowPad = 8;
constexpr int kBwdRowPad = 4;

template <typename T> struct MmaType;
template <> struct MmaType<__nv_bfloat16> {
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ void unpack(uint32_t v, float& lo, float& hi) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
    lo = f.x;
    hi = f.y;
  }
};
template <> struct MmaType<__half> {
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ void unpack(uint32_t v, float& lo, float& hi) {
    const float2 f = __half22float2(*reinterpret_cast<__half2*>(&v));
    lo = f.x;
    hi = f.y;
  }
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half(v); }

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Named barrier (ids 1..15; 0 is __syncthreads): waits until `threads` threads have reached barrier
// `id`; shared-memory accesses before it are visible to all of them after it.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t v) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(v));
  return r;
}

// 16-byte (or 8-byte) global loads of packed 16-bit pairs, zero where `valid` is false.
template <int N> struct Pairs { uint32_t v[N]; };
template <int N>
__device__ __forceinline__ Pairs<N> load_pairs(const void* p, bool valid) {
  Pairs<N> r;
  if constexpr (N == 4) {
    uint4 u = valid ? __ldg(reinterpret_cast<const uint4*>(p)) : make_uint4(0, 0, 0, 0);
    r.v[0] = u.x; r.v[1] = u.y; r.v[2] = u.z; r.v[3] = u.w;
  } else {
    static_assert(N == 2, "8- or 16-byte loads only");
    uint2 u = valid ? __ldg(reinterpret_cast<const uint2*>(p)) : make_uint2(0, 0);
    r.v[0] = u.x; r.v[1] = u.y;
  }
  return r;
}

// Selects v[i] for a run-time i without indexing a register array (which would spill it).
__device__ __forceinline__ uint32_t select4(const uint32_t (&v)[4], int i) {
  uint32_t r = v[0];
  r = i == 1 ? v[1] : r;
  r = i == 2 ? v[2] : r;
  r = i == 3 ? v[3] : r;
  return r;
}

// Within each quad of lanes, lane t holds 32-bit pairs for column blocks 0..3 of one row
// (p[j] = columns 8j + 2t, 8j + 2t + 1). Afterwards lane t holds the 8 contiguous columns 8t..8t+7,
// ready for one 16-byte store.
__device__ __forceinline__ void quad_transpose(uint32_t (&p)[4], int lane) {
  const int t = lane & 3;
  uint32_t out[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const uint32_t sent = select4(p, t ^ r);
    const uint32_t got = __shfl_sync(0xffffffffu, sent, (lane & ~3) | (t ^ r));
#pragma unroll
    for (int s = 0; s < 4; ++s) out[s] = (s == (t ^ r)) ? got : (r == 0 ? 0u : out[s]);
  }
#pragma unroll
  for (int s = 0; s < 4; ++s) p[s] = out[s];
}

// ---------------------------------------------------------------------------------------------
// Losses of one logit z against a 0/1 target y, and their derivative in z (haste_hf/losses.py).
// ---------------------------------------------------------------------------------------------
enum LossKind : int { kBce = 0, kSquaredHinge = 1 };

__device__ __forceinline__ void loss_and_grad(int kind, float z, float y, float& loss, float& grad) {
  if (kind == kBce) {
    // softplus(z) - y z and sigmoid(z) - y from one exponential e = exp(-|z|) in (0, 1] (no overflow at
    // any z). log1p(e): the series to e^5 below 1/16 (relative error < e^5 / 6 < 2e-7), else the fast log
    // of 1 + e (absolute error 4e-7 on a value >= 0.06); the library log1pf costs registers the epilogue
    // spills. The fast reciprocal errs by 2 ulps, below the 16-bit gradient's rounding.
    const float e = __expf(-fabsf(z));
    const float t = 1.f + e;
    const float series = e * (1.f - e * (0.5f - e * (1.f / 3.f - e * (0.25f - e * 0.2f))));
    const float log1p_e = e < 0.0625f ? series : __logf(t);
    const float inverse = __fdividef(1.f, t);
    loss = fmaxf(z, 0.f) + log1p_e - y * z;
    grad = (z >= 0.f ? inverse : e * inverse) - y;
  } else {
    const float sign = 2.f * y - 1.f;
    const float margin = fmaxf(0.f, 1.f - sign * z);
    loss = margin * margin;
    grad = -2.f * sign * margin;
  }
}

template <typename T> __device__ __forceinline__ float round_to(float v) { return to_float(from_float<T>(v)); }

// What the forward kernel's epilogue does with its logits.
enum ForwardMode : int { kLogits = 0, kLoss = 1, kTopK = 2 };

struct EpilogueArgs {
  // kLoss: positives as bits [B][mask_words] (bit c of word w: column 32 w + c), the loss and its scale,
  // one fp64 partial sum per warp [gridDim.y][gridDim.x][kWarps].
  const uint32_t* positive_mask = nullptr;
  int64_t mask_words = 0;
  float scale = 1.f;
  int loss_kind = kBce;
  double* loss_partials = nullptr;
  // kLoss and kTopK: columns [0, valid_count) count, the later ones are padding slots.
  int64_t valid_count = 0;
  // kTopK: each warp's k best (score, column) of each row, [B][gridDim.y * kWarps][k].
  float* top_scores = nullptr;
  int64_t* top_ids = nullptr;
  int k = 0;
};

// ---------------------------------------------------------------------------------------------
// Forward, tensor cores. One block owns a batch tile of 64 rows and keeps x^T of that tile,
// [d][64 + pad], in shared memory for its whole life; its warps walk 32-label units (one group,
// half a group, or two groups of 16). Per unit and 32 features, lane (g, t) loads 16 bytes of
// weight row g (features 8t..8t+7), which are its B fragments for two k-steps once the k-slots are
// ordered as f(step, slot) below; the A fragments are the gathered rows x^T[I[f]] read by
// ldmatrix.trans with per-lane row addresses in that same order.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ int fwd_feature_of_slot(int step, int slot) {
  return 8 * ((slot & 7) >> 1) + 4 * step + 2 * (slot >> 3) + (slot & 1);
}

template <typename T, int GROUP_SPAN, int FC, int MODE>
__global__ void __launch_bounds__(kThreads, 2) forward_mma_kernel(
    const T* __restrict__ xt,          // [d][Bp], Bp a multiple of 64, zero padded
    const T* __restrict__ weight,      // [K][G][F]
    const int* __restrict__ supports,  // [K][F]
    const T* __restrict__ bias,        // [L] or nullptr
    T* __restrict__ out,               // [B][L]: logits (kLogits), their loss gradient (kLoss; nullptr: none)
    int B, int Bp, int d, int K, int G, int F, int64_t units_per_block, const EpilogueArgs ep) {
  // GROUP_SPAN = labels of one group inside a 32-label unit: 16 (two groups per unit) or 32.
  constexpr int kGroupsPerUnit = 32 / GROUP_SPAN;
  constexpr int kTilesPerGroup = GROUP_SPAN / 8;
  constexpr int kStride = kFwdBatchTile + kFwdRowPad;
  constexpr int kSub = FC / 32;  // 32-feature sub-chunks whose loads are issued together
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* xs = reinterpret_cast<T*>(smem_raw);

  const int batch_tile = blockIdx.x;
  const int b0 = batch_tile * kFwdBatchTile;
  for (int idx = threadIdx.x; idx < d * (kFwdBatchTile / 8); idx += blockDim.x) {
    const int row = idx / (kFwdBatchTile / 8), vec = idx % (kFwdBatchTile / 8);
    *reinterpret_cast<uint4*>(xs + row * kStride + vec * 8) =
        __ldg(reinterpret_cast<const uint4*>(xt + (int64_t)row * Bp + b0 + vec * 8));
  }
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t L = (int64_t)K * G;
  const int64_t num_units = (L + 31) / 32;
  const int64_t unit_begin = blockIdx.y * units_per_block;
  const int64_t unit_end = min(num_units, unit_begin + units_per_block);
  // ldmatrix.x4.trans lane roles: which k-slot row and which 8-row batch half this lane addresses.
  const int a_slot = (lane & 7) + 8 * (lane >> 4);
  const int a_moff = 8 * ((lane >> 3) & 1);
  const uint32_t xs_base = smem_addr(xs) + (uint32_t)a_moff * sizeof(T);

  // kLoss: this lane's loss terms, in a fixed order (reproducible sums).
  double lane_loss = 0.0;
  // kTopK: this warp's candidate list of each of the tile's rows, [B][gridDim.y * kWarps][k] in global
  // memory (insertions are rare once the lists fill), and in registers the list's lowest score of each
  // of the lane's 8 rows (rows mt * 16 + half * 8 + g), the bar a new candidate must pass.
  const int64_t list_count = (int64_t)gridDim.y * kWarps;
  const int64_t list = (int64_t)blockIdx.y * kWarps + warp;
  float bar[4][2];
  if constexpr (MODE == kTopK) {
    for (int i = lane; i < kFwdBatchTile * ep.k; i += 32) {
      const int row = b0 + i / ep.k;
      if (row < B) {
        const int64_t at = ((int64_t)row * list_count + list) * ep.k + i % ep.k;
        ep.top_scores[at] = -INFINITY;
        ep.top_ids[at] = -1;
      }
    }
    __syncwarp();
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) bar[mt][0] = bar[mt][1] = -INFINITY;
  }

  for (int64_t unit = unit_begin + warp; unit < unit_end; unit += kWarps) {
    const int64_t label0 = unit * 32;
    float acc[4][4][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;

    for (int f0 = 0; f0 < F; f0 += FC) {
      // All loads of this chunk first (weights from DRAM, supports from L2), then the math.
      uint32_t wfrag[kSub][4][4];
#pragma unroll
      for (int s = 0; s < kSub; ++s)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int64_t label = label0 + nt * 8 + g;
          Pairs<4> p = load_pairs<4>(weight + label * F + f0 + 32 * s + 8 * t, label < L);
#pragma unroll
          for (int i = 0; i < 4; ++i) wfrag[s][nt][i] = p.v[i];
        }
      int feature[kGroupsPerUnit][kSub][2];
#pragma unroll
      for (int gi = 0; gi < kGroupsPerUnit; ++gi) {
        const int64_t group = min((label0 + gi * GROUP_SPAN) / G, (int64_t)K - 1);
#pragma unroll
        for (int s = 0; s < kSub; ++s)
#pragma unroll
          for (int step = 0; step < 2; ++step)
            feature[gi][s][step] = __ldg(supports + group * F + f0 + 32 * s + fwd_feature_of_slot(step, a_slot));
      }
#pragma unroll
      for (int gi = 0; gi < kGroupsPerUnit; ++gi) {
        if ((label0 + gi * GROUP_SPAN) / G >= K) break;
#pragma unroll
        for (int s = 0; s < kSub; ++s)
#pragma unroll
          for (int step = 0; step < 2; ++step) {
            const uint32_t row_addr = xs_base + (uint32_t)(feature[gi][s][step] * kStride) * sizeof(T);
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) {
              uint32_t a[4];
              ldmatrix_x4_trans(a, row_addr + mt * 16 * sizeof(T));
#pragma unroll
              for (int j = 0; j < kTilesPerGroup; ++j) {
                const int nt = gi * kTilesPerGroup + j;
                if (nt < 4) MmaType<T>::mma(acc[mt][nt], a, wfrag[s][nt][2 * step], wfrag[s][nt][2 * step + 1]);
              }
            }
          }
      }
    }
    // Epilogue: bias, pack, quad transpose, 16-byte stores of 8 contiguous labels per lane.
    float bias_lo[4], bias_hi[4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int64_t pair = label0 + nt * 8 + 2 * t;  // labels pair, pair + 1: one 4-byte load
      const uint32_t packed =
          (bias != nullptr && pair < L) ? __ldg(reinterpret_cast<const unsigned int*>(bias + pair)) : 0u;
      MmaType<T>::unpack(packed, bias_lo[nt], bias_hi[nt]);
    }
    const int64_t store_label = label0 + 8 * t;
    float unit_loss = 0.f;
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = b0 + mt * 16 + half * 8 + g;
        uint32_t p[4];
        if constexpr (MODE == kLogits) {
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
            p[nt] = MmaType<T>::pack(acc[mt][nt][2 * half] + bias_lo[nt], acc[mt][nt][2 * half + 1] + bias_hi[nt]);
        } else {
          // The logit as the logits kernel would store it (rounded to T), then the loss or the ranking.
          // Lane (g, t) holds labels label0 + 8 nt + 2t + j of row `row`.
          float z[4][2];
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
            z[nt][0] = round_to<T>(acc[mt][nt][2 * half] + bias_lo[nt]);
            z[nt][1] = round_to<T>(acc[mt][nt][2 * half + 1] + bias_hi[nt]);
          }
          if constexpr (MODE == kLoss) {
            const uint32_t positives = row < B ? __ldg(ep.positive_mask + (int64_t)row * ep.mask_words + unit) : 0u;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
              float grad[2];
#pragma unroll
              for (int j = 0; j < 2; ++j) {
                const int column = nt * 8 + 2 * t + j;
                float term, derivative;
                loss_and_grad(ep.loss_kind, z[nt][j], (positives >> column) & 1u ? 1.f : 0.f, term, derivative);
                const bool counted = row < B && label0 + column < ep.valid_count;
                unit_loss += counted ? term : 0.f;
                grad[j] = counted ? derivative * ep.scale : 0.f;
              }
              p[nt] = MmaType<T>::pack(grad[0], grad[1]);
            }
          } else {
            bool candidate = false;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
              for (int j = 0; j < 2; ++j) {
                if (row >= B || label0 + nt * 8 + 2 * t + j >= ep.valid_count) z[nt][j] = -INFINITY;
                candidate |= z[nt][j] > bar[mt][half];
              }
            if (__any_sync(0xffffffffu, candidate)) {
              // The four lanes of a row take turns; each inserts those of its 8 logits that beat the bar.
              for (int turn = 0; turn < 4; ++turn) {
                if (t == turn && candidate) {
                  float* scores = ep.top_scores + ((int64_t)row * list_count + list) * ep.k;
                  int64_t* ids = ep.top_ids + ((int64_t)row * list_count + list) * ep.k;
#pragma unroll
                  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                    for (int j = 0; j < 2; ++j)
                      if (z[nt][j] > bar[mt][half]) {
                        int lowest = 0;
                        for (int e = 1; e < ep.k; ++e) lowest = scores[e] < scores[lowest] ? e : lowest;
                        scores[lowest] = z[nt][j];
                        ids[lowest] = label0 + nt * 8 + 2 * t + j;
                        float new_bar = scores[0];
                        for (int e = 1; e < ep.k; ++e) new_bar = fminf(new_bar, scores[e]);
                        bar[mt][half] = new_bar;
                      }
                }
                __syncwarp();
                bar[mt][half] = __shfl_sync(0xffffffffu, bar[mt][half], (lane & ~3) | turn);
              }
            }
          }
        }
        if constexpr (MODE != kTopK) {
          if (out != nullptr) {
            quad_transpose(p, lane);
            if (row < B && store_label < L)
              *reinterpret_cast<uint4*>(out + (int64_t)row * L + store_label) = make_uint4(p[0], p[1], p[2], p[3]);
          }
        }
      }
    }
    if constexpr (MODE == kLoss) lane_loss += (double)unit_loss;
  }
  if constexpr (MODE == kLoss) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) lane_loss += __shfl_xor_sync(0xffffffffu, lane_loss, offset);
    if (lane == 0) ep.loss_partials[((int64_t)blockIdx.y * gridDim.x + blockIdx.x) * kWarps + warp] = lane_loss;
  }
}

// ---------------------------------------------------------------------------------------------
// Weight gradient, tensor cores: grad_w[l, f] = sum_b grad_out[b, l] * x[b, I[f]].
// mma M = labels of a unit (LW = 16 or 32, inside one group), N = features (FN per pass), K = batch.
// Lane (g, t) loads 16 (8) bytes of a grad_out row: labels 8t.. (4t..) of that unit; movmatrix turns
// these into A fragments whose m-rows are the labels lambda_r(g) below. B fragments are 16-byte
// loads of the gathered rows x^T[I[f]], batch 8t..8t+7, which fixes the batch order of the k-slots;
// the grad_out rows loaded by each lane group follow that order.
// ---------------------------------------------------------------------------------------------
template <int LW>
__device__ __forceinline__ int wgrad_label_of_row(int r, int g) {
  return (LW / 4) * (g >> 1) + 2 * r + (g & 1);
}

template <typename T, int LW, int FN>
__global__ void __launch_bounds__(kThreads, 2) grad_weight_mma_kernel(
    const T* __restrict__ grad_out,    // [B][L]
    const T* __restrict__ xt,          // [d][Bp], Bp a multiple of 32, zero padded
    const int* __restrict__ supports,  // [K][F]
    T* __restrict__ grad_weight,       // [K][G][F]
    int B, int Bp, int K, int G, int F) {
  constexpr int kMTiles = LW / 16;      // 1 or 2
  constexpr int kRegsPerLoad = LW / 8;  // pairs per lane per grad_out row: 2 or 4
  constexpr int kNTiles = FN / 8;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t L = (int64_t)K * G;
  const int passes = F / FN;
  const int64_t num_units = (L / LW) * passes;
  const int64_t unit = (int64_t)blockIdx.x * kWarps + warp;
  if (unit >= num_units) return;
  const int64_t label0 = (unit / passes) * LW;
  const int f0 = (int)(unit % passes) * FN;
  const int64_t group = label0 / G;

  int feature[kNTiles];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) feature[nt] = __ldg(supports + group * F + f0 + nt * 8 + g);

  float acc[kMTiles][kNTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;

  // Operands of one 32-row batch chunk; the next chunk's loads are in flight while this one computes.
  struct Chunk {
    uint32_t b[kNTiles][4];
    Pairs<kRegsPerLoad> lo[2], hi[2];
  };
  auto load_chunk = [&](int bb, Chunk& c) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      Pairs<4> p = load_pairs<4>(xt + (int64_t)feature[nt] * Bp + bb + 8 * t, true);
#pragma unroll
      for (int i = 0; i < 4; ++i) c.b[nt][i] = p.v[i];
    }
#pragma unroll
    for (int step = 0; step < 2; ++step) {
      // Rows of the two 8-slot halves of this k-step, as ordered by the B fragments above.
      const int row_lo = bb + 8 * (g >> 1) + 4 * step + (g & 1);
      const int row_hi = row_lo + 2;
      c.lo[step] = load_pairs<kRegsPerLoad>(grad_out + (int64_t)row_lo * L + label0 + (LW / 4) * t, row_lo < B);
      c.hi[step] = load_pairs<kRegsPerLoad>(grad_out + (int64_t)row_hi * L + label0 + (LW / 4) * t, row_hi < B);
    }
  };
  Chunk cur, next;
  load_chunk(0, cur);
  for (int bb = 0; bb < B; bb += 32) {
    if (bb + 32 < B) load_chunk(bb + 32, next);
#pragma unroll
    for (int step = 0; step < 2; ++step) {
      uint32_t lo[kRegsPerLoad], hi[kRegsPerLoad];
#pragma unroll
      for (int r = 0; r < kRegsPerLoad; ++r) {
        lo[r] = movmatrix_trans(cur.lo[step].v[r]);
        hi[r] = movmatrix_trans(cur.hi[step].v[r]);
      }
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        const uint32_t a[4] = {lo[2 * mt], lo[2 * mt + 1], hi[2 * mt], hi[2 * mt + 1]};
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
          MmaType<T>::mma(acc[mt][nt], a, cur.b[nt][2 * step], cur.b[nt][2 * step + 1]);
      }
    }
    cur = next;
  }
  // Rows g / g + 8 of m-tile mt are labels lambda_{2mt}(g) / lambda_{2mt+1}(g); columns are
  // features f0 + 8 * nt + 2t (+1). Transpose within quads, then 16-byte stores per 32 features.
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t label = label0 + wgrad_label_of_row<LW>(2 * mt + half, g);
#pragma unroll
      for (int nq = 0; nq < kNTiles / 4; ++nq) {
        uint32_t p[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          p[j] = MmaType<T>::pack(acc[mt][nq * 4 + j][2 * half], acc[mt][nq * 4 + j][2 * half + 1]);
        quad_transpose(p, lane);
        *reinterpret_cast<uint4*>(grad_weight + label * F + f0 + nq * 32 + 8 * t) = make_uint4(p[0], p[1], p[2], p[3]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Feature gradient, tensor cores, split over groups: block (batch tile of 32 rows, run of groups)
// accumulates grad_x^T of its tile in shared memory, fp32 [d][32]; per group a warp computes
// grad_gathered = grad_out_k [32, G] x W_k [G, F] (M = batch, N = features, K = labels) and adds it
// at the support's rows of that accumulator.
//  * A fragments: 16 (8) byte loads of grad_out rows, labels 8t.. (4t..) of a chunk of LC labels;
//    the label order of the k-slots follows, and W rows are loaded in that order and transposed by
//    movmatrix into B fragments whose columns are features f0 + 8 * (c >> 1) + 2r + (c & 1).
//  * Batch rows: m-row g of m-tile mt, half h is batch row 4g + 2mt + h, so that lane (g, t) ends up
//    with 4 consecutive batch rows of each of its features: one 16-byte read-modify-write of the
//    accumulator each; rows are padded by 16 bytes so that the 4 features of a quarter warp mostly
//    fall on different banks.
//  * Ordering: warps add their tiles one after another in warp order, passing a token through named
//    barriers (a warp computes its next item while the others add), so a block's sums are free of
//    atomics and bitwise reproducible. Blocks then either add their tile to an fp32 grad_x^T with
//    atomics (fast) or write partial sums that a second kernel adds in split order (DETERMINISTIC).
// ---------------------------------------------------------------------------------------------
template <int LC>
__device__ __forceinline__ int dgrad_label_of_slot(int step, int slot) {
  // slot in 0..15 of k-step `step` of a chunk of LC labels.
  const int half = slot >> 3, s = slot & 7;
  return (LC / 4) * (s >> 1) + 4 * step + 2 * half + (s & 1);
}

template <typename T, int LC, bool DETERMINISTIC>
__global__ void __launch_bounds__(kThreads, 2) grad_input_mma_kernel(
    const T* __restrict__ grad_out,    // [B][L]
    const T* __restrict__ weight,      // [K][G][F]
    const int* __restrict__ supports,  // [K][F]
    float* __restrict__ grad_xt_acc,   // DETERMINISTIC: partials [splits][d][B]; else [d][B] accumulated
    int B, int d, int K, int G, int F, int groups_per_block) {
  constexpr int kSteps = LC / 16;
  constexpr int kRegsPerLoad = LC / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kRow = kBwdBatchTile + kBwdRowPad;
  float* acc_s = reinterpret_cast<float*>(smem_raw);  // [d][kRow]
  for (int i = threadIdx.x; i < d * kRow / 4; i += blockDim.x)
    reinterpret_cast<float4*>(acc_s)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t L = (int64_t)K * G;
  const int b0 = blockIdx.x * kBwdBatchTile;
  const int64_t group_begin = (int64_t)blockIdx.y * groups_per_block;
  const int64_t group_end = min((int64_t)K, group_begin + groups_per_block);
  const int rounds = (int)((group_end - group_begin + kWarps - 1) / kWarps);
  const int passes = F / 32;
  const int items = rounds * passes;  // (round, 32-feature pass) pairs, in order

  // Supports and the first label chunk's grad_out rows of an item, issued one item ahead: they are
  // in flight while the warp waits for its turn to add.
  int4 next_feature[2];
  Pairs<kRegsPerLoad> arow[2][2];
  auto load_item = [&](int item) {
    const int64_t group = group_begin + (int64_t)(item / passes) * kWarps + warp;
    const int f0 = (item % passes) * 32;
    if (group >= group_end) return;
    const int* sup = supports + group * F + f0 + 8 * t;
    next_feature[0] = __ldg(reinterpret_cast<const int4*>(sup));
    next_feature[1] = __ldg(reinterpret_cast<const int4*>(sup + 4));
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = b0 + 4 * g + 2 * mt + h;
        arow[mt][h] = load_pairs<kRegsPerLoad>(grad_out + (int64_t)row * L + group * G + (LC / 4) * t, row < B);
      }
  };
  if (items > 0) load_item(0);

  for (int item = 0; item < items; ++item) {
    const int64_t group = group_begin + (int64_t)(item / passes) * kWarps + warp;
    const int f0 = (item % passes) * 32;
    const bool active = group < group_end;
    const int4 feature[2] = {next_feature[0], next_feature[1]};
    float acc[2][4][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;
    if (active) {
      for (int c0 = 0; c0 < G; c0 += LC) {
        const int64_t label0 = group * G + c0;
        if (c0 > 0) {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int row = b0 + 4 * g + 2 * mt + h;
              arow[mt][h] = load_pairs<kRegsPerLoad>(grad_out + (int64_t)row * L + label0 + (LC / 4) * t, row < B);
            }
        }
#pragma unroll
        for (int step = 0; step < kSteps; ++step) {
          const Pairs<4> wlo = load_pairs<4>(weight + (label0 + dgrad_label_of_slot<LC>(step, g)) * F + f0 + 8 * t, true);
          const Pairs<4> whi =
              load_pairs<4>(weight + (label0 + dgrad_label_of_slot<LC>(step, 8 + g)) * F + f0 + 8 * t, true);
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const uint32_t blo = movmatrix_trans(wlo.v[r]), bhi = movmatrix_trans(whi.v[r]);
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              const uint32_t a[4] = {arow[mt][0].v[2 * step], arow[mt][1].v[2 * step], arow[mt][0].v[2 * step + 1],
                                     arow[mt][1].v[2 * step + 1]};
              MmaType<T>::mma(acc[mt][r], a, blo, bhi);
            }
          }
        }
      }
    }
    if (item + 1 < items) load_item(item + 1);
    // Warps add in a token ring: warp w meets warp w - 1 (warp 0 meets warp 7 of the previous item)
    // at barrier 1 + w once that one has added, adds, then meets warp w + 1; the others compute their
    // next item meanwhile. Both meetings go through one bar.sync instruction: compute-sanitizer's
    // synccheck rejects two warps meeting at a barrier from different instructions, and its racecheck
    // does not follow a chain of one-sided bar.arrive handoffs. Lane (g, t) adds rows 4g..4g+3 of
    // features f0 + 8t + 2r + e.
    const int f8[8] = {feature[0].x, feature[0].y, feature[0].z, feature[0].w,
                       feature[1].x, feature[1].y, feature[1].z, feature[1].w};
#pragma unroll 1
    for (int side = 0; side < 2; ++side) {
      const bool meet = side == 0 ? (item > 0 || warp > 0) : (item + 1 < items || warp + 1 < kWarps);
      if (meet) named_barrier_sync(1 + (warp + side) % kWarps, 64);
      if (side == 0 && active) {
        // A support has no repeated feature, so the 8 rows are distinct: all loads first, then all
        // stores, keeps the token's critical path at one shared-memory round trip.
        float4 v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = *reinterpret_cast<const float4*>(acc_s + f8[i] * kRow + 4 * g);
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float4& u = v[2 * r + e];
            u.x += acc[0][r][e];
            u.y += acc[0][r][2 + e];
            u.z += acc[1][r][e];
            u.w += acc[1][r][2 + e];
          }
#pragma unroll
        for (int i = 0; i < 8; ++i) *reinterpret_cast<float4*>(acc_s + f8[i] * kRow + 4 * g) = v[i];
      }
    }
  }
  __syncthreads();
  // grad_x^T rows of this tile: 32 floats per feature, coalesced.
  const int rows = min(kBwdBatchTile, B - b0);
  float* dst = DETERMINISTIC ? grad_xt_acc + (int64_t)blockIdx.y * d * B : grad_xt_acc;
  for (int i = threadIdx.x; i < d * kBwdBatchTile; i += blockDim.x) {
    const int feature = i / kBwdBatchTile, r = i % kBwdBatchTile;
    if (r >= rows) continue;
    const float v = acc_s[feature * kRow + r];
    float* target = dst + (int64_t)feature * B + b0 + r;
    if constexpr (DETERMINISTIC) *target = v;
    else if (v != 0.f) atomicAdd(target, v);
  }
}

// out[b, i] = sum over splits s of partial[s, i, b] in split order (deterministic); the transpose
// back to [B][d] happens here. Lanes run along the batch so the reads coalesce.
template <typename T>
__global__ void reduce_transpose_kernel(const float* __restrict__ partial, T* __restrict__ out, int splits, int B,
                                        int d) {
  const int64_t n = (int64_t)B * d;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t feature = i / B, b = i % B;
    float s = 0.f;
    for (int k = 0; k < splits; ++k) s += partial[(int64_t)k * n + i];
    out[b * d + feature] = from_float<T>(s);
  }
}

// ---------------------------------------------------------------------------------------------
// Generic kernels: fp32 FFMA, any G, F and dtype. Lanes run along the batch (x^T rows are
// contiguous in the batch, so the gather coalesces) or along the features.
// ---------------------------------------------------------------------------------------------
template <typename T>
__global__ void forward_generic_kernel(const T* __restrict__ xt, const T* __restrict__ weight,
                                       const int* __restrict__ supports, const T* __restrict__ bias,
                                       T* __restrict__ out, int B, int Bp, int K, int G, int F) {
  const int b = blockIdx.y * 32 + threadIdx.x;
  const int64_t L = (int64_t)K * G;
  const int64_t label = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  if (b >= B || label >= L) return;
  const int64_t group = label / G;
  const T* w = weight + label * F;
  const int* sup = supports + group * F;
  float s = bias != nullptr ? to_float(bias[label]) : 0.f;
  for (int f = 0; f < F; ++f) s += to_float(w[f]) * to_float(xt[(int64_t)sup[f] * Bp + b]);
  out[(int64_t)b * L + label] = from_float<T>(s);
}

template <typename T>
__global__ void grad_weight_generic_kernel(const T* __restrict__ grad_out, const T* __restrict__ x,
                                           const int* __restrict__ supports, T* __restrict__ grad_weight,
                                           int B, int d, int K, int G, int F) {
  const int f = blockIdx.y * 32 + threadIdx.x;
  const int64_t L = (int64_t)K * G;
  const int64_t label = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  if (f >= F || label >= L) return;
  const int feature = supports[(label / G) * F + f];
  float s = 0.f;
  for (int b = 0; b < B; ++b) s += to_float(grad_out[(int64_t)b * L + label]) * to_float(x[(int64_t)b * d + feature]);
  grad_weight[label * F + f] = from_float<T>(s);
}

// Atomic variant: one lane per (batch row, group, feature), adds into an fp32 [B][d] buffer.
template <typename T>
__global__ void grad_input_generic_kernel(const T* __restrict__ grad_out, const T* __restrict__ weight,
                                          const int* __restrict__ supports, float* __restrict__ grad_x,
                                          int B, int d, int K, int G, int F) {
  const int f = blockIdx.y * 32 + threadIdx.x;
  const int64_t group = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  const int b = blockIdx.z;
  if (f >= F || group >= K) return;
  const int64_t L = (int64_t)K * G;
  const T* dz = grad_out + (int64_t)b * L + group * G;
  const T* w = weight + group * G * F + f;
  float s = 0.f;
  for (int j = 0; j < G; ++j) s += to_float(dz[j]) * to_float(w[(int64_t)j * F]);
  atomicAdd(grad_x + (int64_t)b * d + supports[group * F + f], s);
}

// Deterministic variant: one lane per (batch row, feature) walks the (group, slot) pairs that use
// its feature in a fixed order (a CSR of the supports by feature), no atomics.
template <typename T>
__global__ void grad_input_generic_deterministic_kernel(const T* __restrict__ grad_out, const T* __restrict__ weight,
                                                        const int64_t* __restrict__ row_ptr,
                                                        const int64_t* __restrict__ entries,
                                                        T* __restrict__ grad_x, int B, int d, int K, int G, int F) {
  const int feature = blockIdx.x * 32 + threadIdx.x;
  const int b = blockIdx.y * blockDim.y + threadIdx.y;
  if (feature >= d || b >= B) return;
  const int64_t L = (int64_t)K * G;
  float s = 0.f;
  for (int64_t e = row_ptr[feature]; e < row_ptr[feature + 1]; ++e) {
    const int64_t group = entries[e] / F;
    const int f = (int)(entries[e] % F);
    const T* dz = grad_out + (int64_t)b * L + group * G;
    const T* w = weight + group * G * F + f;
    for (int j = 0; j < G; ++j) s += to_float(dz[j]) * to_float(w[(int64_t)j * F]);
  }
  grad_x[(int64_t)b * d + feature] = from_float<T>(s);
}

// ---------------------------------------------------------------------------------------------
// Loss from materialised logits (the dense head's cuBLAS output, or the tail off the tensor-core path).
// ---------------------------------------------------------------------------------------------

// Positive positions [B][P] (any order, repeats allowed) -> bits [B][words]; positions outside
// [0, valid_count) are not positives.
__global__ void positive_mask_kernel(const int64_t* __restrict__ positions, int64_t B, int64_t P,
                                     int64_t valid_count, uint32_t* __restrict__ mask, int64_t words) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= B * P) return;
  const int64_t position = positions[i];
  if (position >= 0 && position < valid_count)
    atomicOr(mask + (i / P) * words + position / 32, 1u << (position % 32));
}

constexpr int kLossThreads = 256;
constexpr int kLossItems = 8;  // columns per thread, kLossThreads apart (coalesced)

// Block (column block, row): the loss terms of kLossThreads * kLossItems logits of one row, summed in a
// fixed order into partials[row][column block]; the logits are overwritten by scale * their derivative
// (0 at columns >= valid_count) when `store` is set.
template <typename T>
__global__ void __launch_bounds__(kLossThreads) logits_loss_kernel(T* __restrict__ logits, const uint32_t* __restrict__ mask,
                                                                   int64_t words, int64_t n, int64_t valid_count,
                                                                   float scale, int loss_kind, bool store,
                                                                   double* __restrict__ partials) {
  const int64_t row = blockIdx.y;
  const int64_t first = (int64_t)blockIdx.x * kLossThreads * kLossItems + threadIdx.x;
  double local = 0.0;
#pragma unroll
  for (int i = 0; i < kLossItems; ++i) {
    const int64_t column = first + (int64_t)i * kLossThreads;
    if (column < n) {
      T* at = logits + row * n + column;
      const bool positive = (__ldg(mask + row * words + column / 32) >> (column % 32)) & 1u;
      float term, derivative;
      loss_and_grad(loss_kind, to_float(*at), positive ? 1.f : 0.f, term, derivative);
      const bool counted = column < valid_count;
      local += counted ? (double)term : 0.0;
      if (store) *at = from_float<T>(counted ? derivative * scale : 0.f);
    }
  }
  __shared__ double sums[kLossThreads];
  sums[threadIdx.x] = local;
  __syncthreads();
  for (int width = kLossThreads / 2; width > 0; width >>= 1) {
    if (threadIdx.x < width) sums[threadIdx.x] += sums[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[row * gridDim.x + blockIdx.x] = sums[0];
}

}  // namespace haste
