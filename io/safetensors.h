// Safetensors files (Hugging Face's weight format), read and written by its published layout:
// an 8-byte little-endian header length N, N bytes of JSON ({name: {dtype, shape,
// data_offsets: [begin, end]}, "__metadata__": {string: string}}), then the raw tensors
// (little-endian, row-major), offsets relative to the end of the header. Debian packages no
// C/C++ implementation; the format is small enough to own.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace shardgpt {

// One tensor of a safetensors header. begin/end are byte offsets into the data section.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16", "I64", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
  uint64_t numel() const;
};

// Bytes per element of a safetensors dtype name, or 0 for a name the format does not define.
int SafetensorsDTypeSize(const std::string& dtype);

// Parses a header's JSON against a data section of data_bytes: every entry's dtype known,
// shape non-negative, end - begin = numel x element size, the entries neither overlapping nor
// leaving holes and together covering exactly [0, data_bytes) (as the format requires).
// Errors start with `what` (the file name) and name the tensor. Entries come sorted by begin.
StatusOr<std::vector<SafetensorsEntry>> ParseSafetensorsHeader(const std::string& what, const std::string& json,
                                                               uint64_t data_bytes,
                                                               std::map<std::string, std::string>* metadata);

// A safetensors file opened for reading: the header checked against the file's size, tensor
// data read on demand (pread), so a caller can take only the tensors it needs.
class SafetensorsReader {
 public:
  static StatusOr<std::unique_ptr<SafetensorsReader>> Open(const std::string& path);
  ~SafetensorsReader();
  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The entry named `name`, or null.
  const SafetensorsEntry* Find(const std::string& name) const;
  // Elements [first, first + n) of an F32, BF16 or F16 tensor, widened to fp32.
  Status ReadFloats(const SafetensorsEntry& e, uint64_t first, uint64_t n, float* dst);
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  SafetensorsReader() = default;
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  uint64_t bytes_read_ = 0;
};

// A tensor to write: fp32 values, stored as "F32" or "BF16" (round to nearest even).
struct SafetensorsTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};
// Writes the tensors in the given order, each 8-byte aligned (the header is padded with
// spaces), atomically: a temporary file renamed over path, nothing left behind on error.
Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors, bool bf16,
                        const std::map<std::string, std::string>& metadata);

}  // namespace shardgpt
