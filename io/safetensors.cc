#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/bf16.h"

namespace shardgpt {

namespace {

// A header larger than this is refused before it is read (the reference implementation's
// limit is 100 MB too): a lying length cannot make us allocate gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

// IEEE half -> float (subnormals, inf and NaN included).
float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      uint32_t m = man;
      do { m <<= 1, e++; } while (!(m & 0x400));
      bits = sign | ((127 - 15 - e) << 23) | ((m & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

Status PreadAll(int fd, const std::string& path, void* buf, uint64_t n, uint64_t pos) {
  uint64_t got = 0;
  while (got < n) {
    const ssize_t k = pread(fd, static_cast<char*>(buf) + got, n - got, static_cast<off_t>(pos + got));
    if (k <= 0) return Status::IOError(path + ": read error" + (k < 0 ? std::string(": ") + std::strerror(errno) : " (file shrank)"));
    got += static_cast<uint64_t>(k);
  }
  return Status::OK();
}

}  // namespace

uint64_t SafetensorsEntry::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

int SafetensorsDTypeSize(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

StatusOr<std::vector<SafetensorsEntry>> ParseSafetensorsHeader(const std::string& what, const std::string& text,
                                                               uint64_t data_bytes,
                                                               std::map<std::string, std::string>* metadata) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status::Corruption(what + ": safetensors header is not a JSON object");
  std::vector<SafetensorsEntry> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return Status::Corruption(what + ": __metadata__ is not an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          return Status::Corruption(what + ": __metadata__ value of " + Quoted(m.key()) + " is not a string");
        if (metadata) (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string t = what + ": tensor " + Quoted(name) + ": ";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      return Status::Corruption(t + "expected an object with dtype, shape and data_offsets");
    SafetensorsEntry e;
    e.name = name;
    if (!v["dtype"].is_string()) return Status::Corruption(t + "dtype is not a string");
    e.dtype = v["dtype"].get<std::string>();
    const int elt = SafetensorsDTypeSize(e.dtype);
    if (elt == 0) return Status::Corruption(t + "unknown dtype " + Quoted(e.dtype));
    if (!v["shape"].is_array()) return Status::Corruption(t + "shape is not an array");
    // numel x elt must not wrap: every dimension and the running product stay below 2^62
    unsigned __int128 numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (int64_t{1} << 50))
        return Status::Corruption(t + "shape " + v["shape"].dump() + " (expected non-negative integers)");
      e.shape.push_back(d.get<int64_t>());
      numel *= static_cast<uint64_t>(e.shape.back());
      if (numel > (uint64_t{1} << 60)) return Status::Corruption(t + "shape " + v["shape"].dump() + " is too large");
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      return Status::Corruption(t + "data_offsets " + off.dump() + " (expected [begin, end], non-negative integers)");
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_bytes)
      return Status::Corruption(t + "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                                "] outside the data section of " + std::to_string(data_bytes) + " bytes");
    const unsigned __int128 want = numel * static_cast<unsigned>(elt);
    if (want != e.end - e.begin)
      return Status::Corruption(t + "data_offsets span " + std::to_string(e.end - e.begin) + " bytes, shape " +
                                v["shape"].dump() + " x " + e.dtype + " needs " +
                                std::to_string(static_cast<uint64_t>(want)));
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (const SafetensorsEntry& e : out) {
    if (e.begin < at)
      return Status::Corruption(what + ": tensor " + Quoted(e.name) + " overlaps the tensor before it (bytes " +
                                std::to_string(e.begin) + " < " + std::to_string(at) + ")");
    if (e.begin > at)
      return Status::Corruption(what + ": bytes [" + std::to_string(at) + ", " + std::to_string(e.begin) +
                                ") of the data section belong to no tensor (expected no holes)");
    at = e.end;
  }
  if (at != data_bytes)
    return Status::Corruption(what + ": the tensors end at byte " + std::to_string(at) + " of a " +
                              std::to_string(data_bytes) + "-byte data section (expected them to cover it exactly)");
  return out;
}

StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(const std::string& path) {
  std::unique_ptr<SafetensorsReader> r(new SafetensorsReader());
  r->path_ = path;
  r->fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (r->fd_ < 0) return Status::NotFound(path + ": cannot open safetensors file: " + std::strerror(errno));
  struct stat st;
  if (fstat(r->fd_, &st) != 0 || !S_ISREG(st.st_mode))
    return Status::InvalidArgument(path + ": not a regular file (expected a .safetensors file)");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  unsigned char len8[8];
  if (size < 8) return Status::Corruption(path + ": " + std::to_string(size) + " bytes, shorter than the 8-byte safetensors header length");
  SHARDGPT_RETURN_IF_ERROR(PreadAll(r->fd_, path, len8, 8, 0));
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | len8[i];
  if (n > kMaxHeaderBytes || n > size - 8)
    return Status::Corruption(path + ": header length " + std::to_string(n) + " exceeds the file (" +
                              std::to_string(size) + " bytes) or the 100 MB limit");
  std::string json(n, '\0');
  SHARDGPT_RETURN_IF_ERROR(PreadAll(r->fd_, path, json.data(), n, 8));
  r->data_start_ = 8 + n;
  auto entries = ParseSafetensorsHeader(path, json, size - r->data_start_, &r->metadata_);
  if (!entries.ok()) return entries.status();
  r->entries_ = std::move(entries.value());
  return r;
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) close(fd_);
}

const SafetensorsEntry* SafetensorsReader::Find(const std::string& name) const {
  for (const SafetensorsEntry& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

Status SafetensorsReader::ReadFloats(const SafetensorsEntry& e, uint64_t first, uint64_t n, float* dst) {
  const int elt = SafetensorsDTypeSize(e.dtype);
  if (e.dtype != "F32" && e.dtype != "BF16" && e.dtype != "F16")
    return Status::InvalidArgument(path_ + ": tensor " + Quoted(e.name) + " has dtype " + Quoted(e.dtype) +
                                   " (expected F32, BF16 or F16)");
  if (first + n > e.numel()) return Status::Internal(path_ + ": read past the end of tensor " + Quoted(e.name));
  const uint64_t pos = data_start_ + e.begin + first * elt;
  if (elt == 4) {
    SHARDGPT_RETURN_IF_ERROR(PreadAll(fd_, path_, dst, n * 4, pos));
  } else {
    std::vector<uint16_t> tmp(n);
    SHARDGPT_RETURN_IF_ERROR(PreadAll(fd_, path_, tmp.data(), n * 2, pos));
    if (e.dtype == "BF16") Bf16ToFloat(tmp.data(), dst, n);
    else for (uint64_t i = 0; i < n; i++) dst[i] = HalfToFloat(tmp[i]);
  }
  bytes_read_ += n * elt;
  return Status::OK();
}

Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors, bool bf16,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  const uint64_t elt = bf16 ? 2 : 4;
  uint64_t at = 0;
  for (const SafetensorsTensor& t : tensors) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    if (numel != t.values.size()) return Status::Internal(path + ": tensor " + t.name + " has the wrong element count");
    h[t.name] = {{"dtype", bf16 ? "BF16" : "F32"}, {"shape", t.shape}, {"data_offsets", {at, at + numel * elt}}};
    at += numel * elt;
  }
  std::string json = h.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return Status::IOError(tmp + ": cannot create: " + std::strerror(errno));
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = static_cast<unsigned char>(static_cast<uint64_t>(json.size()) >> (8 * i));
  bool ok = std::fwrite(len8, 1, 8, f) == 8 && std::fwrite(json.data(), 1, json.size(), f) == json.size();
  std::vector<uint16_t> half;
  for (const SafetensorsTensor& t : tensors) {
    if (!ok) break;
    if (bf16) {
      half.resize(t.values.size());
      FloatToBf16(t.values.data(), half.data(), half.size());
      ok = std::fwrite(half.data(), 2, half.size(), f) == half.size();
    } else {
      ok = std::fwrite(t.values.data(), 4, t.values.size(), f) == t.values.size();
    }
  }
  ok = std::fflush(f) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return Status::IOError(path + ": write failed: " + why);
  }
  return Status::OK();
}

}  // namespace shardgpt
