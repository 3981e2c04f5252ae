// --micro-batch auto's choice (app/auto_micro_batch.h): which bound wins, from the bounds
// alone (no device, no data), and the reading of the cgroup files.
#include "app/auto_micro_batch.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace shardgpt {
namespace {

constexpr double kMiB = 1024.0 * 1024;
// A peak of 100 MiB of state plus 10 MiB per sequence.
double Peak(int b) { return 100 * kMiB + 10 * kMiB * b; }

TEST(AutoMicroBatch, GivenMemoryIsTakenAsIs) {
  AutoBatchLimits l;
  l.memory = {{300 * kMiB, "--memory"}};
  l.measured = false;
  const AutoBatchChoice c = ChooseAutoMicroBatch(l, Peak);
  EXPECT_EQ(c.micro_batch, 20);
  EXPECT_EQ(c.bound, "memory");
  EXPECT_LE(Peak(c.micro_batch), 300 * kMiB);
  EXPECT_GT(Peak(c.micro_batch + 1), 300 * kMiB);
}

TEST(AutoMicroBatch, MeasuredMemoryLeavesHeadroomAndTheTightestBoundWins) {
  AutoBatchLimits l;
  l.memory = {{100000 * kMiB, "MemAvailable in /proc/meminfo"}, {1000 * kMiB, "the cgroup limit"},
              {5000 * kMiB, "ulimit -v"}};
  const AutoBatchChoice c = ChooseAutoMicroBatch(l, Peak);
  const double usable = 1000 * kMiB * (1 - kAutoHeadroomFrac) - kAutoOverheadBytes;
  EXPECT_DOUBLE_EQ(c.usable_bytes, usable);
  EXPECT_EQ(c.memory_source, "the cgroup limit");
  EXPECT_EQ(c.bound, "memory");
  EXPECT_LE(Peak(c.micro_batch), usable);
  EXPECT_GT(Peak(c.micro_batch + 1), usable);
  EXPECT_LT(Peak(c.micro_batch), 1000 * kMiB * 0.9);  // never the whole limit
}

TEST(AutoMicroBatch, FewWindowsBoundIt) {
  AutoBatchLimits l;
  l.memory = {{1e6 * kMiB, "MemAvailable in /proc/meminfo"}};
  l.max_by_data = 7;
  const AutoBatchChoice c = ChooseAutoMicroBatch(l, Peak);
  EXPECT_EQ(c.micro_batch, 7);
  EXPECT_EQ(c.bound, "data");
  EXPECT_NE(c.line.find("7 window(s) per rank"), std::string::npos) << c.line;
}

TEST(AutoMicroBatch, ThroughputCapBoundsIt) {
  AutoBatchLimits l;
  l.memory = {{1e6 * kMiB, "MemAvailable in /proc/meminfo"}};
  l.max_by_data = 1000;
  l.cap = 64;
  l.cap_reason = "16384 tokens per micro-batch on the CPU";
  const AutoBatchChoice c = ChooseAutoMicroBatch(l, Peak);
  EXPECT_EQ(c.micro_batch, 64);
  EXPECT_EQ(c.bound, "throughput cap");
  // memory tighter than the cap: memory wins
  l.memory = {{400 * kMiB, "--memory"}};
  l.measured = false;
  const AutoBatchChoice m = ChooseAutoMicroBatch(l, Peak);
  EXPECT_EQ(m.micro_batch, 30);
  EXPECT_EQ(m.bound, "memory");
}

TEST(AutoMicroBatch, NothingFits) {
  AutoBatchLimits l;
  l.memory = {{50 * kMiB, "the cgroup limit"}};
  EXPECT_EQ(ChooseAutoMicroBatch(l, Peak).micro_batch, 0);
  l.memory.clear();
  EXPECT_EQ(ChooseAutoMicroBatch(l, Peak).micro_batch, 0);
}

void Write(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

TEST(AutoMicroBatch, ReadsCgroupV2AndV1Limits) {
  const std::string root = testing::TempDir() + "/auto_mb_root";
  std::filesystem::remove_all(root);
  Write(root + "/proc/meminfo", "MemTotal: 100000000 kB\nMemAvailable: 50000000 kB\n");
  // v2, in a namespace: the process's cgroup is the mount's root
  Write(root + "/proc/self/cgroup", "0::/\n");
  Write(root + "/sys/fs/cgroup/memory.max", "419430400\n");  // 400 MiB
  Write(root + "/sys/fs/cgroup/memory.current", "104857600\n");
  auto b = CpuMemoryBounds(root);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_DOUBLE_EQ(b[0].bytes, 50000000.0 * 1024);
  EXPECT_DOUBLE_EQ(b[1].bytes, 300 * kMiB);
  EXPECT_NE(b[1].source.find("/sys/fs/cgroup/memory.max"), std::string::npos) << b[1].source;
  // v1 without a namespace: the process's own cgroup, below a root that says "no limit"; an
  // ancestor's tighter limit wins
  Write(root + "/proc/self/cgroup", "4:memory:/jobs/j1\n3:cpu:/\n");
  Write(root + "/sys/fs/cgroup/memory.max", "max\n");
  Write(root + "/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  Write(root + "/sys/fs/cgroup/memory/jobs/j1/memory.limit_in_bytes", "524288000\n");  // 500 MiB
  Write(root + "/sys/fs/cgroup/memory/jobs/j1/memory.usage_in_bytes", "0\n");
  b = CpuMemoryBounds(root);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_DOUBLE_EQ(b[1].bytes, 500 * kMiB);
  EXPECT_NE(b[1].source.find("jobs/j1/memory.limit_in_bytes"), std::string::npos) << b[1].source;
  Write(root + "/sys/fs/cgroup/memory/jobs/memory.limit_in_bytes", "209715200\n");  // 200 MiB above it
  Write(root + "/sys/fs/cgroup/memory/jobs/memory.usage_in_bytes", "10485760\n");
  b = CpuMemoryBounds(root);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_DOUBLE_EQ(b[1].bytes, 190 * kMiB);
  // no limit anywhere: MemAvailable alone
  Write(root + "/sys/fs/cgroup/memory/jobs/memory.limit_in_bytes", "9223372036854771712\n");
  Write(root + "/sys/fs/cgroup/memory/jobs/j1/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(CpuMemoryBounds(root).size(), 1u);
  std::filesystem::remove_all(root);
}

// ulimit -v: in a child process with RLIMIT_AS set to its VmSize + 1 GiB, the bound read is
// the 1 GiB left (less what the process maps meanwhile) and names its source.
TEST(AutoMicroBatch, ReadsTheAddressSpaceLimit) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's shadow memory is address space a limit would take away";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  GTEST_SKIP() << "AddressSanitizer's shadow memory is address space a limit would take away";
#endif
#endif
  auto child = []() {
    std::ifstream status("/proc/self/status");
    std::string key;
    double vm_kib = -1;
    while (status >> key)
      if (key == "VmSize:" && (status >> vm_kib)) break;
    if (vm_kib < 0) _exit(2);
    const rlim_t limit = static_cast<rlim_t>(vm_kib * 1024 + 1024 * kMiB);
    rlimit rl{limit, limit};
    if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(3);
    for (const MemoryBound& b : CpuMemoryBounds())
      if (b.source.find("ulimit -v") != std::string::npos) _exit(b.bytes > 900 * kMiB && b.bytes <= 1024 * kMiB ? 0 : 4);
    _exit(5);  // no ulimit bound reported
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace shardgpt
