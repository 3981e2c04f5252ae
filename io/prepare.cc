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
#include "io/text_input.h"
#include "io/token_shard.h"

namespace shardgpt {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};

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

// Every input before anything is written: openable, a regular file, not empty. Adds the
// files' sizes to *total_bytes.
Status CheckInputs(const std::vector<std::string>& inputs, const std::string& out_dir, uint64_t* total_bytes) {
  namespace fs = std::filesystem;
  if (inputs.empty()) return Status::InvalidArgument(out_dir + ": no input files given (expected at least one text file)");
  for (const std::string& path : inputs) {
    std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
    if (!f) return Status::NotFound(path + ": cannot open (" + std::strerror(errno) + "); expected a readable text file");
    std::error_code ec;
    if (!fs::is_regular_file(path, ec))
      return Status::InvalidArgument(path + ": not a regular file (expected a text or JSONL file)");
    const uint64_t size = fs::file_size(path, ec);
    if (ec || size == 0) return Status::InvalidArgument(path + ": file is empty (expected text to tokenize)");
    *total_bytes += size;
  }
  return Status::OK();
}

Status CheckValFraction(const std::string& out_dir, double val_fraction) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    return Status::InvalidArgument(out_dir + ": val_fraction " + std::to_string(val_fraction) +
                                   " (expected 0 <= val_fraction < 1)");
  return Status::OK();
}

// The output of one prepare: ids are streamed into out_dir/train.bin.tmp (locked while it is
// written); Finish moves the last val_fraction of them to val.bin and renames the temporary
// onto train.bin. Until Finish succeeds, the destructor and SIGINT/SIGTERM/SIGHUP remove the
// temporary (and out_dir, if Open made it and it is empty).
class ShardWriter {
 public:
  explicit ShardWriter(int token_bytes) : width_(token_bytes) {}
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  ~ShardWriter() {
    if (out_ != nullptr) std::fclose(out_);
    on_signal_.reset();
    if (!armed_) return;
    if (!tmp_path_.empty()) std::remove(tmp_path_.c_str());
    std::error_code e;
    if (made_dir_) std::filesystem::remove(out_dir_, e);  // only if empty
  }

