// The checkpoint subcommands: `ckpt verify PATH`, `ckpt inspect PATH` and
// `export PATH [--out model.h5] [--llmc model.bin] [--hf DIR]`. PATH is a checkpoint directory
// (DIR/step_XXXXXXXX), or a --ckpt-dir whose `latest` file names one.
//
// Rank contract: local, single process (run them without mpirun or on one rank only). They
// print to stdout on success and return one line naming the file and the problem otherwise.
#pragma once

#include <string>

#include "base/status.h"

namespace shardgpt {

// Reads every shard file fully: sizes, HDF5 structure, Fletcher32 chunk checksums and the
// index's CRC-32C per dataset. Prints "ok: ..." with what was checked.
Status RunCkptVerify(const std::string& path);
// Prints the index: format, model config, training state, saving rank count and stage, the
// shard files (elements, bytes, checksums) and the tensor table (name, shape, unit, offset).
Status RunCkptInspect(const std::string& path);
// Writes the full fp32 parameters as one HDF5 file (every tensor at its shape under its name),
// as an llm.c model file (version 3, gpt2 only) and/or as a Hugging Face directory (config.json +
// safetensors, fp32 or bf16: GPT2LMHeadModel, io/hf_gpt2.h, or for --arch llama LlamaForCausalLM,
// io/hf_llama.h, sharded above HfMaxShardBytes()): each output whose path is not empty, at least
// one. PATH may also be an llm.c model file or an HF directory.
struct ExportOptions {
  std::string out_h5, out_llmc, out_hf;
  std::string hf_dtype = "fp32";  // fp32 or bf16
};
Status RunExport(const std::string& path, const ExportOptions& options);
inline Status RunExport(const std::string& path, const std::string& out_h5, const std::string& out_llmc) {
  return RunExport(path, ExportOptions{out_h5, out_llmc, "", "fp32"});
}

}  // namespace shardgpt
