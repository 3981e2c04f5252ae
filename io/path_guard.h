// Refuses a command's output path that would overwrite one of its own inputs.
//
// Every command with file outputs (train, eval, export, prepare) lists its outputs and
// inputs (AddModelInput for a model path) and calls CheckOutputsAgainstInputs before it
// writes anything. Two
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
// directories nothing may be written into (the checkpoint or Hugging Face directory a
// command reads). Two outputs that are the same file are refused too. Empty paths are skipped.
Status CheckOutputsAgainstInputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& input_files,
                                 const std::vector<NamedPath>& input_dirs);

// The paths a model input names, for CheckOutputsAgainstInputs: a directory (a Hugging Face
// GPT-2 directory, a checkpoint, a --ckpt-dir) is an input directory as a whole; a file is an
// input file, and a .safetensors file brings its directory's config.json (read with it).
// Nothing is added for an empty path.
void AddModelInput(const std::string& flag, const std::string& path, std::vector<NamedPath>* files,
                   std::vector<NamedPath>* dirs);

// OK, or an InvalidArgument naming a file of `b` that is also a file of `a` (same device and
// inode, or the same canonical path): "--val-data D/val.bin is also a --data file (D/val.bin):
// <why>". For validation shards that the training pattern matches too.
Status CheckDisjointInputs(const std::vector<NamedPath>& a, const std::vector<NamedPath>& b, const std::string& why);

}  // namespace shardgpt
