#include "io/prepare.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <thread>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

#include "io/bpe_tokenizer.h"
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

// ---- PrepareBpe ----

namespace shardgpt {
namespace {

// Removes a temporary file (and the directory made for it, when that is then empty) when the
// process gets SIGINT, SIGTERM or SIGHUP while the guard lives, then dies by that signal as it
// would have without the guard; the previous handlers come back when it ends. One guard at a
// time per process; the handler only calls async-signal-safe functions.
char g_cleanup_file[4096];
char g_cleanup_dir[4096];
void CleanupAndDie(int sig) {
  if (g_cleanup_file[0] != '\0') unlink(g_cleanup_file);
  if (g_cleanup_dir[0] != '\0') rmdir(g_cleanup_dir);
  signal(sig, SIG_DFL);
  raise(sig);  // delivered when the handler returns
}
class SignalCleanup {
 public:
  SignalCleanup(const std::string& file, const std::string& dir) {
    std::snprintf(g_cleanup_file, sizeof(g_cleanup_file), "%s", file.c_str());
    std::snprintf(g_cleanup_dir, sizeof(g_cleanup_dir), "%s", dir.c_str());
    struct sigaction sa {};
    sa.sa_handler = CleanupAndDie;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; i++) sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~SignalCleanup() {
    for (int i = 0; i < 3; i++) sigaction(kSignals[i], &old_[i], nullptr);
    g_cleanup_file[0] = g_cleanup_dir[0] = '\0';
  }
  SignalCleanup(const SignalCleanup&) = delete;
  SignalCleanup& operator=(const SignalCleanup&) = delete;

 private:
  static constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction old_[3];
};

// SHARDGPT_TEST_HOLD_IN_PREPARE=1 (tests only): after the first block is written to the
// temporary, say so on stderr and wait for a signal, so that a test signals a prepare that is
// known to be mid-way, however fast the machine.
void TestHoldInPrepare(const std::string& tmp_path) {
  static bool held = false;
  if (held || std::getenv("SHARDGPT_TEST_HOLD_IN_PREPARE") == nullptr) return;
  held = true;
  std::fprintf(stderr, "test hook: holding prepare with %s written\n", tmp_path.c_str());
  std::fflush(stderr);
  for (;;) pause();
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Encodes pieces[i] into outs[i] on `threads` threads; the first error wins.
Status EncodeParallel(const BpeTokenizer& tok, const std::string& what, const std::string& text,
                      const std::vector<std::pair<size_t, size_t>>& pieces, uint64_t base,
                      std::vector<std::vector<int32_t>>* outs, int threads) {
  outs->assign(pieces.size(), {});
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status first;
  auto work = [&] {
    BpeTokenizer::Session session(tok);
    for (size_t i; (i = next.fetch_add(1)) < pieces.size();) {
      Status st = session.Encode(what, text.data() + pieces[i].first, pieces[i].second - pieces[i].first,
                                 base + pieces[i].first, &(*outs)[i]);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first.ok()) first = st;
        next = pieces.size();
      }
    }
  };
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(pieces.size())));
  std::vector<std::thread> pool;
  for (int t = 1; t < n; t++) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  return first;
}

}  // namespace

