// `plan --memory` and `train --micro-batch auto`: the size parser, and the largest micro-batch
// that fits (LargestFittingMicroBatch) against the peak predictor it searches, over every ZeRO
// stage and recompute mode at the GPT-2 124M shape.
#include <gtest/gtest.h>

#include "app/commands.h"
#include "model/gpt.h"
#include "parallel/memory_model.h"

namespace shardgpt {
namespace {

TEST(ParseMemorySize, UnitsAndErrors) {
  EXPECT_DOUBLE_EQ(ParseMemorySize("80GiB").value(), 80.0 * 1073741824.0);
  EXPECT_DOUBLE_EQ(ParseMemorySize("512MiB").value(), 512.0 * 1048576.0);
  EXPECT_DOUBLE_EQ(ParseMemorySize("1.5TiB").value(), 1.5 * 1099511627776.0);
  EXPECT_DOUBLE_EQ(ParseMemorySize("4096").value(), 4096.0);
  EXPECT_DOUBLE_EQ(ParseMemorySize("2GB").value(), 2e9);
  for (const char* bad : {"", "GiB", "-1GiB", "0", "80 GiB", "80gib", "80XiB", "inf", "nan", "0x10", "1e400"}) {
    auto m = ParseMemorySize(bad);
    EXPECT_FALSE(m.ok()) << bad;
    if (!m.ok()) EXPECT_NE(m.status().message().find("--memory"), std::string::npos) << m.status().message();
  }
}

// For every stage x mode at d12 (T 1024, 8 ranks) and a few budgets: B fits and B + 1 does not,
// by the predictor; block recomputation never fits fewer sequences than none.
TEST(LargestFittingMicroBatch, IsTheLargestThatThePredictorFits) {
  const GPTConfig d12{12, 12, 768, 1024, 50257};
  const ParamLayout layout(d12);
  const ShardPlan plan(layout, 8);
  const double GiB = 1073741824.0;
  for (double budget : {2 * GiB, 10 * GiB, 80 * GiB})
    for (int stage = 0; stage <= 3; stage++) {
      EngineOptions eo;
      eo.zero_stage = stage;
      int fitted[3];
      for (int m = 0; m < 3; m++) {
        const Recompute r = static_cast<Recompute>(m);
        const int b = LargestFittingMicroBatch(layout, plan, eo, 1024, 1, r, budget);
        fitted[m] = b;
        const std::string what = "stage " + std::to_string(stage) + " " + RecomputeName(r) + " budget " +
                                 std::to_string(budget / GiB) + " GiB";
        if (b > 0) EXPECT_LE(PredictPeakMemory(layout, plan, eo, b, 1024, 1, r).peak(), budget) << what;
        EXPECT_GT(PredictPeakMemory(layout, plan, eo, b + 1, 1024, 1, r).peak(), budget) << what;
      }
      EXPECT_LE(fitted[0], fitted[1]);
      EXPECT_LE(fitted[1], fitted[2]);
    }
  // the search's cap: a huge budget returns max_b
  EngineOptions eo;
  EXPECT_EQ(LargestFittingMicroBatch(layout, plan, eo, 1024, 1, Recompute::kBlock, 1e30, 100), 100);
}

}  // namespace
}  // namespace shardgpt