  Status Open(const std::string& out_dir) {
    namespace fs = std::filesystem;
    out_dir_ = out_dir;
    std::error_code ec;
    made_dir_ = !fs::exists(out_dir, ec);
    fs::create_directories(out_dir, ec);
    if (ec) return Status::IOError(out_dir + ": cannot create directory (" + ec.message() + ")");
    train_path_ = (fs::path(out_dir) / "train.bin").string();
    val_path_ = (fs::path(out_dir) / "val.bin").string();
    const std::string tmp = train_path_ + ".tmp";
    // The temporary is locked while this prepare writes it: a second prepare into the same
    // directory is refused instead of writing into the first one's file. A temporary left by a
    // killed prepare (SIGKILL; the other signals remove it) is not locked and is overwritten.
    const int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return Status::IOError(tmp + ": cannot create (" + std::strerror(errno) + ")");
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      close(fd);
      made_dir_ = false;  // not ours to remove: the other prepare's
      return Status::InvalidArgument(out_dir + ": another prepare is writing into this directory (" + tmp +
                                     " is locked; expected one prepare per output directory)");
    }
    tmp_path_ = tmp;
    on_signal_ = std::make_unique<SignalCleanup>(tmp_path_, made_dir_ ? out_dir : std::string());
    out_ = fdopen(fd, "w+b");
    if (out_ == nullptr) {
      close(fd);
      return Status::IOError(tmp_path_ + ": cannot create (" + std::strerror(errno) + ")");
    }
    if (ftruncate(fd, 0) != 0) return Status::IOError(tmp_path_ + ": cannot create (" + std::strerror(errno) + ")");
    const std::vector<unsigned char> zero_header(kTokenShardHeaderBytes, 0);
    if (std::fwrite(zero_header.data(), 1, zero_header.size(), out_) != zero_header.size())
      return Status::IOError(tmp_path_ + ": write failed (" + std::strerror(errno) + ")");
    return Status::OK();
  }

  const std::string& tmp_path() const { return tmp_path_; }
  uint64_t tokens() const { return tokens_; }

  // Appends n ids (each < 2^(8 * token_bytes)) in little endian.
  template <typename Id>
  Status Append(const Id* ids, size_t n) {
    raw_.resize(n * static_cast<size_t>(width_));
    unsigned char* r = raw_.data();
    for (size_t i = 0; i < n; i++) {
      const uint32_t v = static_cast<uint32_t>(ids[i]);
      for (int b = 0; b < width_; b++) *r++ = static_cast<unsigned char>(v >> (8 * b));
    }
    if (n > 0 && std::fwrite(raw_.data(), 1, raw_.size(), out_) != raw_.size())
      return Status::IOError(tmp_path_ + ": write failed (" + std::strerror(errno) + ")");
    tokens_ += n;
    return Status::OK();
  }

  Status Flush() {
    if (std::fflush(out_) != 0) return Status::IOError(tmp_path_ + ": write failed (" + std::strerror(errno) + ")");
    return Status::OK();
  }

  Status Finish(double val_fraction, PrepareStats* stats) {
    const uint64_t val = static_cast<uint64_t>(std::floor(static_cast<double>(tokens_) * val_fraction));
    const uint64_t train = tokens_ - val;
    if (train > kTokenShardMaxTokens)
      return Status::InvalidArgument(out_dir_ + ": " + std::to_string(train) +
                                     " training tokens do not fit one shard (expected at most 2147483647)");
    SHARDGPT_RETURN_IF_ERROR(Flush());
    const int fd = fileno(out_);
    const uint64_t w = static_cast<uint64_t>(width_);
    std::vector<uint32_t> val_ids(val);
    if (val > 0) {
      std::vector<unsigned char> raw(w * val);
      const ssize_t want = static_cast<ssize_t>(raw.size());
      if (pread(fd, raw.data(), raw.size(), static_cast<off_t>(kTokenShardHeaderBytes + w * train)) != want)
        return Status::IOError(tmp_path_ + ": read back failed (" + std::strerror(errno) + ")");
      for (uint64_t i = 0; i < val; i++) {
        uint32_t v = 0;
        for (uint64_t b = 0; b < w; b++) v |= static_cast<uint32_t>(raw[w * i + b]) << (8 * b);
        val_ids[i] = v;
      }
    }
    SHARDGPT_RETURN_IF_ERROR(WriteTokenShard(val_path_, val_ids, width_));
    unsigned char header[kTokenShardHeaderBytes];
    EncodeTokenShardHeader(width_, static_cast<int32_t>(train), header);
    // renamed while still locked: no second prepare can take the temporary before it is in place
    const bool ok = ftruncate(fd, static_cast<off_t>(kTokenShardHeaderBytes + w * train)) == 0 &&
                    pwrite(fd, header, sizeof(header), 0) == static_cast<ssize_t>(sizeof(header)) &&
                    std::rename(tmp_path_.c_str(), train_path_.c_str()) == 0;
    if (!ok) {
      const int err = errno;
      std::remove(val_path_.c_str());
      return Status::IOError(train_path_ + ": write failed (" + std::strerror(err) + ")");
    }
    std::FILE* f = out_;
    out_ = nullptr;
    if (std::fclose(f) != 0) {
      const int err = errno;
      std::remove(train_path_.c_str());
      std::remove(val_path_.c_str());
      return Status::IOError(train_path_ + ": write failed (" + std::strerror(err) + ")");
    }
    armed_ = false;
    if (stats) {
      stats->total_tokens = tokens_;
      stats->train_tokens = train;
      stats->val_tokens = val;
      stats->train_path = train_path_;
      stats->val_path = val_path_;
      stats->token_bytes = width_;
    }
    return Status::OK();
  }

 private:
  int width_;
  std::string out_dir_, train_path_, val_path_, tmp_path_;
  bool made_dir_ = false, armed_ = true;
  std::FILE* out_ = nullptr;
  std::unique_ptr<SignalCleanup> on_signal_;
  uint64_t tokens_ = 0;
  std::vector<unsigned char> raw_;
};

// SHARDGPT_TEST_HOLD_IN_PREPARE=1 (tests only): after the first block is written to the
// temporary, say so on stderr and wait for a signal, so that a test signals a prepare that is
// known to be mid-way, however fast the machine.
void TestHoldInPrepare(ShardWriter* out) {
  static bool held = false;
  if (held || std::getenv("SHARDGPT_TEST_HOLD_IN_PREPARE") == nullptr || !out->Flush().ok()) return;
  held = true;
  std::fprintf(stderr, "test hook: holding prepare with %s written\n", out->tmp_path().c_str());
  std::fflush(stderr);
  for (;;) pause();
}

}  // namespace

