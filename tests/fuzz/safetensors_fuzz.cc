// Fuzz target: safetensors files (io/safetensors.h, SafetensorsReader) and, through them, the
// Hugging Face GPT-2 reader (io/hf_gpt2.h) against a fixed config.json of a tiny model.
// Contract: any file gives either an error (one line naming the file) or a tensor table whose
// entries are sorted, each spanning exactly numel x element size, together covering the data
// section without holes or overlaps; every float tensor reads back. Where HfGpt2Reader accepts
// the file, every element of the model reads back finite (or the read fails naming the file).
#include <cmath>
#include <vector>

#include "fuzz_util.h"
#include "io/hf_gpt2.h"
#include "io/safetensors.h"

using namespace shardgpt;

namespace {
// The model the seeds were written for (make_seeds.cc: HfModels).
const GPTConfig kConfig{1, 2, 8, 4, 10};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::string d = fuzz::ScratchDir() + "/hf";
    std::filesystem::create_directories(d);
    const std::string cfg = "{\"model_type\": \"gpt2\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 8, "
                            "\"n_positions\": 4, \"vocab_size\": 10, \"activation_function\": \"gelu_new\"}";
    fuzz::WriteBytes(d + "/config.json", cfg.data(), cfg.size());
    return d;
  }();
  const std::string path = dir + "/model.safetensors";
  fuzz::WriteBytes(path, data, size);
  auto r = SafetensorsReader::Open(path);
  if (!r.ok()) {
    fuzz::CheckError(r.status(), path);
  } else {
    FUZZ_CHECK(size >= 8, "accepted a %zu-byte file", size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | data[i];
    const uint64_t data_bytes = size - 8 - n;
    uint64_t at = 0;
    for (const SafetensorsEntry& e : r.value()->entries()) {
      FUZZ_CHECK(e.begin == at, "tensor %s starts at %llu, expected %llu", e.name.c_str(),
                 static_cast<unsigned long long>(e.begin), static_cast<unsigned long long>(at));
      FUZZ_CHECK(e.end - e.begin == e.numel() * SafetensorsDTypeSize(e.dtype), "tensor %s size", e.name.c_str());
      at = e.end;
      if ((e.dtype == "F32" || e.dtype == "BF16" || e.dtype == "F16") && e.numel() <= (1u << 20)) {
        std::vector<float> v(e.numel());
        Status st = r.value()->ReadFloats(e, 0, v.size(), v.data());
        FUZZ_CHECK(st.ok(), "reading %s: %s", e.name.c_str(), st.message().c_str());
      }
    }
    FUZZ_CHECK(at == data_bytes, "tensors end at %llu of %llu", static_cast<unsigned long long>(at),
               static_cast<unsigned long long>(data_bytes));
  }
  auto hf = HfGpt2Reader::Open(dir);
  if (!hf.ok()) {
    const std::string& m = hf.status().message();
    FUZZ_CHECK(!m.empty() && m.find('\n') == std::string::npos, "error is not one line: '%s'", m.c_str());
    return 0;
  }
  FUZZ_CHECK(r.ok(), "HfGpt2Reader accepted a file SafetensorsReader refused");
  FUZZ_CHECK(hf.value()->config().FirstDifference(kConfig).empty(), "config differs");
  std::vector<float> all(ParamLayout(kConfig).total_numel());
  Status st = hf.value()->ReadRange(0, all.size(), all.data());
  if (!st.ok()) {
    fuzz::CheckError(st, path);
    return 0;
  }
  for (float x : all) FUZZ_CHECK(std::isfinite(x), "a non-finite weight was accepted");
  return 0;
}
