// Stage-3 communication overlaps compute on the GPU path, checked from the
// CUDA emulation's trace of stream operations (cuda_emu::TraceStart), under mpirun with 2 ranks
// and the emulated NCCL (--comm nccl): a tiny model with 4 blocks, stage 3 in fp32 and bf16
// (forward and backward), stages 1 and 2 (backward: their per-unit reduce-scatters), stage 0
// with one bucket per unit (backward: the buckets' all-reduces).
//
// What a GPU may run at the same time follows from the ENQUEUE order alone: op a is ordered
// before op b when a precedes b on one stream, or b's stream waits (cudaStreamWaitEvent) for an
// op ordered after a, or the host blocked until a had run (a host sync) before it enqueued b.
// Two ops may overlap exactly when neither is ordered before the other. Vector clocks over the
// streams compute that order (OrderOf below). The checks, for every unit l:
//   (a) forward: the all-gather of unit l+1 (each unit is gathered once per forward, in unit
//       order) is issued before unit l's first kernel, may overlap every kernel of unit l, and
//       unit l+1's first kernel is ordered after it: the compute stream waits for it only after
//       unit l's kernels, right before unit l+1's;
//   (b) backward: the reduce-scatter of unit l (stage 0: its bucket's all-reduce), issued after
//       its backward, is ordered after unit l's last backward kernel (it reads its gradient)
//       and may overlap every kernel of the next unit's backward (backward order F, L..1, E);
//   (c) in both, no host sync between the collective's issue and those kernels waits for the
//       collective. Host syncs there that wait only for earlier compute work (the embedding
//       backward's token readback) do not stop the overlap; they are printed as a note.
// The same analysis is first shown to tell an early wait from a late one on a hand-made stream
// program (OrderOf.SeesWhatAWaitOrders), so it can fail.
//
// Units are told apart by marks (cuda_emu::TraceMark) that a UnitHooks wrapper around the
// engine puts into the enqueue order around each hook: no change to the engine or the model.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda_emu.h"
#include "model/cuda/cuda_device.h"
#include "model/device_factory.h"
#include "model/gpt.h"
#include "model/rng.h"
#include "parallel/comm_factory.h"
#include "parallel/engine.h"
#include "tests/mpi/engine_harness.h"

namespace shardgpt {
namespace {

using cuda_emu::TraceKind;
using cuda_emu::TraceOp;

// The happens-before order of a trace's enqueued ops (see the header comment).
class OrderOf {
 public:
  explicit OrderOf(const std::vector<TraceOp>& ops) {
    std::vector<uint64_t> host;  // what the host has waited for, per stream
    for (const TraceOp& op : ops) {
      if (op.kind == TraceKind::kHostSync) {
        Join(&host, ClockOf(op.ref_stream, op.ref_index));
        continue;
      }
      if (op.index == 0) continue;  // marks, non-timing event records: no op
      std::vector<uint64_t> c = last_[op.stream];
      Join(&c, host);
      if (op.kind == TraceKind::kWait && op.ref_index > 0) Join(&c, ClockOf(op.ref_stream, op.ref_index));
      Set(&c, op.stream, op.index);
      last_[op.stream] = c;
      clock_[{op.stream, op.index}] = std::move(c);
    }
  }
  // a is ordered before b (a, b: stream ops of the trace).
  bool Before(const TraceOp& a, const TraceOp& b) const {
    const std::vector<uint64_t>& c = clock_.at({b.stream, b.index});
    return a.stream < (int)c.size() && c[a.stream] >= a.index && !(a.stream == b.stream && a.index == b.index);
  }
  bool MayOverlap(const TraceOp& a, const TraceOp& b) const { return !Before(a, b) && !Before(b, a); }

