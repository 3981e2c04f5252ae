#include "base/status.h"

#include <gtest/gtest.h>

namespace shardgpt {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

TEST(Status, ValueOrError) {
  EXPECT_TRUE(Half(4).ok());
  EXPECT_EQ(Half(4).value(), 2);
  auto r = Half(3);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(r.status().ToString(), "error: odd: 3");
}

}  // namespace
}  // namespace shardgpt
