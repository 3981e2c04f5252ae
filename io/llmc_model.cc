#include "io/llmc_model.h"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>

#include "base/bf16.h"
#include "io/file_checks.h"

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

StatusOr<LlmcModel> ReadLlmcModel(const std::string& path) {
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) return Status::NotFound(path + ": cannot open llm.c model file: " + std::strerror(errno));
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
  LlmcModel model;
  model.config = GPTConfig{h[4], h[5], h[6], h[2], h[3]};
  SHARDGPT_RETURN_IF_ERROR(CheckFileConfig(model.config, path + ": header"));
  if (h[7] != model.config.padded_vocab())
    return Status::Corruption(path + ": padded vocab " + std::to_string(h[7]) + " (expected " +
                              std::to_string(model.config.padded_vocab()) + " for vocab " + std::to_string(h[3]) + ")");
  // The size the header implies, computed without building the layout (whose size a
  // crafted header could make arbitrary), is checked against the file before any allocation.
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
  ParamLayout layout(model.config);
  std::fseek(f.get(), 1024, SEEK_SET);
  model.params.resize(layout.total_numel());
  std::vector<uint16_t> tmp;
  bool ok = true;
  ForEachInFileOrder(layout, [&](size_t off, size_t n) {
    if (!ok) return;
    if (elt == 4) {
      ok = std::fread(model.params.data() + off, 4, n, f.get()) == n;
    } else {
      tmp.resize(n);
      ok = std::fread(tmp.data(), 2, n, f.get()) == n;
      Bf16ToFloat(tmp.data(), model.params.data() + off, n);
    }
  });
  if (!ok) return Status::IOError(path + ": read error");
  // A NaN or infinity would train or sample garbage without a word: name the tensor instead.
  for (const TensorInfo& t : layout.tensors()) {
    const float* p = model.params.data() + layout.units()[t.unit].offset + t.offset;
    for (size_t i = 0; i < t.numel; i++)
      if (!std::isfinite(p[i]))
        return Status::Corruption(path + ": tensor " + t.name + " element " + std::to_string(i) + " is " +
                                  (std::isnan(p[i]) ? "NaN" : "infinite") + " (expected finite weights)");
  }
  return model;
}

Status WriteLlmcModel(const std::string& path, const ParamLayout& layout, const float* params) {
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