 private:
  static void Set(std::vector<uint64_t>* c, int s, uint64_t v) {
    if ((int)c->size() <= s) c->resize(s + 1, 0);
    (*c)[s] = std::max((*c)[s], v);
  }
  static void Join(std::vector<uint64_t>* c, const std::vector<uint64_t>& o) {
    for (size_t s = 0; s < o.size(); s++) Set(c, (int)s, o[s]);
  }
  // The clock of op (s, i); for an op enqueued before the trace started, what is known: itself.
  std::vector<uint64_t> ClockOf(int s, uint64_t i) const {
    auto it = clock_.find({s, i});
    if (it != clock_.end()) return it->second;
    std::vector<uint64_t> c;
    if (s >= 0 && i > 0) Set(&c, s, i);
    return c;
  }
  std::map<int, std::vector<uint64_t>> last_;                       // per stream: its last op's clock
  std::map<std::pair<int, uint64_t>, std::vector<uint64_t>> clock_;  // per op
};

// The analysis itself, on a stream program whose answer is known: kernel k1 on stream A, a
// copy c on stream B; B waits for k1 (event) before c: ordered. Without the wait: they may
// overlap. A host sync on A before c: ordered again.
TEST(OrderOf, SeesWhatAWaitOrders) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (cudaSetDevice(0) != cudaSuccess) GTEST_SKIP() << "no emulated GPU";
  void* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 64), cudaSuccess);
  cudaStream_t a = nullptr, b = nullptr;
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
  cudaEvent_t e = nullptr;
  cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  for (int variant = 0; variant < 3; variant++) {
    cuda_emu::TraceStart();
    cudaMemsetAsync(buf, 0, 32, a);  // stands for a kernel on A
    if (variant == 1) {
      cudaEventRecord(e, a);
      cudaStreamWaitEvent(b, e, 0);
    }
    if (variant == 2) cudaStreamSynchronize(a);
    cudaMemsetAsync(static_cast<char*>(buf) + 32, 0, 32, b);
    cudaStreamSynchronize(b);
    const cuda_emu::Trace t = cuda_emu::TraceStop();
    std::vector<TraceOp> sets;
    for (const TraceOp& op : t.enqueued)
      if (op.kind == TraceKind::kMemset) sets.push_back(op);
    ASSERT_EQ(sets.size(), 2u);
    const OrderOf order(t.enqueued);
    EXPECT_EQ(order.MayOverlap(sets[0], sets[1]), variant == 0) << "variant " << variant;
    EXPECT_EQ(order.Before(sets[0], sets[1]), variant != 0) << "variant " << variant;
    // every op ran, each stream's in its FIFO order
    std::map<int, uint64_t> last;
    for (const auto& x : t.executed) {
      EXPECT_GT(x.second, last[x.first]);
      last[x.first] = x.second;
    }
  }
  cudaEventDestroy(e);
  cudaStreamDestroy(a), cudaStreamDestroy(b);
  cudaFree(buf);
}

// The engine's hooks, with a trace mark around each call: "<phase> <unit> begins" after the
// Pre hook returned (the unit's kernels follow), "<phase> <unit> ends" before the Post hook.
// Other marks: "pre <phase> <unit>" before the Pre hook, "post <phase> <unit> done" after Post.
class MarkingHooks final : public UnitHooks {
 public:
  explicit MarkingHooks(UnitHooks& inner) : inner_(inner) {}
  const float* PreForward(int u) override {
    Mark("pre forward", u);
    const float* p = inner_.PreForward(u);
    Mark("forward", u, " begins");
    return p;
  }
  void PostForward(int u) override {
    Mark("forward", u, " ends");
    inner_.PostForward(u);
    Mark("post forward", u, " done");
  }
  UnitBuffers PreBackward(int u) override {
    Mark("pre backward", u);
    UnitBuffers b = inner_.PreBackward(u);
    Mark("backward", u, " begins");
    return b;
  }
  void PostBackward(int u) override {
    Mark("backward", u, " ends");
    inner_.PostBackward(u);
    Mark("post backward", u, " done");
  }

