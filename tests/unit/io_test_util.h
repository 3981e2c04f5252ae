// Helpers shared by the io/ unit tests: a fresh directory per test and raw file bytes.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace shardgpt {
namespace testutil {

// This process's folder under the test temp dir: named by the process id, so that two runs of
// one test (two builds, two worktrees) never share files; removed when the process that made
// it exits (a forked child leaves it alone).
inline const std::filesystem::path& ProcessTestRoot() {
  struct Root {
    std::filesystem::path path;
    pid_t owner;
    ~Root() {
      std::error_code ec;
      if (getpid() == owner) std::filesystem::remove_all(path, ec);
    }
  };
  static const Root root{std::filesystem::path(::testing::TempDir()) / ("shardgpt_io." + std::to_string(getpid())),
                         getpid()};
  return root.path;
}

// A fresh, empty directory per test, so tests do not see each other's files.
inline std::string TestDir() {
  namespace fs = std::filesystem;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = ProcessTestRoot() / (std::string(info->test_suite_name()) + "." + info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// Appends v as 4 little-endian bytes (file headers written by hand, as the format says).
inline void PutLE32(std::string* s, int32_t v) {
  const uint32_t u = static_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// GPT-2's byte -> code point map (its byte-level BPE symbols), as UTF-8.
inline std::string ByteSymbol(int b) {
  int extra = 0;
  uint32_t cp = 0;
  for (int x = 0; x <= b; x++) {
    const bool keep = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
    cp = keep ? x : 256 + extra++;
  }
  std::string s;
  if (cp < 0x80) s.push_back(static_cast<char>(cp));
  else s.push_back(static_cast<char>(0xC0 | (cp >> 6))), s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  return s;
}

}  // namespace testutil
}  // namespace shardgpt
