// Helpers for the fuzz targets (tests/fuzz/*_fuzz.cc): a private scratch directory, the
// input written as a file, the contract checks that turn a broken promise into a crash
// libFuzzer reports, and the data the shard-file seed and target agree on.
//
// Each target is one process's LLVMFuzzerTestOneInput; libFuzzer calls it from one thread.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "base/status.h"

// Aborts (a crash libFuzzer reports, with the input kept) when a reader breaks its contract.
#define FUZZ_CHECK(cond, ...)                                                \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "fuzz contract violated: %s: ", #cond);           \
      std::fprintf(stderr, __VA_ARGS__);                                     \
      std::fputc('\n', stderr);                                              \
      std::abort();                                                          \
    }                                                                        \
  } while (0)

namespace shardgpt {
namespace fuzz {

// This process's scratch directory (in /dev/shm when there is one, so writing the input
// costs no disk I/O), removed at exit.
inline const std::string& ScratchDir() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    const fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    const fs::path d = base / ("shardgpt-fuzz-" + std::to_string(getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    static const std::string keep = d.string();
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(keep, ec);
    });
    return d.string();
  }();
  return dir;
}

inline void WriteBytes(const std::string& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  FUZZ_CHECK(out.good(), "cannot write %s", path.c_str());
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Writes the input to ScratchDir()/name and returns the path.
inline std::string WriteInput(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = ScratchDir() + "/" + name;
  WriteBytes(path, data, size);
  return path;
}

// The contract of an error: one line (the CLI prints it as "shardgpt: error: <line>") that
// names the file.
inline void CheckError(const Status& st, const std::string& names) {
  FUZZ_CHECK(!st.ok(), "expected an error");
  const std::string& m = st.message();
  FUZZ_CHECK(!m.empty() && m.find('\n') == std::string::npos, "error is not one line: '%s'", m.c_str());
  FUZZ_CHECK(m.find(names) != std::string::npos, "error does not name %s: '%s'", names.c_str(), m.c_str());
}

// Every HDF5 file, group, dataset and attribute the readers opened is closed again
// (LeakSanitizer cannot see a forgotten handle: HDF5 still references it).
// (Datatypes are not counted: HDF5 counts its own transient ones there.)
#define FUZZ_CHECK_NO_OPEN_HDF5()                                                                      \
  do {                                                                                               \
    const unsigned kinds = H5F_OBJ_FILE | H5F_OBJ_DATASET | H5F_OBJ_GROUP | H5F_OBJ_ATTR;            \
    const ssize_t open_objects = H5Fget_obj_count(H5F_OBJ_ALL, kinds);                               \
    FUZZ_CHECK(open_objects == 0, "%lld HDF5 object(s) left open", static_cast<long long>(open_objects)); \
  } while (0)

inline uint32_t LE32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

// The shard file the seed generator writes and ckpt_shard_fuzz expects: checkpoint id,
// elements per dataset, and element i of dataset k.
constexpr uint64_t kShardSeedId = 0x5eedf00d5eedf00dull;
constexpr uint64_t kShardSeedElems = 300;
inline float ShardSeedValue(int k, uint64_t i) { return static_cast<float>(k + 1) * 0.25f * i - 7.0f; }

}  // namespace fuzz
}  // namespace shardgpt