 private:
  static void Mark(const char* what, int u, const char* tail = "") {
    cuda_emu::TraceMark(std::string(what) + " " + std::to_string(u) + tail);
  }
  UnitHooks& inner_;
};

// One traced micro-batch, cut into units by the marks.
struct UnitTrace {
  std::vector<TraceOp> ops;
  std::map<std::string, uint64_t> mark;  // mark -> its seq
  int compute = -1, comm = -1;           // stream ids

  // The compute-stream kernels (and library calls) enqueued after mark `from` and before the
  // next mark: a unit's own kernels (E's forward window ends at PreForward(1), not at its
  // PostForward, which comes after the LM head).
  std::vector<TraceOp> Kernels(const std::string& from) const {
    std::vector<TraceOp> k;
    for (uint64_t i = mark.at(from) + 1; i < ops.size() && ops[i].kind != TraceKind::kMark; i++)
      if (ops[i].stream == compute && (ops[i].kind == TraceKind::kKernel || ops[i].kind == TraceKind::kLibrary))
        k.push_back(ops[i]);
    return k;
  }
  // Collectives named `name` enqueued between two marks.
  std::vector<TraceOp> Collectives(const std::string& name, const std::string& from, const std::string& to) const {
    std::vector<TraceOp> c;
    for (uint64_t i = mark.at(from); i < mark.at(to); i++)
      if (ops[i].kind == TraceKind::kCollective && ops[i].name == name) c.push_back(ops[i]);
    return c;
  }
  const TraceOp* Op(int stream, uint64_t index) const {
    for (const TraceOp& op : ops)
      if (op.stream == stream && op.index == index) return &op;
    return nullptr;
  }
  // The host syncs enqueued after collective `coll` and before seq `until` that wait for it
  // (for an op ordered at or after it): each one keeps the host from enqueueing the kernels
  // that follow until the collective is done, so they cannot overlap it. Host syncs that wait
  // for earlier work only (e.g. a copy of compute results to the host) are put in *others.
  int HostWaitsFor(const TraceOp& coll, uint64_t until, const OrderOf& order, std::string* others) const {
    int n = 0;
    for (uint64_t i = coll.seq + 1; i < until && i < ops.size(); i++) {
      if (ops[i].kind != TraceKind::kHostSync) continue;
      const TraceOp* ref = Op(ops[i].ref_stream, ops[i].ref_index);
      const bool waits = ops[i].ref_stream == coll.stream ? ops[i].ref_index >= coll.index
                                                          : ref != nullptr && order.Before(coll, *ref);
      if (waits) n++;
      else *others += " " + ops[i].name;
    }
    return n;
  }
};

// Host syncs that do not wait for the collective do not stop it overlapping, but they stall the
// host: said, not failed.
void Note(const std::string& syncs, const std::string& coll, const std::string& kernels) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (!syncs.empty() && rank == 0)
    std::printf("note: between the %s and the %s, host syncs on earlier compute work:%s\n", coll.c_str(),
                kernels.c_str(), syncs.c_str());
}

std::string Unit(const char* phase, int u, const char* tail) { return std::string(phase) + " " + std::to_string(u) + tail; }

