#include "io/llmc_model.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>

#include "base/bf16.h"
#include "io/file_checks.h"
#include "io/hf_gpt2.h"
#include "io/hf_llama.h"

namespace shardgpt {

namespace {
constexpr int kMagic = 20240326;

// The llm.c order of tensor kinds; "" prefix entries are per layer ("h.<l>." + suffix).
struct Kind {
  const char* name;
  bool per_layer;
};
const Kind kOrder[] = {
    {"wte.weight", false},         {"wpe.weight", false},        {"ln_1.weight", true},
    {"ln_1.bias", true},           {"attn.c_attn.weight", true}, {"attn.c_attn.bias", true},
    {"attn.c_proj.weight", true},  {"attn.c_proj.bias", true},   {"ln_2.weight", true},
    {"ln_2.bias", true},           {"mlp.c_fc.weight", true},    {"mlp.c_fc.bias", true},
    {"mlp.c_proj.weight", true},   {"mlp.c_proj.bias", true},    {"ln_f.weight", false},
    {"ln_f.bias", false},
};

// Calls fn(global offset, numel) for every tensor in llm.c file order.
template <typename Fn>
void ForEachInFileOrder(const ParamLayout& layout, Fn fn) {
  for (const Kind& k : kOrder) {
    const int reps = k.per_layer ? layout.config().n_layer : 1;
    for (int l = 0; l < reps; l++) {
      const std::string name = k.per_layer ? "h." + std::to_string(l) + "." + k.name : k.name;
      const TensorInfo& t = layout.tensors()[layout.Find(name)];
      fn(layout.units()[t.unit].offset + t.offset, t.numel);
    }
  }
}

struct FileCloser {
  void operator()(FILE* f) const { if (f) std::fclose(f); }
};

int32_t LoadLE32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                              (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24));
}
}  // namespace

// Checks the header and the file size it implies; fills the config and the version.
Status CheckLlmcHeader(const std::string& path, FILE* file, GPTConfig* config, int* version) {
  LlmcModel model;
  struct NoClose {
    void operator()(FILE*) const {}
  };
  std::unique_ptr<FILE, NoClose> f(file);  // not owned
  unsigned char raw[1024];
  if (std::fread(raw, 1, sizeof(raw), f.get()) != sizeof(raw))
    return Status::Corruption(path + ": file shorter than the 1024-byte llm.c model header");
  int32_t h[8];
  for (int i = 0; i < 8; i++) h[i] = LoadLE32(raw + 4 * i);
  if (h[0] != kMagic)
    return Status::Corruption(path + ": bad magic " + std::to_string(h[0]) + " (expected " + std::to_string(kMagic) +
                              ", an llm.c model .bin)");
  if (h[1] != 3 && h[1] != 5)
    return Status::Corruption(path + ": unsupported version " + std::to_string(h[1]) +
                              " (expected 3 = fp32 or 5 = bf16)");
  model.config = GPTConfig{h[4], h[5], h[6], h[2], h[3]};
  SHARDGPT_RETURN_IF_ERROR(CheckFileConfig(model.config, path + ": header"));
  if (h[7] != model.config.padded_vocab())
    return Status::Corruption(path + ": padded vocab " + std::to_string(h[7]) + " (expected " +
                              std::to_string(model.config.padded_vocab()) + " for vocab " + std::to_string(h[3]) + ")");
  const size_t elt = h[1] == 3 ? 4 : 2;
  uint64_t numel = 0;
  if (!FileParamCount(model.config, &numel))
    return Status::Corruption(path + ": header (" + model.config.ToString() + ") describes more than 2^50 parameters");
  if (std::fseek(f.get(), 0, SEEK_END) != 0) return Status::IOError(path + ": cannot seek: " + std::strerror(errno));
  const long size = std::ftell(f.get());
  const uint64_t expected = 1024 + numel * elt;
  if (size < 0 || static_cast<uint64_t>(size) != expected)
    return Status::Corruption(path + ": file has " + std::to_string(size) + " bytes, header (" +
                              model.config.ToString() + ", version " + std::to_string(h[1]) + ") says " +
                              std::to_string(expected));
  *config = model.config;
  *version = h[1];
  return Status::OK();
}

