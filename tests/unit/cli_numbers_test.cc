// Strict command-line numbers (app/cli_numbers.h): what CLI11 2.1 alone would accept and
// turn into another value is refused; plain decimal numbers pass, leading zeros dropped.
#include "app/cli_numbers.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace shardgpt {
namespace {

std::string Check(const std::string& type, std::string v) {
  const std::string err = StrictNumber(type, &v);
  return err.empty() ? "=" + v : "refused";
}

TEST(CliNumbers, PlainDecimalOnly) {
  EXPECT_EQ(Check("INT", "42"), "=42");
  EXPECT_EQ(Check("INT", "-7"), "=-7");
  EXPECT_EQ(Check("INT", "+7"), "=7");
  EXPECT_EQ(Check("INT", "010"), "=10");  // CLI11 alone: octal 8
  EXPECT_EQ(Check("INT", "-0008"), "=-8");
  EXPECT_EQ(Check("INT", "-9223372036854775808"), "=-9223372036854775808");
  for (const char* bad : {"0x10", "1e3", "1.5", "", "-", "5 ", " 5", "5k", "9223372036854775808", "0b101", "１"})
    EXPECT_EQ(Check("INT", bad), "refused") << bad;
  EXPECT_EQ(Check("UINT", "18446744073709551615"), "=18446744073709551615");
  for (const char* bad : {"-1", "-0", "18446744073709551616", "0x1", "1e3"})
    EXPECT_EQ(Check("UINT", bad), "refused") << bad;  // CLI11 alone: -1 is 2^64-1, overflow saturates
  for (const char* ok : {"6e-4", "-1.5", ".5", "5.", "1E+3", "0", "3.4e38", "1e-400"})
    EXPECT_NE(Check("FLOAT", ok), "refused") << ok;
  for (const char* bad : {"nan", "-nan", "inf", "-inf", "infinity", "1e400", "3.5e38", "0x1p3", "1e", ".", "e5", "1,5"})
    EXPECT_EQ(Check("FLOAT", bad), "refused") << bad;
  EXPECT_EQ(Check("TEXT", "0x10"), "=0x10");  // other types untouched
}

// Through CLI11 as cli.cc sets it up: on subcommands, vector elements one by one, and the
// error names the option.
TEST(CliNumbers, AppliesToEverySubcommandOption) {
  CLI::App app;
  CLI::App* sub = app.add_subcommand("train");
  uint64_t seed = 0;
  std::vector<int> ids;
  double lr = 0;
  sub->add_option("--seed", seed);
  sub->add_option("--ids", ids);
  sub->add_option("--lr", lr);
  AddStrictNumberChecks(&app);
  auto parse = [&](std::vector<const char*> argv) -> std::string {
    argv.insert(argv.begin(), {"shardgpt", "train"});
    try {
      app.parse(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
      return "";
    } catch (const CLI::ParseError& e) {
      return e.what();
    }
  };
  EXPECT_EQ(parse({"--seed", "007", "--ids", "1", "010", "--lr", "1e-3"}), "");
  EXPECT_EQ(seed, 7u);
  EXPECT_EQ(ids, (std::vector<int>{1, 10}));
  EXPECT_EQ(lr, 1e-3);
  const std::string e1 = parse({"--seed", "-1"});
  EXPECT_NE(e1.find("--seed"), std::string::npos) << e1;
  EXPECT_NE(e1.find("non-negative decimal integer"), std::string::npos) << e1;
  EXPECT_NE(parse({"--ids", "1", "0x2"}).find("--ids"), std::string::npos);
  EXPECT_NE(parse({"--lr", "nan"}).find("finite decimal number"), std::string::npos);
}

}  // namespace
}  // namespace shardgpt