void CheckForwardOverlap(const UnitTrace& t, const OrderOf& order, int units) {
  const std::vector<TraceOp> gathers =
      t.Collectives("ncclAllGather", Unit("pre forward", 0, ""), Unit("pre backward", units - 1, ""));
  ASSERT_EQ(gathers.size(), static_cast<size_t>(units)) << "stage 3's forward gathers each unit once";
  for (int l = 0; l + 1 < units; l++) {
    SCOPED_TRACE("forward of unit " + std::to_string(l));
    const std::vector<TraceOp> mine = t.Kernels(Unit("forward", l, " begins"));
    const std::vector<TraceOp> next = t.Kernels(Unit("forward", l + 1, " begins"));
    ASSERT_FALSE(mine.empty());
    ASSERT_FALSE(next.empty());
    // the gather of unit l+1: stage 3's forward gathers every unit once, in unit order
    const TraceOp* gather = &gathers[l + 1];
    ASSERT_TRUE(order.Before(*gather, next.front()))
        << "unit " << l + 1 << "'s first kernel is not ordered after the all-gather of its parameters (a missing wait)";
    EXPECT_LT(gather->seq, mine.front().seq) << "the all-gather of unit " << l + 1
                                             << " is issued after unit " << l << "'s first kernel (no prefetch)";
    for (const TraceOp& k : mine)
      EXPECT_TRUE(order.MayOverlap(*gather, k))
          << "the all-gather of unit " << l + 1 << " cannot overlap kernel " << k.name << " of unit " << l << " ("
          << (order.Before(*gather, k) ? "it is ordered after the gather: a wait of the compute stream or of the host"
                                       : "the gather waits for it") << ")";
    std::string others;
    EXPECT_EQ(t.HostWaitsFor(*gather, mine.back().seq, order, &others), 0)
        << "the host waits for the all-gather of unit " << l + 1 << " before it enqueues unit " << l << "'s kernels";
    Note(others, "all-gather of unit " + std::to_string(l + 1), "forward of unit " + std::to_string(l));
  }
}

// Backward order: F = units-1, blocks units-2 .. 1, E = 0.
void CheckBackwardOverlap(const UnitTrace& t, const OrderOf& order, int units, const std::string& collective) {
  for (int u = units - 1; u >= 1; u--) {
    const int next = u - 1;
    SCOPED_TRACE("reduce-scatter of unit " + std::to_string(u));
    const std::vector<TraceOp> mine = t.Kernels(Unit("backward", u, " begins"));
    const std::vector<TraceOp> theirs = t.Kernels(Unit("backward", next, " begins"));
    ASSERT_FALSE(mine.empty());
    ASSERT_FALSE(theirs.empty());
    const std::vector<TraceOp> rs =
        t.Collectives(collective, Unit("backward", u, " ends"), Unit("post backward", u, " done"));
    ASSERT_EQ(rs.size(), 1u) << "PostBackward(" << u << ") issues one " << collective;
    EXPECT_TRUE(order.Before(mine.back(), rs[0])) << "the reduce-scatter does not wait for the unit's gradient";
    for (const TraceOp& k : theirs)
      EXPECT_TRUE(order.MayOverlap(rs[0], k))
          << "the reduce-scatter of unit " << u << " cannot overlap kernel " << k.name << " of unit " << next
          << "'s backward (" << (order.Before(rs[0], k) ? "it is ordered after it: a wait of the compute stream or of the host" : "it waits for it")
          << ")";
    std::string others;
    EXPECT_EQ(t.HostWaitsFor(rs[0], theirs.back().seq, order, &others), 0)
        << "the host waits for the reduce-scatter of unit " << u << " before it enqueues unit " << next
        << "'s backward";
    Note(others, "reduce-scatter of unit " + std::to_string(u), "backward of unit " + std::to_string(next));
  }
}

constexpr int kT = 16, kB = 2;
const GPTConfig kConfig{4, 2, 32, 32, 64};  // 4 blocks: units E, 1..4, F

