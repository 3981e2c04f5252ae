// The CPU device's memory: zero-filled blocks, reused by size through its block cache
// (model/cpu_device.cc), and counted as the system allocations and frees behind them.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "model/device.h"

namespace shardgpt {
namespace {

TEST(CpuDeviceMemory, AFreedBlockIsReusedZeroFilledWithoutAskingTheSystem) {
  for (bool pretend : {false, true}) {
    std::unique_ptr<Device> dev = NewCpuDevice(pretend);
    const size_t bytes = (size_t{3} << 20) + 100;  // large (mmap'ed by calloc) and not a round size
    const DeviceCounters c0 = dev->counters();
    ASSERT_TRUE(c0.known);
    void* a = dev->Allocate(bytes, "a");
    std::vector<unsigned char> ones(bytes, 0xAB);
    dev->CopyToDevice(a, ones.data(), bytes);
    dev->Free(a);
    const DeviceCounters c1 = dev->counters();
    EXPECT_EQ(c1.allocations - c0.allocations, 1u);
    EXPECT_EQ(c1.frees - c0.frees, 0u) << "a freed block goes to the cache, not back to the system";
    void* b = dev->Allocate(bytes, "b");
    EXPECT_EQ(b, a) << "the cached block of that size is reused";
    EXPECT_EQ(dev->counters().allocations, c1.allocations);
    std::vector<unsigned char> back(bytes, 0xFF);
    dev->CopyToHost(back.data(), b, bytes);
    for (size_t i = 0; i < bytes; i++) ASSERT_EQ(back[i], 0) << "byte " << i << " of a reused block is not zero";
    // another size is not served from the cache; a block alive is never handed out twice
    void* c = dev->Allocate(bytes / 2, "c");
    void* d = dev->Allocate(bytes, "d");
    EXPECT_NE(c, b);
    EXPECT_NE(d, b);
    EXPECT_EQ(dev->counters().allocations - c1.allocations, 2u);
    dev->Free(b), dev->Free(c), dev->Free(d);
  }
}

TEST(CpuDeviceMemoryDeathTest, FreeOfMemoryTheDeviceDidNotAllocateStops) {
  std::unique_ptr<Device> dev = NewCpuDevice(false);
  static char host[64];
  EXPECT_DEATH(dev->Free(host), "Device::Free given .* which this device did not allocate");
}

}  // namespace
}  // namespace shardgpt