StatusOr<std::unique_ptr<LlmcModelReader>> LlmcModelReader::Open(const std::string& path) {
  if (IsHfGpt2Path(path) && IsHfLlamaPath(path)) {
    auto hf = HfLlamaReader::Open(path);
    if (!hf.ok()) return hf.status();
    std::unique_ptr<LlmcModelReader> r(new LlmcModelReader());
    r->path_ = path;
    r->config_ = hf.value()->config();
    r->hf_llama_ = std::move(hf.value());
    return r;
  }
  if (IsHfGpt2Path(path)) {
    auto hf = HfGpt2Reader::Open(path);
    if (!hf.ok()) return hf.status();
    std::unique_ptr<LlmcModelReader> r(new LlmcModelReader());
    r->path_ = path;
    r->config_ = hf.value()->config();
    r->hf_ = std::move(hf.value());
    return r;
  }
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) return Status::NotFound(path + ": cannot open llm.c model file: " + std::strerror(errno));
  std::unique_ptr<LlmcModelReader> r(new LlmcModelReader());
  SHARDGPT_RETURN_IF_ERROR(CheckLlmcHeader(path, f.get(), &r->config_, &r->version_));
  r->fd_ = dup(fileno(f.get()));
  if (r->fd_ < 0) return Status::IOError(path + ": cannot open: " + std::strerror(errno));
  r->path_ = path;
  const ParamLayout layout(r->config_);
  uint64_t at = 0;
  ForEachInFileOrder(layout, [&](size_t off, size_t n) {
    r->pieces_.push_back(Piece{off, n, at, ""});
    at += n;
  });
  for (const TensorInfo& t : layout.tensors())
    for (Piece& p : r->pieces_)
      if (p.global == layout.units()[t.unit].offset + t.offset) p.name = t.name;
  std::sort(r->pieces_.begin(), r->pieces_.end(), [](const Piece& a, const Piece& b) { return a.global < b.global; });
  return r;
}

LlmcModelReader::~LlmcModelReader() {
  if (fd_ >= 0) close(fd_);
}

uint64_t LlmcModelReader::bytes_read() const {
  return hf_ ? hf_->bytes_read() : hf_llama_ ? hf_llama_->bytes_read() : bytes_read_;
}

Status LlmcModelReader::ReadRange(uint64_t begin, uint64_t end, float* dst) {
  if (hf_) return hf_->ReadRange(begin, end, dst);
  if (hf_llama_) return hf_llama_->ReadRange(begin, end, dst);
  const size_t elt = version_ == 3 ? 4 : 2;
  constexpr uint64_t kBlock = uint64_t{1} << 20;  // elements per read: bounded bf16 scratch
  std::vector<uint16_t> tmp;
  for (const Piece& p : pieces_) {
    const uint64_t lo = std::max(begin, p.global), hi = std::min(end, p.global + p.numel);
    for (uint64_t a = lo; a < hi; a += kBlock) {
      const uint64_t n = std::min(kBlock, hi - a);
      const off_t pos = static_cast<off_t>(1024 + (p.file_elem + (a - p.global)) * elt);
      float* out = dst + (a - begin);
      void* buf = out;
      if (elt == 2) tmp.resize(n), buf = tmp.data();
      const ssize_t want = static_cast<ssize_t>(n * elt);
      ssize_t got = 0;
      while (got < want) {
        const ssize_t k = pread(fd_, static_cast<char*>(buf) + got, want - got, pos + got);
        if (k <= 0) return Status::IOError(path_ + ": read error" + (k < 0 ? std::string(": ") + std::strerror(errno) : ""));
        got += k;
      }
      bytes_read_ += static_cast<uint64_t>(want);
      if (elt == 2) Bf16ToFloat(tmp.data(), out, n);
      // A NaN or infinity would train or sample garbage without a word: name the tensor instead.
      for (uint64_t i = 0; i < n; i++)
        if (!std::isfinite(out[i]))
          return Status::Corruption(path_ + ": tensor " + p.name + " element " + std::to_string(a - p.global + i) +
                                    " is " + (std::isnan(out[i]) ? "NaN" : "infinite") + " (expected finite weights)");
    }
  }
  return Status::OK();
}

StatusOr<LlmcModel> ReadLlmcModel(const std::string& path) {
  auto reader = LlmcModelReader::Open(path);
  if (!reader.ok()) return reader.status();
  LlmcModel model;
  model.config = reader.value()->config();
  model.params.resize(ParamLayout(model.config).total_numel());  // = the file's elements, whose size was checked
  SHARDGPT_RETURN_IF_ERROR(reader.value()->ReadRange(0, model.params.size(), model.params.data()));
  return model;
}

Status WriteLlmcModel(const std::string& path, const ParamLayout& layout, const float* params) {
  if (layout.config().llama())
    return Status::Unimplemented(path + ": the llm.c model format holds GPT-2 models only, not --arch llama");
  const std::string tmp = path + ".tmp";
  std::unique_ptr<FILE, FileCloser> f(std::fopen(tmp.c_str(), "wb"));
  if (!f) return Status::IOError(tmp + ": cannot create: " + std::strerror(errno));
  const GPTConfig& c = layout.config();
  int32_t h[256] = {0};
  h[0] = kMagic, h[1] = 3, h[2] = c.max_seq_len, h[3] = c.vocab_size, h[4] = c.n_layer, h[5] = c.n_head;
  h[6] = c.n_embd, h[7] = c.padded_vocab();
  bool ok = std::fwrite(h, sizeof(int32_t), 256, f.get()) == 256;
  ForEachInFileOrder(layout, [&](size_t off, size_t n) { ok = ok && std::fwrite(params + off, 4, n, f.get()) == n; });
  ok = ok && std::fflush(f.get()) == 0;
  f.reset();
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return Status::IOError(path + ": write failed: " + std::strerror(errno));
  }
  return Status::OK();
}

}  // namespace shardgpt
