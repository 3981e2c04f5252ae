#include "app/cli_numbers.h"

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>

namespace shardgpt {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Length of the run of digits at s[i].
size_t Digits(const std::string& s, size_t i) {
  size_t n = 0;
  while (i + n < s.size() && IsDigit(s[i + n])) n++;
  return n;
}

std::string Integer(std::string* v, bool is_unsigned) {
  const std::string& s = *v;
  const std::string expected =
      is_unsigned ? "expected a non-negative decimal integer below 2^64" : "expected a decimal integer";
  size_t i = 0;
  const bool negative = !s.empty() && s[0] == '-';
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) i = 1;
  if (negative && is_unsigned) return expected + ", got '" + s + "'";
  const size_t n = Digits(s, i);
  if (n == 0 || i + n != s.size()) return expected + ", got '" + s + "'";
  size_t z = i;  // drop leading zeros: CLI11 would read them as octal
  while (z + 1 < s.size() && s[z] == '0') z++;
  std::string canon = (negative ? "-" : "") + s.substr(z);
  const char* b = canon.data() + (negative ? 1 : 0);
  const char* e = canon.data() + canon.size();
  uint64_t magnitude = 0;
  const auto r = std::from_chars(b, e, magnitude);
  if (r.ec != std::errc() || r.ptr != e || (!is_unsigned && magnitude > (negative ? uint64_t{1} << 63 : INT64_MAX)))
    return expected + " in range, got '" + s + "'";
  *v = canon;
  return "";
}

std::string Floating(std::string* v) {
  const std::string& s = *v;
  const std::string expected = "expected a finite decimal number, got '" + s + "'";
  // [+-] digits [. digits] [e [+-] digits], or [+-] . digits [...]: no nan, inf or hex.
  size_t i = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
  size_t mant = Digits(s, i);
  i += mant;
  if (i < s.size() && s[i] == '.') {
    const size_t frac = Digits(s, i + 1);
    mant += frac;
    i += 1 + frac;
  }
  if (mant == 0) return expected;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) j++;
    const size_t exp = Digits(s, j);
    if (exp == 0) return expected;
    i = j + exp;
  }
  if (i != s.size()) return expected;
  errno = 0;
  const double x = std::strtod(s.c_str(), nullptr);
  if (!std::isfinite(x) || std::fabs(x) > FLT_MAX) return "expected a decimal number of magnitude below 3.4e38, got '" + s + "'";
  return "";
}

void AddTo(CLI::App* app) {
  for (CLI::Option* opt : app->get_options()) {
    const std::string type = opt->get_type_name();
    if (type != "INT" && type != "UINT" && type != "FLOAT") continue;
    opt->transform(CLI::Validator([type](std::string& value) { return StrictNumber(type, &value); }, "", "strict"));
  }
  for (CLI::App* sub : app->get_subcommands({})) AddTo(sub);
}

}  // namespace

std::string StrictNumber(const std::string& type, std::string* value) {
  if (type == "INT") return Integer(value, false);
  if (type == "UINT") return Integer(value, true);
  if (type == "FLOAT") return Floating(value);
  return "";
}

void AddStrictNumberChecks(CLI::App* app) { AddTo(app); }

}  // namespace shardgpt
