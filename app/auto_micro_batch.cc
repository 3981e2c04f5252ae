#include "app/auto_micro_batch.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace shardgpt {

namespace {

bool ReadNumber(const std::string& path, double* v) {
  std::ifstream f(path);
  std::string t;
  if (!(f >> t) || t == "max") return false;
  char* end = nullptr;
  *v = std::strtod(t.c_str(), &end);
  return end != t.c_str() && *end == '\0';
}

// The value of `key` (in kB) in a /proc file of "Key: value kB" lines, in bytes; -1 if absent.
double ProcKib(const std::string& path, const std::string& key) {
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);)
    if (line.compare(0, key.size(), key) == 0) return std::strtod(line.c_str() + key.size(), nullptr) * 1024;
  return -1;
}

std::string Gib(double b) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f GiB", b / 1073741824.0);
  return buf;
}

}  // namespace

std::vector<MemoryBound> CpuMemoryBounds(const std::string& root) {
  std::vector<MemoryBound> out;
  const double avail = ProcKib(root + "/proc/meminfo", "MemAvailable:");
  if (avail >= 0) out.push_back({avail, "MemAvailable in /proc/meminfo"});
  // The process's own cgroup (/proc/self/cgroup) and every ancestor up to the hierarchy's root:
  // a limit anywhere above applies too. Without a cgroup namespace the process's cgroup is not
  // the mount's root, whose files say "no limit".
  std::vector<std::pair<std::string, std::string>> hierarchies;  // (mount, path inside it)
  {
    std::ifstream f(root + "/proc/self/cgroup");
    for (std::string line; std::getline(f, line);) {
      const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
      if (b == std::string::npos) continue;
      const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",", path = line.substr(b + 1);
      if (controllers == ",,") hierarchies.push_back({"/sys/fs/cgroup", path}), hierarchies.push_back({"/sys/fs/cgroup/unified", path});
      else if (controllers.find(",memory,") != std::string::npos) hierarchies.push_back({"/sys/fs/cgroup/memory", path});
    }
    if (hierarchies.empty()) hierarchies = {{"/sys/fs/cgroup", "/"}, {"/sys/fs/cgroup/memory", "/"}};
  }
  MemoryBound cg{-1, ""};
  for (const auto& h : hierarchies) {
    const bool v1 = h.first == "/sys/fs/cgroup/memory";
    for (std::string p = h.second;;) {
      const std::string dir = root + h.first + (p == "/" ? "" : p);
      double limit = 0, used = 0;
      const std::string lim = dir + (v1 ? "/memory.limit_in_bytes" : "/memory.max");
      if (ReadNumber(lim, &limit) && limit < 1e18) {  // v1 writes "no limit" as ~2^63
        if (!ReadNumber(dir + (v1 ? "/memory.usage_in_bytes" : "/memory.current"), &used)) used = 0;
        const double left = std::max(0.0, limit - used);
        if (cg.bytes < 0 || left < cg.bytes) cg = {left, "the cgroup limit " + lim.substr(root.size()) + " less its usage"};
      }
      if (p.empty() || p == "/") break;
      const size_t slash = p.rfind('/');
      p = slash == 0 || slash == std::string::npos ? "/" : p.substr(0, slash);
    }
  }
  if (cg.bytes >= 0) out.push_back(cg);
  struct rlimit rl {};
  if (root.empty() && getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    const double vm = std::max(0.0, ProcKib("/proc/self/status", "VmSize:"));
    out.push_back({std::max(0.0, static_cast<double>(rl.rlim_cur) - vm), "ulimit -v (RLIMIT_AS) less the process's VmSize"});
  }
  return out;
}

AutoBatchChoice ChooseAutoMicroBatch(const AutoBatchLimits& limits, const std::function<double(int)>& peak, int max_b) {
  AutoBatchChoice c;
  const MemoryBound* tight = nullptr;
  for (const MemoryBound& m : limits.memory)
    if (tight == nullptr || m.bytes < tight->bytes) tight = &m;
  if (tight == nullptr) return c;
  c.memory_source = tight->source;
  c.usable_bytes = limits.measured ? tight->bytes * (1 - kAutoHeadroomFrac) - kAutoOverheadBytes : tight->bytes;
  // the other bounds first: B never passes them, however much memory there is
  int hi = max_b;
  std::string hi_bound = "memory";
  if (limits.max_by_data > 0 && limits.max_by_data < static_cast<uint64_t>(hi))
    hi = static_cast<int>(limits.max_by_data), hi_bound = "data";
  if (limits.cap > 0 && limits.cap < hi) hi = limits.cap, hi_bound = "throughput cap";
  int lo = 0;  // the largest B known to fit
  if (c.usable_bytes > 0 && hi >= 1) {
    int a = 1, b = hi;
    while (a <= b) {
      const int mid = a + (b - a) / 2;
      if (peak(mid) <= c.usable_bytes) lo = mid, a = mid + 1;
      else b = mid - 1;
    }
  }
  c.micro_batch = lo;
  c.bound = lo == hi && hi_bound != "memory" ? hi_bound : "memory";
  std::ostringstream line;
  line << "B=" << lo << " stopped by ";
  const std::string mem = limits.measured ? Gib(c.usable_bytes) + " usable = " + tight->source + " " +
                                                Gib(tight->bytes) + " less 10% headroom and 64 MiB of overheads"
                                          : Gib(c.usable_bytes) + " (--memory)";
  if (c.bound == "data")
    line << "the data: " << limits.max_by_data << " window(s) per rank (a larger B makes no global micro-batch); memory "
         << mem;
  else if (c.bound == "throughput cap")
    line << "the throughput cap: " << limits.cap_reason << "; memory " << mem;
  else
    line << "memory: " << mem;
  c.line = line.str();
  return c;
}

}  // namespace shardgpt