Status PrepareByteLevel(const std::vector<std::string>& inputs, const std::string& out_dir, double val_fraction,
                        PrepareStats* stats, const std::string& text_field) {
  SHARDGPT_RETURN_IF_ERROR(CheckValFraction(out_dir, val_fraction));
  uint64_t total_bytes = 0;
  SHARDGPT_RETURN_IF_ERROR(CheckInputs(inputs, out_dir, &total_bytes));
  ShardWriter out(2);
  SHARDGPT_RETURN_IF_ERROR(out.Open(out_dir));
  std::string text;
  for (const std::string& path : inputs) {
    auto reader = DocumentReader::Open(path, text_field);
    if (!reader.ok()) return reader.status();
    DocumentReader& in = *reader.value();
    for (;;) {
      bool more = false;
      SHARDGPT_RETURN_IF_ERROR(in.NextDocument(&more));
      if (!more) break;
      for (bool done = false; !done;) {  // documents follow each other with nothing in between
        text.clear();
        SHARDGPT_RETURN_IF_ERROR(in.Read(1 << 20, &text, &done));
        SHARDGPT_RETURN_IF_ERROR(out.Append(reinterpret_cast<const unsigned char*>(text.data()), text.size()));
      }
    }
  }
  SHARDGPT_RETURN_IF_ERROR(out.Finish(val_fraction, stats));
  if (stats) stats->input_bytes = total_bytes;
  return Status::OK();
}

}  // namespace shardgpt

// ---- PrepareBpe ----

