// Refuses a command's output path that would overwrite one of its own inputs.
//
// Every command with file outputs (train, export, prepare) lists its
// outputs and inputs and calls CheckOutputsAgainstInputs before it writes anything. Two
// paths are the same file when they name the same device and inode (hard links, symlinks)
// or, for an output that does not exist yet, the same canonical path (realpath of its
// directory, then its name); an output is inside an input directory (a checkpoint being
// read) when its canonical path starts with the directory's.
//
// Thread-safe (reads the file system only).
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace shardgpt {

// A path with the flag that named it, for the message ("--out x.h5").
struct NamedPath {
  std::string flag;
  std::string path;
};

// OK, or an InvalidArgument naming the output and the input it would overwrite:
// "--out CK/rank_00000.h5 would overwrite the input checkpoint CK (...)". `input_dirs` are
// directories nothing may be written into (the checkpoint a command reads). Two outputs
// that are the same file are refused too. Empty paths are skipped.
Status CheckOutputsAgainstInputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& input_files,
                                 const std::vector<NamedPath>& input_dirs);

}  // namespace shardgpt