void RunOverlap(DType dtype, int stage) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) GTEST_SKIP() << "runs with 2 ranks";
  int lr = 0, ls = 1;
  harness::NodeLocalRank(&lr, &ls);
  auto dev = CreateDevice("cuda", lr, ls);
  ASSERT_TRUE(dev.ok()) << dev.status().message();
  Device& device = *dev.value();
  CommOptions co;
  co.kind = "nccl";
  co.timeout_s = 60;
  auto comm = CreateCommunicator(co, MPI_COMM_WORLD, device, ls, VisibleGpuCount());
  ASSERT_TRUE(comm.ok()) << comm.status().message();
  ASSERT_TRUE(comm.value()->stream_ordered());

  ParamLayout layout(kConfig);
  EngineOptions eo;
  eo.zero_stage = stage;
  eo.dtype = dtype;
  eo.reduce_dtype = dtype;
  eo.bucket_mb = 1e-6;  // stage 0: one bucket per unit (the first is whole units until 1 MiB: the final unit)
  auto engine = std::move(Engine::Create(layout, comm.value().get(), eo, device).value());
  std::vector<float> init(layout.total_numel());
  InitParameters(layout, 1, init.data());
  engine->LoadFullParams(init.data());
  GPT model(kConfig, kB, kT, device);
  MarkingHooks hooks(*engine);
  std::vector<int32_t> x(kB * kT), y(kB * kT);
  UnitTrace t;
  for (int step = 0; step < 2; step++) {  // step 1 warms the allocator; step 2 is traced
    Rng rng(90 + step + 10 * comm.value()->rank());
    for (size_t i = 0; i < x.size(); i++) x[i] = rng.Next() % 64, y[i] = (x[i] * 5 + 1) % 64;
    engine->BeginStep();
    engine->BeginMicroBatch(0, 1);
    if (step == 1) cuda_emu::TraceStart();
    model.Forward(hooks, x.data(), y.data(), kB, kT, 1.0f);
    model.Backward(hooks);
    if (step == 1) t.ops = cuda_emu::TraceStop().enqueued;
    engine->Step(1e-3f, 1.0f);
  }
  t.compute = cuda_emu::StreamId(static_cast<cudaStream_t>(CudaComputeStream(device)));
  for (const TraceOp& op : t.ops) {
    if (op.kind == TraceKind::kMark) t.mark[op.name] = op.seq;
    if (op.kind == TraceKind::kCollective) {
      if (t.comm >= 0) ASSERT_EQ(op.stream, t.comm) << "collectives on two streams";
      t.comm = op.stream;
    }
    if (op.kind == TraceKind::kKernel) ASSERT_EQ(op.stream, t.compute) << "kernel " << op.name << " off the compute stream";
  }
  ASSERT_GE(t.comm, 0);
  ASSERT_NE(t.comm, t.compute);
  if (std::getenv("SHARDGPT_OVERLAP_TRACE") && comm.value()->rank() == 0)  // for a failure's diagnosis
    for (const TraceOp& op : t.ops)
      std::fprintf(stderr, "%5llu %-12s stream %2d #%-4llu ref %2d #%-4llu %s\n", (unsigned long long)op.seq,
                   cuda_emu::TraceKindName(op.kind), op.stream, (unsigned long long)op.index, op.ref_stream,
                   (unsigned long long)op.ref_index, op.name.c_str());
  const OrderOf order(t.ops);
  const int units = layout.num_units();
  ASSERT_EQ(units, kConfig.n_layer + 2);
  if (stage == 3) CheckForwardOverlap(t, order, units);  // only stage 3 gathers in forward
  CheckBackwardOverlap(t, order, units, stage == 0 ? "ncclAllReduce" : "ncclReduceScatter");
}

TEST(Overlap, Stage3NcclFp32) { RunOverlap(DType::kF32, 3); }
TEST(Overlap, Stage3NcclBf16) { RunOverlap(DType::kBF16, 3); }
// Stages 1 and 2 reduce-scatter each unit after its backward too (stage 1: in the last
// micro-batch, here the only one): the same backward check.
TEST(Overlap, Stage2NcclBf16) { RunOverlap(DType::kBF16, 2); }
TEST(Overlap, Stage1NcclFp32) { RunOverlap(DType::kF32, 1); }
// Stage 0 with one bucket per unit: each bucket's all-reduce, issued after its unit's backward.
TEST(Overlap, Stage0NcclFp32) { RunOverlap(DType::kF32, 0); }

}  // namespace
}  // namespace shardgpt