Status PrepareBpe(const BpeTokenizer& tok, const std::vector<std::string>& inputs, const std::string& out_dir,
                  const BpePrepareOptions& o, PrepareStats* stats) {
  namespace fs = std::filesystem;
  if (inputs.empty()) return Status::InvalidArgument(out_dir + ": no input files given (expected at least one text file)");
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0))
    return Status::InvalidArgument(out_dir + ": val_fraction " + std::to_string(o.val_fraction) +
                                   " (expected 0 <= val_fraction < 1)");
  if (tok.vocab_size() > 65535)
    return Status::InvalidArgument("tokenizer: vocabulary of " + std::to_string(tok.vocab_size()) +
                                   " ids does not fit uint16 token shards (expected at most 65535)");
  uint64_t total_bytes = 0;
  for (const std::string& path : inputs) {  // every input before anything is written
    std::error_code ec;
    if (!fs::is_regular_file(path, ec))
      return Status::NotFound(path + ": not a readable file (expected a text file)");
    const uint64_t size = fs::file_size(path, ec);
    if (ec || size == 0) return Status::InvalidArgument(path + ": file is empty (expected text to tokenize)");
    std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
    if (!f) return Status::NotFound(path + ": cannot open (" + std::strerror(errno) + "); expected a readable text file");
    total_bytes += size;
  }
  std::error_code ec;
  const bool made_dir = !fs::exists(out_dir, ec);
  fs::create_directories(out_dir, ec);
  if (ec) return Status::IOError(out_dir + ": cannot create directory (" + ec.message() + ")");
  const std::string train_path = (fs::path(out_dir) / "train.bin").string();
  const std::string val_path = (fs::path(out_dir) / "val.bin").string();
  const std::string tmp_path = train_path + ".tmp";
  // The temporary is locked while this prepare writes it: a second prepare into the same
  // directory is refused instead of writing into the first one's file. A temporary left by a
  // killed prepare (SIGKILL; the other signals remove it) is not locked and is overwritten.
  const int tmp_fd = open(tmp_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (tmp_fd < 0) {
    const int err = errno;
    std::error_code e;
    if (made_dir) fs::remove(out_dir, e);
    return Status::IOError(tmp_path + ": cannot create (" + std::strerror(err) + ")");
  }
  if (flock(tmp_fd, LOCK_EX | LOCK_NB) != 0) {
    close(tmp_fd);
    return Status::InvalidArgument(out_dir + ": another prepare is writing into this directory (" + tmp_path +
                                   " is locked; expected one prepare per output directory)");
  }
  struct Cleanup {  // nothing left behind on error: the temporary, and the directory if we made it
    std::string path, dir;
    bool armed = true;
    ~Cleanup() {
      if (!armed) return;
      std::remove(path.c_str());
      std::error_code e;
      if (!dir.empty()) std::filesystem::remove(dir, e);  // only if empty
    }
  } cleanup{tmp_path, made_dir ? out_dir : std::string()};
  const SignalCleanup on_signal(tmp_path, made_dir ? out_dir : std::string());
  std::unique_ptr<std::FILE, FileCloser> out(fdopen(tmp_fd, "w+b"));
  if (!out || ftruncate(tmp_fd, 0) != 0) {
    if (!out) close(tmp_fd);
    return Status::IOError(tmp_path + ": cannot create (" + std::strerror(errno) + ")");
  }
  const std::vector<unsigned char> zero_header(kTokenShardHeaderBytes, 0);
  if (std::fwrite(zero_header.data(), 1, zero_header.size(), out.get()) != zero_header.size())
    return Status::IOError(tmp_path + ": write failed (" + std::strerror(errno) + ")");

  const double t0 = NowSeconds();
  const bool tty = isatty(2);
  double last_print = t0;
  uint64_t tokens = 0, done_bytes = 0;
  std::vector<uint16_t> buf16;
  auto emit = [&](const std::vector<int32_t>& ids) -> Status {
    buf16.resize(ids.size());
    for (size_t i = 0; i < ids.size(); i++) buf16[i] = static_cast<uint16_t>(ids[i]);  // ids < vocab <= 65535
    if (!buf16.empty() && std::fwrite(buf16.data(), 2, buf16.size(), out.get()) != buf16.size())
      return Status::IOError(tmp_path + ": write failed (" + std::strerror(errno) + ")");
    tokens += ids.size();
    return Status::OK();
  };
  auto progress = [&](bool final) {
    const double now = NowSeconds();
    if (!o.progress || (!final && now - last_print < (tty ? 0.2 : 5.0))) return;
    last_print = now;
    const double s = std::max(1e-9, now - t0);
    const int width = 30, filled = total_bytes ? static_cast<int>(width * done_bytes / total_bytes) : width;
    std::fprintf(stderr, "%sprepare [%s%s] %5.1f%% %.1f/%.1f MB, %llu tokens, %.0f tokens/s, %.2f MB/s%s",
                 tty ? "\r" : "", std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                 total_bytes ? 100.0 * done_bytes / total_bytes : 100.0, done_bytes / 1e6, total_bytes / 1e6,
                 static_cast<unsigned long long>(tokens), tokens / s, done_bytes / 1e6 / s, tty && !final ? "" : "\n");
  };

  // blocks of about 4 MB per thread; pieces of about 256 KB, each cut at a safe point
  const size_t block = static_cast<size_t>(std::max(1, o.threads)) * (4u << 20), piece = 256u << 10;
  std::vector<std::vector<int32_t>> outs;
  std::vector<int32_t> eot;
  if (tok.eot_token() >= 0) eot.push_back(tok.eot_token());
  for (const std::string& path : inputs) {
    std::unique_ptr<std::FILE, FileCloser> in(std::fopen(path.c_str(), "rb"));
    if (!in) return Status::NotFound(path + ": cannot open (" + std::strerror(errno) + ")");
    SHARDGPT_RETURN_IF_ERROR(emit(eot));
    std::string text;       // unencoded text, starting at file offset `base`
    uint64_t base = 0;
    bool eof = false;
    while (!eof || !text.empty()) {
      if (!eof) {
        const size_t had = text.size();
        text.resize(had + block);
        const size_t n = std::fread(text.data() + had, 1, block, in.get());
        text.resize(had + n);
        if (std::ferror(in.get())) return Status::IOError(path + ": read failed (" + std::strerror(errno) + ")");
        eof = n < block;
      }
      // the part of text that can be encoded now: all of it at the end of the file, else up to
      // the last safe cut (none: read more first)
      size_t usable = text.size();
      if (!eof) {
        usable = tok.SafeCut(text.data(), 0, text.size());
        if (usable == 0) continue;
      }
      std::vector<std::pair<size_t, size_t>> pieces;
      for (size_t at = 0; at < usable;) {
        size_t end = usable;
        if (usable - at > piece) {
          size_t cut = tok.SafeCut(text.data(), at, at + piece);
          if (cut == 0) cut = tok.SafeCut(text.data(), at, usable);
          if (cut > at) end = cut;
        }
        pieces.emplace_back(at, end);
        at = end;
      }
      SHARDGPT_RETURN_IF_ERROR(EncodeParallel(tok, path, text, pieces, base, &outs, o.threads));
      for (const auto& ids : outs) SHARDGPT_RETURN_IF_ERROR(emit(ids));
      if (std::getenv("SHARDGPT_TEST_HOLD_IN_PREPARE") != nullptr && std::fflush(out.get()) == 0) TestHoldInPrepare(tmp_path);
      text.erase(0, usable);
      base += usable;
      done_bytes += usable;
      progress(false);
    }
  }
  progress(true);
  const double seconds = NowSeconds() - t0;

  const uint64_t val = static_cast<uint64_t>(std::floor(static_cast<double>(tokens) * o.val_fraction));
  const uint64_t train = tokens - val;
  if (train > kTokenShardMaxTokens)
    return Status::InvalidArgument(out_dir + ": " + std::to_string(train) +
                                   " training tokens do not fit one shard (expected at most 2147483647)");
  if (std::fflush(out.get()) != 0) return Status::IOError(tmp_path + ": write failed (" + std::strerror(errno) + ")");
  std::vector<uint16_t> val_tokens(val);
  if (val > 0) {
    const int fd = fileno(out.get());
    const ssize_t want = static_cast<ssize_t>(2 * val);
    if (pread(fd, val_tokens.data(), want, static_cast<off_t>(kTokenShardHeaderBytes + 2 * train)) != want)
      return Status::IOError(tmp_path + ": read back failed (" + std::strerror(errno) + ")");
  }
  SHARDGPT_RETURN_IF_ERROR(WriteTokenShard(val_path, val_tokens));
  unsigned char header[kTokenShardHeaderBytes] = {};
  const int32_t h[3] = {kTokenShardMagic, kTokenShardVersion, static_cast<int32_t>(train)};
  for (int i = 0; i < 3; i++)
    for (int b = 0; b < 4; b++) header[4 * i + b] = static_cast<unsigned char>(static_cast<uint32_t>(h[i]) >> (8 * b));
  const int fd = fileno(out.get());
  // renamed while still locked: no second prepare can take the temporary before it is in place
  const bool ok = ftruncate(fd, static_cast<off_t>(kTokenShardHeaderBytes + 2 * train)) == 0 &&
                  pwrite(fd, header, sizeof(header), 0) == static_cast<ssize_t>(sizeof(header)) &&
                  std::rename(tmp_path.c_str(), train_path.c_str()) == 0;
  if (!ok) {
    const int err = errno;
    std::remove(val_path.c_str());
    return Status::IOError(train_path + ": write failed (" + std::strerror(err) + ")");
  }
  if (std::fclose(out.release()) != 0) {
    const int err = errno;
    std::remove(train_path.c_str());
    std::remove(val_path.c_str());
    return Status::IOError(train_path + ": write failed (" + std::strerror(err) + ")");
  }
  cleanup.armed = false;
  if (stats) {
    stats->total_tokens = tokens;
    stats->train_tokens = train;
    stats->val_tokens = val;
    stats->train_path = train_path;
    stats->val_path = val_path;
    stats->input_bytes = total_bytes;
    stats->seconds = seconds;
  }
  return Status::OK();
}

}  // namespace shardgpt
