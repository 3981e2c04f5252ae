// The checkpoint subcommands: `ckpt verify PATH`, `ckpt inspect PATH` and
// `export PATH --out model.h5 [--llmc model.bin]`. PATH is a checkpoint directory
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
// Writes the full fp32 parameters as one HDF5 file (every tensor at its shape under its name)
// and, if out_llmc is not empty, as an llm.c model file (version 3).
Status RunExport(const std::string& path, const std::string& out_h5, const std::string& out_llmc);

}  // namespace shardgpt
