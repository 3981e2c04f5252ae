// --micro-batch auto's choice as a pure function of its bounds, and the reading of the CPU's
// memory bounds (MemAvailable, the cgroup limit, ulimit -v).
//
// The choice is the largest B that satisfies every bound: the predicted peak (the caller's
// function, parallel/memory_model.h) within the usable memory, at most the windows of the data
// per rank (a larger B cannot make one global micro-batch), and at most the throughput cap (on
// the CPU, kCpuAutoTokens tokens per micro-batch: past that the matmuls are already large
// enough that tokens/s stops rising, while memory and step time keep growing). The usable
// memory is the budget itself when the user gave --memory, else the tightest measured bound
// less kAutoHeadroomFrac of it and kAutoOverheadBytes (the allocator's, MPI's and the
// libraries' memory the predictor does not count). The result names the bound that won.
// Thread-safe (reads /proc and /sys only).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace shardgpt {

// The share of a measured memory bound left free, and the bytes set aside besides.
constexpr double kAutoHeadroomFrac = 0.10;
constexpr double kAutoOverheadBytes = 64.0 * 1024 * 1024;
// The CPU's throughput cap: tokens per micro-batch (B x T).
constexpr int kCpuAutoTokens = 16384;

// A memory bound in bytes and where it comes from ("MemAvailable in /proc/meminfo").
struct MemoryBound {
  double bytes = 0;
  std::string source;
};

// The CPU's bounds on what this process may still allocate: MemAvailable; the tightest cgroup
// limit of this process's cgroup (/proc/self/cgroup) and its ancestors, v2 memory.max less
// memory.current or v1 memory.limit_in_bytes less memory.usage_in_bytes (no limit: none);
// RLIMIT_AS (ulimit -v) less the process's VmSize. `root` prefixes every path (tests; the
// RLIMIT_AS bound only without one); the ones that cannot be read are left out.
std::vector<MemoryBound> CpuMemoryBounds(const std::string& root = "");

struct AutoBatchLimits {
  std::vector<MemoryBound> memory;  // per rank; the smallest counts
  bool measured = true;             // false: --memory, taken as given (no headroom)
  uint64_t max_by_data = 0;         // windows per rank; 0: not known
  int cap = 0;                      // throughput cap on B; 0: none
  std::string cap_reason;           // what the cap is ("16384 tokens per micro-batch on the CPU")
};

struct AutoBatchChoice {
  int micro_batch = 0;   // 0: not even B = 1 fits in the usable memory
  std::string bound;     // "memory", "data" or "throughput cap": what stopped B from growing
  double usable_bytes = 0;
  std::string memory_source;  // the tightest memory bound's source
  std::string line;      // one line saying the choice and why it stopped
};

// The largest B <= max_b within every limit; peak(B) is the predicted peak, increasing in B.
AutoBatchChoice ChooseAutoMicroBatch(const AutoBatchLimits& limits, const std::function<double(int)>& peak,
                                     int max_b = 1 << 16);

}  // namespace shardgpt
