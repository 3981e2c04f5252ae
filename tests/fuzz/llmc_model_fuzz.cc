// Fuzz target: llm.c model files, version 3 (fp32) and 5 (bf16) (io/llmc_model.h).
// Contract: any file gives either an error naming it, or a model whose config is valid, whose
// file size is exactly 1024 + params x 4 (or 2), whose weights are finite and equal the
// file's (first tensor checked bit for bit). The header's sizes are checked against the
// file before anything is allocated (libFuzzer's -malloc_limit_mb catches a violation).
#include <cmath>
#include <cstring>

#include "base/bf16.h"
#include "fuzz_util.h"
#include "io/file_checks.h"
#include "io/llmc_model.h"

using namespace shardgpt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::WriteInput("model.bin", data, size);
  auto m = ReadLlmcModel(path);
  if (!m.ok()) {
    fuzz::CheckError(m.status(), path);
    return 0;
  }
  FUZZ_CHECK(size >= 1024 && fuzz::LE32(data) == 20240326, "accepted a bad magic");
  const uint32_t version = fuzz::LE32(data + 4);
  FUZZ_CHECK(version == 3 || version == 5, "accepted version %u", version);
  FUZZ_CHECK(CheckFileConfig(m->config, "").ok(), "accepted config %s", m->config.ToString().c_str());
  const ParamLayout layout(m->config);
  const size_t elt = version == 3 ? 4 : 2;
  FUZZ_CHECK(m->params.size() == layout.total_numel() && size == 1024 + m->params.size() * elt,
             "%zu params from %zu bytes", m->params.size(), size);
  for (size_t i = 0; i < m->params.size(); i++) FUZZ_CHECK(std::isfinite(m->params[i]), "weight %zu not finite", i);
  // wte comes first in the file and first in the layout
  const size_t wte = layout.tensors()[0].numel;
  for (size_t i = 0; i < wte; i++) {
    float want;
    if (elt == 4) {
      std::memcpy(&want, data + 1024 + 4 * i, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, data + 1024 + 2 * i, 2);
      Bf16ToFloat(&b, &want, 1);
    }
    FUZZ_CHECK(std::memcmp(&want, &m->params[i], 4) == 0, "wte[%zu] differs from the file", i);
  }
  return 0;
}
