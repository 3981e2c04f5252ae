// The async-signal-safe flight dump writer (see the header). Nothing here allocates, locks or
// calls stdio while dumping: a fixed buffer and write(2).
#include "parallel/flight_dump.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <string>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "parallel/flight_recorder.h"

namespace shardgpt {

namespace {

constexpr int kSchemaVersion = 1;

// Formatted once by ConfigureFlightDumps; read-only afterwards (signal handlers read them).
char g_dir[1024];
char g_identity[16384];  // the job fields of the JSON object, ending with a comma
int g_rank = 0;
std::atomic<bool> g_configured{false};
std::atomic<bool> g_dumping{false};
std::atomic<bool> g_dumped_once{false};
// For the job's verdict (not read by signal handlers).
std::string g_dir_str, g_run_id;
std::atomic<JobVerdictFn> g_verdict_fn{nullptr};

// DIR/verdict_<run id><suffix>, the run id reduced to file-name characters.
std::string VerdictFile(const char* suffix) {
  std::string id;
  for (char c : g_run_id) id += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-') ? c : '_';
  return g_dir_str + "/verdict_" + id + suffix;
}

// A fixed-buffer writer on a file descriptor; the first failed write sticks.
class Out {
 public:
  explicit Out(int fd) : fd_(fd) {}
  bool ok() const { return ok_; }
  void Flush() {
    size_t off = 0;
    while (ok_ && off < n_) {
      const ssize_t w = write(fd_, buf_ + off, n_ - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) ok_ = false;
      else off += static_cast<size_t>(w);
    }
    n_ = 0;
  }
  void Raw(const char* s) {
    while (*s) Char(*s++);
  }
  void Char(char c) {
    if (n_ == sizeof(buf_)) Flush();
    buf_[n_++] = c;
  }
  void Str(const char* s) {  // a JSON string
    Char('"');
    for (; *s; s++) {
      const unsigned char c = static_cast<unsigned char>(*s);
      if (c == '"' || c == '\\') Char('\\'), Char(static_cast<char>(c));
      else if (c < 0x20) Raw("\\u00"), Char("0123456789abcdef"[c >> 4]), Char("0123456789abcdef"[c & 15]);
      else Char(static_cast<char>(c));
    }
    Char('"');
  }
  void Int(int64_t v) {
    if (v < 0) {
      Char('-');
      Uint(static_cast<uint64_t>(-(v + 1)) + 1);
    } else {
      Uint(static_cast<uint64_t>(v));
    }
  }
  void Uint(uint64_t v) {
    char d[24];
    int i = 0;
    do d[i++] = static_cast<char>('0' + v % 10), v /= 10;
    while (v);
    while (i) Char(d[--i]);
  }
  void Key(const char* k) {
    Str(k);
    Char(':');
  }