namespace shardgpt {
namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A stretch of the batch text encoded on its own: bytes [begin, end) of the document named
// whats[what], starting `base` bytes into that document; `eot` puts the document separator
// (PrepareBpe's doc_start) before its ids (the first stretch of every document).
struct Piece {
  size_t begin, end;
  uint64_t base;
  bool eot;
  size_t what;
};

// Encodes pieces[i] into outs[i] on `threads` threads; the first error wins.
Status EncodeParallel(const BpeTokenizer& tok, const std::vector<std::string>& whats, const std::string& text,
                      const std::vector<Piece>& pieces, std::vector<std::vector<int32_t>>* outs, int threads) {
  outs->assign(pieces.size(), {});
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status first;
  auto work = [&] {
    BpeTokenizer::Session session(tok);
    for (size_t i; (i = next.fetch_add(1)) < pieces.size();) {
      const Piece& p = pieces[i];
      Status st = session.Encode(whats[p.what], text.data() + p.begin, p.end - p.begin, p.base, &(*outs)[i]);
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
  SHARDGPT_RETURN_IF_ERROR(CheckValFraction(out_dir, o.val_fraction));
  uint64_t total_bytes = 0;
  SHARDGPT_RETURN_IF_ERROR(CheckInputs(inputs, out_dir, &total_bytes));
  ShardWriter out(TokenBytesForVocab(tok.vocab_size()));
  SHARDGPT_RETURN_IF_ERROR(out.Open(out_dir));

  const double t0 = NowSeconds();
  const bool tty = isatty(2);
  double last_print = t0;
  uint64_t done_bytes = 0;
  auto progress = [&](bool final) {
    const double now = NowSeconds();
    if (!o.progress || (!final && now - last_print < (tty ? 0.2 : 5.0))) return;
    last_print = now;
    const double s = std::max(1e-9, now - t0);
    const uint64_t tokens = out.tokens();
    const int width = 30, filled = total_bytes ? static_cast<int>(width * std::min(done_bytes, total_bytes) / total_bytes) : width;
    std::fprintf(stderr, "%sprepare [%s%s] %5.1f%% %.1f/%.1f MB, %llu tokens, %.0f tokens/s, %.2f MB/s%s",
                 tty ? "\r" : "", std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                 total_bytes ? 100.0 * std::min(done_bytes, total_bytes) / total_bytes : 100.0, done_bytes / 1e6,
                 total_bytes / 1e6, static_cast<unsigned long long>(tokens), tokens / s, done_bytes / 1e6 / s,
                 tty && !final ? "" : "\n");
  };

  // Batches of about 4 MB of text per thread, from one or many documents; pieces of about
  // 256 KB, each cut at a safe point inside one document.
  const size_t block = static_cast<size_t>(std::max(1, o.threads)) * (4u << 20), piece_bytes = 256u << 10;
  // what goes before each document: <|endoftext|>, else the template's prefix (<|begin_of_text|>)
  const std::vector<int32_t> doc_start =
      tok.eot_token() >= 0 ? std::vector<int32_t>{tok.eot_token()} : tok.text_prefix();
  std::string text;                 // the batch's unencoded text
  std::vector<Piece> segs;          // the batch's documents (or parts of one), in order
  std::vector<std::string> whats;   // where each is, for encoding errors
  std::vector<std::vector<int32_t>> outs;
  auto flush = [&]() -> Status {
    std::vector<Piece> pieces;
    for (const Piece& s : segs) {
      if (s.begin == s.end) pieces.push_back(s);  // an empty document still gets its end-of-text
      for (size_t at = s.begin; at < s.end;) {
        size_t end = s.end;
        if (s.end - at > piece_bytes) {
          size_t cut = tok.SafeCut(text.data(), at + 1, at + piece_bytes);
          if (cut == 0) cut = tok.SafeCut(text.data(), at + 1, s.end);
          if (cut > at) end = cut;
        }
        pieces.push_back({at, end, s.base + (at - s.begin), s.eot && at == s.begin, s.what});
        at = end;
      }
    }
    SHARDGPT_RETURN_IF_ERROR(EncodeParallel(tok, whats, text, pieces, &outs, o.threads));
    for (size_t i = 0; i < pieces.size(); i++) {
      if (pieces[i].eot && !doc_start.empty()) SHARDGPT_RETURN_IF_ERROR(out.Append(doc_start.data(), doc_start.size()));
      SHARDGPT_RETURN_IF_ERROR(out.Append(outs[i].data(), outs[i].size()));
    }
    if (!pieces.empty()) TestHoldInPrepare(&out);
    text.clear();
    segs.clear();
    whats.clear();
    return Status::OK();
  };

  uint64_t finished_bytes = 0;  // sizes of the inputs read whole
  for (const std::string& path : inputs) {
    auto reader = DocumentReader::Open(path, o.text_field);
    if (!reader.ok()) return reader.status();
    DocumentReader& in = *reader.value();
    for (;;) {
      bool more = false;
      SHARDGPT_RETURN_IF_ERROR(in.NextDocument(&more));
      if (!more) break;
      whats.push_back(in.where());
      size_t begin = text.size();
      uint64_t base = 0;  // bytes of this document encoded in earlier batches
      for (bool done = false; !done;) {
        SHARDGPT_RETURN_IF_ERROR(in.Read(text.size() < block ? block - text.size() : block, &text, &done));
        if (done) {
          segs.push_back({begin, text.size(), base, base == 0, whats.size() - 1});
          break;
        }
        if (text.size() < block) continue;
        // the batch is full inside a document: encode it up to the document's last safe cut
        // and carry the rest over (no safe cut yet: read more of the document first)
        const size_t cut = tok.SafeCut(text.data(), begin + 1, text.size());
        if (cut == 0) continue;
        segs.push_back({begin, cut, base, base == 0, whats.size() - 1});
        std::string rest = text.substr(cut);
        text.resize(cut);
        base += cut - begin;
        SHARDGPT_RETURN_IF_ERROR(flush());
        text = std::move(rest);
        whats.push_back(in.where());
        begin = 0;
        done_bytes = finished_bytes + in.file_bytes_read();
        progress(false);
      }
      if (text.size() >= block) SHARDGPT_RETURN_IF_ERROR(flush());
      done_bytes = finished_bytes + in.file_bytes_read();
      progress(false);
    }
    std::error_code ec;
    finished_bytes += fs::file_size(path, ec);
    done_bytes = finished_bytes;
  }
  SHARDGPT_RETURN_IF_ERROR(flush());
  progress(true);
  const double seconds = NowSeconds() - t0;
  SHARDGPT_RETURN_IF_ERROR(out.Finish(o.val_fraction, stats));
  if (stats) {
    stats->input_bytes = total_bytes;
    stats->seconds = seconds;
  }
  return Status::OK();
}

}  // namespace shardgpt
