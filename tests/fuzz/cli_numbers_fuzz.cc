// Fuzz target: the command line's numbers (app/cli_numbers.h on CLI11, as app/cli.cc sets it
// up: every option type the CLI uses, last value wins, on a subcommand).
// Input: argv tokens separated by newlines. Contract: parsing either throws CLI11's
// ParseError (which cli.cc turns into one "shardgpt: error:" line) or yields, for every
// numeric option given, exactly the plain decimal value of its last token: integers equal the
// decimal reading (no base prefixes, no wrap-around, no saturation, in the type's range),
// floating values finite and equal to the decimal reading. No other exception escapes.
// The token checked is the one CLI11 recorded for the option (its tokenizing is its own).
#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "app/cli_numbers.h"
#include "fuzz_util.h"

using namespace shardgpt;

namespace {

// The decimal reading of an integer token: leading '+' or '-' then digits only.
template <typename T>
bool Decimal(const std::string& s, T* v) {
  size_t i = (!s.empty() && (s[0] == '+' || (s[0] == '-' && std::is_signed<T>::value))) ? 1 : 0;
  if (i == s.size()) return false;
  std::string digits = s.substr(i);
  for (char c : digits)
    if (c < '0' || c > '9') return false;
  if (s[0] == '-') digits = "-" + digits;
  const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), *v);
  return r.ec == std::errc() && r.ptr == digits.data() + digits.size();
}

// The string CLI11 converted for an option: the last of its results (after our transform,
// which only drops leading zeros of integers).
std::string LastValue(CLI::App* sub, const std::string& name) {
  const std::vector<std::string>& r = sub->get_option("--" + name)->results();
  return r.empty() ? std::string() : r.back();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args;
  std::string cur;
  for (size_t i = 0; i < size && args.size() < 64; i++) {
    if (data[i] == '\n') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  if (args.size() < 64) args.push_back(cur);
  for (std::string& a : args) a = a.c_str();  // an argv string ends at its first NUL

  CLI::App app{"fuzz"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  CLI::App* sub = app.add_subcommand("train", "");
  int i = 7;
  long long ll = 7;
  uint64_t u = 7;
  double d = 7;
  float f = 7;
  std::vector<int> ids;
  bool b = false;
  int stage = 0;
  sub->add_option("-i,--int", i);
  sub->add_option("--ll", ll);
  sub->add_option("--u64", u);
  sub->add_option("--dbl", d);
  sub->add_option("--flt", f);
  sub->add_option("--ids", ids);
  sub->add_option("--flag", b);
  sub->add_option("--stage", stage)->check(CLI::Range(0, 3));
  AddStrictNumberChecks(&app);

  std::vector<const char*> argv = {"shardgpt", "train"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
  } catch (const CLI::ParseError& e) {
    const std::string msg = e.what();
    FUZZ_CHECK(msg.find('\n') == std::string::npos || e.get_exit_code() == 0, "multi-line error '%s'", msg.c_str());
    return 0;
  }
  // Accepted: every numeric option given holds the decimal value of its last token.
  if (sub->count("--int")) {
    int64_t want;
    const std::string s = LastValue(sub, "int");
    FUZZ_CHECK(Decimal(s, &want) && want == i, "--int '%s' gave %d", s.c_str(), i);
  }
  if (sub->count("--ll")) {
    long long want;
    const std::string s = LastValue(sub, "ll");
    FUZZ_CHECK(Decimal(s, &want) && want == ll, "--ll '%s' gave %lld", s.c_str(), ll);
  }
  if (sub->count("--u64")) {
    uint64_t want;
    const std::string s = LastValue(sub, "u64");
    FUZZ_CHECK(Decimal(s, &want) && want == u, "--u64 '%s' gave %llu", s.c_str(), static_cast<unsigned long long>(u));
  }
  if (sub->count("--dbl")) {
    const std::string s = LastValue(sub, "dbl");
    FUZZ_CHECK(std::isfinite(d) && d == std::strtod(s.c_str(), nullptr), "--dbl '%s' gave %g", s.c_str(), d);
  }
  if (sub->count("--flt")) {
    const std::string s = LastValue(sub, "flt");
    const double want = std::strtod(s.c_str(), nullptr);
    FUZZ_CHECK(std::isfinite(f) && std::fabs(f - want) <= 1e-6 * std::fabs(want) + 1e-37, "--flt '%s' gave %g",
               s.c_str(), f);
  }
  if (sub->count("--stage")) FUZZ_CHECK(stage >= 0 && stage <= 3, "--stage %d outside its range", stage);
  return 0;
}
