#include "io/prepare.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

#include "io/token_shard.h"
#include "io/tokenizer.h"

namespace shardgpt {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};

// Appends the whole file to *out.
Status AppendFile(const std::string& path, std::string* out) {
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) {
    return Status::NotFound(path + ": cannot open (" + std::strerror(errno) + "); expected a readable text file");
  }
  const size_t before = out->size();
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f.get())) > 0) out->append(buf, n);
  // fopen succeeds on a directory; the read error (EISDIR) shows up here.
  if (std::ferror(f.get())) {
    return Status::IOError(path + ": read failed (" + std::strerror(errno) + "); expected a readable text file");
  }
  if (out->size() == before) {
    return Status::InvalidArgument(path + ": file is empty (expected text to tokenize)");
  }
  return Status::OK();
}

}  // namespace

Status PrepareByteLevel(const std::vector<std::string>& inputs, const std::string& out_dir, double val_fraction,
                        PrepareStats* stats) {
  if (inputs.empty()) {
    return Status::InvalidArgument(out_dir + ": no input files given (expected at least one text file)");
  }
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    return Status::InvalidArgument(out_dir + ": val_fraction " + std::to_string(val_fraction) +
                                   " (expected 0 <= val_fraction < 1)");
  }
  std::string text;
  for (const std::string& path : inputs) SHARDGPT_RETURN_IF_ERROR(AppendFile(path, &text));

  const std::vector<uint16_t> tokens = ByteLevelTokenizer::Encode(text);
  const uint64_t total = tokens.size();
  const uint64_t val = static_cast<uint64_t>(std::floor(static_cast<double>(total) * val_fraction));
  const uint64_t train = total - val;
  if (train > kTokenShardMaxTokens) {
    return Status::InvalidArgument(out_dir + ": " + std::to_string(train) +
                                   " training tokens do not fit one shard (expected at most 2147483647)");
  }

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) {
    return Status::IOError(out_dir + ": cannot create directory (" + ec.message() + ")");
  }
  const std::string train_path = (std::filesystem::path(out_dir) / "train.bin").string();
  const std::string val_path = (std::filesystem::path(out_dir) / "val.bin").string();
  SHARDGPT_RETURN_IF_ERROR(
      WriteTokenShard(train_path, std::vector<uint16_t>(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(train))));
  SHARDGPT_RETURN_IF_ERROR(
      WriteTokenShard(val_path, std::vector<uint16_t>(tokens.begin() + static_cast<ptrdiff_t>(train), tokens.end())));

  if (stats) {
    stats->total_tokens = total;
    stats->train_tokens = train;
    stats->val_tokens = val;
    stats->train_path = train_path;
    stats->val_path = val_path;
  }
  return Status::OK();
}

}  // namespace shardgpt
