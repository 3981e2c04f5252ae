// Strict numbers on the command line.
//
// CLI11 2.1 (Debian 12) converts numbers leniently: integers through strtoll with base 0
// ("0x10" is 16, "010" is 8), unsigned ones through strtoull ("-1" becomes 2^64-1, a value
// beyond 2^64-1 saturates), floating ones through strtod ("nan", "inf", "0x1p3" and "1e400",
// i.e. infinity, are all accepted). A typo would then train on a value nobody wrote.
// AddStrictNumberChecks puts in front of every integer and floating option of an app and of
// all its subcommands a transform that accepts plain decimal numbers only: integers without
// a base prefix (leading zeros are dropped, "010" is 10) that fit 64 bits and, for unsigned
// options, have no minus sign; floating numbers in decimal notation that are finite and of
// magnitude at most FLT_MAX. Anything else is a CLI11 validation error, i.e. one
// "shardgpt: error: --seed: ..." line naming the option and what was expected.
//
// Call it after every option is added and before parsing. Not thread-safe (CLI11 is not).
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace shardgpt {

void AddStrictNumberChecks(CLI::App* app);

// The check on one value of an option whose CLI11 type name is `type` ("INT", "UINT",
// "FLOAT"; other types pass unchanged): returns "" and rewrites *value in canonical form
// (leading zeros dropped) when it is accepted, else what was expected.
std::string StrictNumber(const std::string& type, std::string* value);

}  // namespace shardgpt