 private:
  int fd_;
  bool ok_ = true;
  size_t n_ = 0;
  char buf_[8192];
};

// dst = a + b (+ c), truncated to n bytes; async-signal-safe.
void Join(char* dst, size_t n, const char* a, const char* b, const char* c = "") {
  size_t i = 0;
  for (const char* s : {a, b, c})
    for (; *s && i + 1 < n; s++) dst[i++] = *s;
  dst[i] = '\0';
}

void FormatUint(char* dst, uint64_t v, int width) {  // zero-padded to `width` digits
  char d[24];
  int i = 0;
  do d[i++] = static_cast<char>('0' + v % 10), v /= 10;
  while (v);
  int o = 0;
  for (int pad = width - i; pad > 0; pad--) dst[o++] = '0';
  while (i) dst[o++] = d[--i];
  dst[o] = '\0';
}

// mkdir -p of g_dir (async-signal-safe).
bool MakeDirs() {
  char path[sizeof(g_dir)];
  std::memcpy(path, g_dir, sizeof(path));
  for (char* p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(path, 0755) != 0 && errno != EEXIST) return false;
    *p = '/';
  }
  return mkdir(path, 0755) == 0 || errno == EEXIST;
}

void WriteRing(Out& out, const FlightRing& ring) {
  out.Char('{');
  out.Key("name"), out.Str(ring.name()), out.Char(',');
  out.Key("rank"), out.Int(ring.rank()), out.Char(',');
  out.Key("ranks"), out.Char('[');
  for (size_t i = 0; i < ring.world_ranks().size(); i++) {
    if (i) out.Char(',');
    out.Int(ring.world_ranks()[i]);
  }
  out.Raw("],");
  out.Key("capacity"), out.Uint(ring.capacity()), out.Char(',');
  const uint64_t last = ring.last_seq();
  out.Key("last_seq"), out.Uint(last), out.Char(',');
  out.Key("entries"), out.Char('[');
  const uint64_t first = last > ring.capacity() ? last - ring.capacity() + 1 : 1;
  bool comma = false;
  for (uint64_t s = first; s <= last && s != 0; s++) {
    FlightEntry e;
    if (!ring.Read(s, &e)) continue;
    if (comma) out.Char(',');
    comma = true;
    out.Char('{');
    out.Key("seq"), out.Uint(e.seq), out.Char(',');
    out.Key("op"), out.Str(FlightOpName(e.op)), out.Char(',');
    out.Key("dtype"), out.Str(e.dtype == DType::kF32 ? "f32" : "bf16"), out.Char(',');
    out.Key("count"), out.Uint(e.count), out.Char(',');
    out.Key("bytes"), out.Uint(e.bytes), out.Char(',');
    out.Key("unit"), out.Int(e.unit), out.Char(',');
    out.Key("step"), out.Int(e.step), out.Char(',');
    out.Key("micro"), out.Int(e.micro), out.Char(',');
    out.Key("state"), out.Str(FlightStateName(e.state)), out.Char(',');
    out.Key("queued_ns"), out.Int(e.queued_ns), out.Char(',');
    out.Key("started_ns"), out.Int(e.started_ns), out.Char(',');
    out.Key("completed_ns"), out.Int(e.completed_ns);
    out.Char('}');
  }
  out.Raw("]}");
}

int Dump(const char* reason) {
  if (!g_configured.load() || g_dir[0] == '\0') return -1;
  if (g_dumping.exchange(true)) return -1;
  struct Reset {
    ~Reset() { g_dumping.store(false); }
  } reset;
  if (!MakeDirs()) return -1;
  char rank[16], pid[24], tmp[sizeof(g_dir) + 64];
  FormatUint(rank, static_cast<uint64_t>(g_rank), 5);
  FormatUint(pid, static_cast<uint64_t>(getpid()), 1);
  char name[64];
  Join(name, sizeof(name), "/.rank_", rank, ".");
  char tail[64];
  Join(tail, sizeof(tail), pid, ".tmp");
  Join(tmp, sizeof(tmp), g_dir, name, tail);
  const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  Out out(fd);
  timespec wall;
  clock_gettime(CLOCK_REALTIME, &wall);
  const FlightContext ctx = ReadFlightContext();
  const int64_t now = FlightNowNs();
  out.Char('{');
  out.Key("schema"), out.Str("shardgpt-flight"), out.Char(',');
  out.Key("version"), out.Int(kSchemaVersion), out.Char(',');
  out.Raw(g_identity);
  out.Key("reason"), out.Str(reason), out.Char(',');
  out.Key("pid"), out.Int(getpid()), out.Char(',');
  out.Key("time_unix"), out.Int(wall.tv_sec), out.Char(',');
  out.Key("now_ns"), out.Int(now), out.Char(',');
  out.Key("phase"), out.Char('{');
  out.Key("name"), out.Str(FlightPhaseName(ctx.phase)), out.Char(',');
  out.Key("unit"), out.Int(ctx.phase_unit), out.Char(',');
  out.Key("since_ns"), out.Int(ctx.phase_since_ns), out.Char(',');
  out.Key("step"), out.Int(ctx.step), out.Char(',');
  out.Key("micro"), out.Int(ctx.micro);
  out.Raw("},");
  out.Key("communicators"), out.Char('[');
  bool comma = false;
  for (int i = 0; i < kMaxFlightRings; i++) {
    const FlightRing* ring = FlightRingAt(i);
    if (ring == nullptr) continue;
    if (comma) out.Char(',');
    comma = true;
    WriteRing(out, *ring);
  }
  out.Raw("]}\n");
  out.Flush();
  const bool written = out.ok() && fsync(fd) == 0;
  close(fd);
  if (!written) {
    unlink(tmp);
    return -1;
  }
  // the first free name: link() never replaces an existing file
  char path[sizeof(g_dir) + 64];
  int index = -1;
  for (int n = 0; n < 10000 && index < 0; n++) {
    char suffix[32] = "";
    if (n > 0) {
      char num[16];
      FormatUint(num, static_cast<uint64_t>(n), 1);
      Join(suffix, sizeof(suffix), ".", num);
    }
    char file[64];
    Join(file, sizeof(file), "/rank_", rank, suffix);
    Join(path, sizeof(path), g_dir, file, ".json");
    if (link(tmp, path) == 0) {
      index = n;
    } else if (errno != EEXIST) {  // no hard links here: rename onto a name that is free now
      if (access(path, F_OK) == 0) continue;
      if (rename(tmp, path) == 0) index = n;
      break;
    }
  }
  unlink(tmp);
  if (index < 0) return -1;
  Out err(2);
  err.Raw("shardgpt: rank "), err.Int(g_rank), err.Raw(": flight recorder dump ("), err.Raw(reason), err.Raw("): ");
  err.Raw(path), err.Char('\n');
  err.Flush();
  return index;
}

void OnUsr2(int) {
  const int saved = errno;
  Dump("sigusr2");
  errno = saved;
}

void OnCrash(int sig) {
  const char* reason = sig == SIGSEGV ? "sigsegv" : sig == SIGBUS ? "sigbus" : "sigabrt";
  WriteFlightDumpOnce(reason);
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

void ConfigureFlightDumps(const FlightJob& job) {
  std::string id = "\"run_id\":";
  auto str = [](const std::string& s) {
    std::string o = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') o += '\\';
      if (static_cast<unsigned char>(c) >= 0x20) o += c;
    }
    return o + "\"";
  };
  id += str(job.run_id) + ",\"world_rank\":" + std::to_string(job.world_rank) +
        ",\"world_size\":" + std::to_string(job.world_size) + ",\"host\":" + str(job.host) + ",\"hosts\":[";
  for (size_t i = 0; i < job.hosts.size(); i++) id += (i ? "," : "") + str(job.hosts[i]);
  id += "],\"slurm_job_id\":" + str(job.slurm_job_id) + ",";
  if (id.size() >= sizeof(g_identity)) id = "\"run_id\":" + str(job.run_id) + ",\"world_rank\":" +
                                            std::to_string(job.world_rank) + ",\"world_size\":" +
                                            std::to_string(job.world_size) + ",\"host\":" + str(job.host) +
                                            ",\"hosts\":[],\"slurm_job_id\":" + str(job.slurm_job_id) + ",";
  std::strncpy(g_identity, id.c_str(), sizeof(g_identity) - 1);
  std::strncpy(g_dir, job.dir.c_str(), sizeof(g_dir) - 1);
  g_rank = job.world_rank;
  g_dir_str = job.dir;
  g_run_id = job.run_id;
  g_configured.store(true);
}

bool FlightDumpsConfigured() { return g_configured.load() && g_dir[0] != '\0'; }

int WriteFlightDump(const char* reason) { return Dump(reason); }

int WriteFlightDumpOnce(const char* reason) {
  if (g_dumped_once.exchange(true)) return -1;
  return Dump(reason);
}

void SetJobVerdictFn(JobVerdictFn fn) { g_verdict_fn.store(fn); }

std::string JobVerdictFromDumps() {
  const JobVerdictFn fn = g_verdict_fn.load();
  if (fn == nullptr || !FlightDumpsConfigured()) return "";
  return fn(g_dir_str, g_run_id);
}

std::string FlightDumpDir() { return g_configured.load() ? g_dir_str : ""; }
std::string FlightRunId() { return g_configured.load() ? g_run_id : ""; }

int ClaimJobVerdict(int world_rank, bool* claimed) {
  *claimed = false;
  if (!FlightDumpsConfigured() || !MakeDirs()) return -1;
  // the claim names its rank from the moment it exists: written aside (a name of this call's
  // own: the watchdogs of several communicators of one rank may race), then linked to its name
  static std::atomic<int> attempts{0};
  const std::string claim = VerdictFile(".lead"),
                    tmp = claim + "." + std::to_string(world_rank) + "." + std::to_string(attempts++) + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  const std::string text = std::to_string(world_rank) + "\n";
  const bool wrote = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  const int linked = wrote ? link(tmp.c_str(), claim.c_str()) : -1;
  const int link_errno = errno;
  unlink(tmp.c_str());
  if (linked == 0) {
    *claimed = true;
    return world_rank;
  }
  if (wrote && link_errno != EEXIST) return -1;
  int lead = -1;
  if (FILE* f = std::fopen(claim.c_str(), "r")) {
    if (std::fscanf(f, "%d", &lead) != 1) lead = -1;
    std::fclose(f);
  }
  return lead;
}

void MarkJobVerdictPrinted() {
  if (!FlightDumpsConfigured()) return;
  const int fd = open(VerdictFile(".printed").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0) close(fd);
}

bool JobVerdictPrinted() {
  return FlightDumpsConfigured() && access(VerdictFile(".printed").c_str(), F_OK) == 0;
}

void InstallFlightSignalHandlers() {
  static char* alt_stack = nullptr;
  if (alt_stack == nullptr) {
    const size_t size = 1 << 16;
    alt_stack = static_cast<char*>(std::malloc(size));
    stack_t ss{};
    ss.ss_sp = alt_stack;
    ss.ss_size = size;
    sigaltstack(&ss, nullptr);
  }
  struct sigaction usr2 {};
  usr2.sa_handler = OnUsr2;
  sigemptyset(&usr2.sa_mask);
  usr2.sa_flags = SA_RESTART;
  sigaction(SIGUSR2, &usr2, nullptr);
  struct sigaction crash {};
  crash.sa_handler = OnCrash;
  sigemptyset(&crash.sa_mask);
  crash.sa_flags = SA_ONSTACK | SA_RESETHAND;
  sigaction(SIGSEGV, &crash, nullptr);
  sigaction(SIGBUS, &crash, nullptr);
  sigaction(SIGABRT, &crash, nullptr);
}

}  // namespace shardgpt
