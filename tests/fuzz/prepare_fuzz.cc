// Fuzz target: prepare's text input (io/prepare.h, PrepareByteLevel).
// Input: byte 0 picks val_fraction (some invalid: NaN, 1, negative), byte 1 where the text
// splits into two input files (0: one file), the rest is the text. Contract: success exactly
// when every input is non-empty and 0 <= val_fraction < 1; then train.bin + val.bin read back
// as valid token shards whose tokens are the text's bytes in order, the last
// floor(total * val_fraction) of them in val.bin. Otherwise one error line. An input that
// starts with gzip's magic (1f 8b) is read decompressed: then only "a result or one error line
// naming a path under the scratch directory" is checked.
#include <cmath>
#include <filesystem>
#include <limits>
#include <vector>

#include "fuzz_util.h"
#include "io/prepare.h"
#include "io/token_shard.h"

using namespace shardgpt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  double vf;
  switch (data[0] % 8) {
    case 0: vf = std::numeric_limits<double>::quiet_NaN(); break;
    case 1: vf = 1.0; break;
    case 2: vf = -0.0; break;
    case 3: vf = -0.25; break;
    default: vf = data[0] / 256.0; break;
  }
  const uint8_t* text = data + 2;
  const size_t n = size - 2, split = data[1];
  const std::string dir = fuzz::ScratchDir();
  std::vector<std::string> inputs = {dir + "/a.txt"};
  if (split == 0 || split > n) {
    fuzz::WriteBytes(inputs[0], text, n);
  } else {
    inputs.push_back(dir + "/b.txt");
    fuzz::WriteBytes(inputs[0], text, split);
    fuzz::WriteBytes(inputs[1], text + split, n - split);
  }
  const std::string out = dir + "/out";
  std::filesystem::remove_all(out);
  PrepareStats stats;
  const Status st = PrepareByteLevel(inputs, out, vf, &stats);
  auto gzip_magic = [](const uint8_t* p, size_t k) { return k >= 2 && p[0] == 0x1f && p[1] == 0x8b; };
  const bool gzip = inputs.size() == 1 ? gzip_magic(text, n) : (gzip_magic(text, split) || gzip_magic(text + split, n - split));
  if (gzip) {
    if (!st.ok()) fuzz::CheckError(st, vf >= 0.0 && vf < 1.0 ? dir : out);
    return 0;
  }
  const bool nonempty = inputs.size() == 1 ? n > 0 : (split > 0 && n - split > 0);
  const bool should = nonempty && vf >= 0.0 && vf < 1.0;
  FUZZ_CHECK(st.ok() == should, "ok=%d for val_fraction %g and %zu bytes (%s)", st.ok(), vf, n,
             st.message().c_str());
  if (!st.ok()) {
    fuzz::CheckError(st, vf >= 0.0 && vf < 1.0 ? inputs[0].substr(0, dir.size()) : out);
    return 0;
  }
  auto train = ReadTokenShard(stats.train_path);
  auto val = ReadTokenShard(stats.val_path);
  FUZZ_CHECK(train.ok() && val.ok(), "outputs do not read back");
  const uint64_t want_val = static_cast<uint64_t>(std::floor(n * vf));
  const std::vector<uint32_t>& t = train->ids;
  const std::vector<uint32_t>& v = val->ids;
  FUZZ_CHECK(train->token_bytes == 2 && val->token_bytes == 2, "byte-level shards are not uint16");
  FUZZ_CHECK(v.size() == want_val && t.size() + v.size() == n && stats.total_tokens == n &&
                 stats.val_tokens == want_val,
             "split %zu + %zu of %zu", t.size(), v.size(), n);
  for (size_t i = 0; i < n; i++) {
    const uint32_t tok = i < t.size() ? t[i] : v[i - t.size()];
    FUZZ_CHECK(tok == text[i], "token %zu is not the text's byte", i);
  }
  return 0;
}
