#include "parallel/nccl_memory.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace shardgpt {

namespace {

// A positive decimal integer of at most 15 digits, else 0.
double PositiveInteger(const char* v) {
  if (v == nullptr || *v == '\0' || std::strlen(v) > 15) return 0;
  double x = 0;
  for (const char* c = v; *c; c++) {
    if (*c < '0' || *c > '9') return 0;
    x = x * 10 + (*c - '0');
  }
  return x;
}

NcclCommunicatorMemory OneCommunicator(const std::string& name, int ranks, int local, const NcclMemoryAssumptions& a) {
  NcclCommunicatorMemory m;
  m.name = name;
  m.ranks = ranks;
  m.local_ranks = local;
  if (ranks < 2) return m;
  const double connections = static_cast<double>(a.channels) * a.connections_per_channel;
  m.simple = connections * a.buffsize;
  m.ll = connections * (a.ll_bytes + a.ll128_bytes);
  if (a.nvls && local >= 2)
    m.nvls = static_cast<double>(a.nvls_channels) * 2 * a.nvls_chunk * NcclMemoryAssumptions::kSteps * local;
  return m;
}

std::string Mib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g MiB", bytes / 1048576.0);
  return buf;
}

}  // namespace

NcclMemoryAssumptions NcclAssumptionsFromEnvironment(const std::function<const char*(const char*)>& lookup,
                                                     bool nvls_available) {
  NcclMemoryAssumptions a;
  if (double v = PositiveInteger(lookup("NCCL_BUFFSIZE"))) a.buffsize = v;
  const double lo = PositiveInteger(lookup("NCCL_MIN_NCHANNELS")), hi = PositiveInteger(lookup("NCCL_MAX_NCHANNELS"));
  if (lo > 0 && lo <= 1024) a.channels = std::max(a.channels, static_cast<int>(lo));
  if (hi > 0 && hi <= 1024) a.channels = std::min(a.channels, static_cast<int>(hi));
  if (double v = PositiveInteger(lookup("NCCL_NVLS_NCHANNELS")); v > 0 && v <= 1024) a.nvls_channels = static_cast<int>(v);
  if (double v = PositiveInteger(lookup("NCCL_NVLS_CHUNKSIZE"))) a.nvls_chunk = v;
  const char* enable = lookup("NCCL_NVLS_ENABLE");
  a.nvls = nvls_available && !(enable != nullptr && std::strcmp(enable, "0") == 0);
  return a;
}

double NcclMemoryEstimate::simple() const {
  double s = 0;
  for (const auto& c : comms) s += c.simple;
  return s;
}
double NcclMemoryEstimate::ll() const {
  double s = 0;
  for (const auto& c : comms) s += c.ll;
  return s;
}
double NcclMemoryEstimate::nvls() const {
  double s = 0;
  for (const auto& c : comms) s += c.nvls;
  return s;
}

std::string NcclMemoryEstimate::Describe(const NcclMemoryAssumptions& a) const {
  int connected = 0;
  std::string list;
  for (const auto& c : comms) {
    list += (list.empty() ? "" : ", ") + c.name + " " + std::to_string(c.ranks) + (list.empty() ? " ranks" : "");
    if (c.ranks >= 2) connected++;
  }
  std::string s = std::to_string(comms.size()) + (comms.size() == 1 ? " communicator (" : " communicators (") + list +
                  "), " + std::to_string(connected) + " with peers, each " + std::to_string(a.channels) +
                  " channels x " + std::to_string(a.connections_per_channel) + " connections x (NCCL_BUFFSIZE " +
                  Mib(a.buffsize) + " + LL " + Mib(a.ll_bytes) + " + LL128 " + Mib(a.ll128_bytes) + ")";
  if (a.nvls)
    s += " + NVLS " + std::to_string(a.nvls_channels) + " channels x 2 x " + Mib(a.nvls_chunk) + " x " +
         std::to_string(NcclMemoryAssumptions::kSteps) + " steps x local ranks = " + Mib(nvls());
  else
    s += ", NVLS not counted";
  return s;
}

NcclMemoryEstimate EstimateNcclMemory(int world, int shard_group, int ranks_per_node, const NcclMemoryAssumptions& a) {
  NcclMemoryEstimate e;
  world = std::max(1, world);
  const int node = std::min(std::max(1, ranks_per_node), world);
  e.comms.push_back(OneCommunicator("world", world, node, a));
  if (shard_group >= 1 && shard_group < world && world % shard_group == 0) {
    const int G = shard_group, R = world / G;
    e.comms.push_back(OneCommunicator("shard", G, std::min(G, node), a));
    e.comms.push_back(OneCommunicator("replica", R, std::min(R, std::max(1, node / G)), a));
  }
  return e;
}

}  // namespace shardgpt
