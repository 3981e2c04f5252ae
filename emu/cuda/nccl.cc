// The emulated NCCL (see emu/cuda/include/nccl.h): communicators are MPI communicators, every
// operation is one host closure queued on its CUDA stream that performs it with MPI.
//
// A communicator holds two MPI communicators: `ctrl` (from the bootstrap split, used only by the
// API calls on the caller's thread: ncclCommSplit) and `data` (its duplicate, used only by the
// closures, on whichever thread runs a stream). Its state is guarded by `mu`, which is never
// held across an MPI call or a stream wait; the closures' MPI calls are serialised by `mpi_mu`,
// which only closures take, so ncclCommAbort and ncclCommGetAsyncError never wait for MPI.
// Closures hold the communicator by shared_ptr: one that runs after ncclCommDestroy finds it
// destroyed and does nothing.
#include "nccl.h"

#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/bf16.h"
#include "cuda_emu.h"

// What one communicator handle points to (the header's opaque struct ncclComm).
struct ncclComm {
  int nranks = 0;
  int rank = 0;
  int ordinal = 0;  // cudaGetDevice at init: ncclCommCuDevice, and cudaSetDevice for a drain
  int device = -1;  // the same device as cuda_emu numbers it (StreamDevice, DeviceOf)
  bool blocking = true;
  MPI_Comm ctrl = MPI_COMM_NULL;  // the caller's thread only (split)
  MPI_Comm data = MPI_COMM_NULL;  // the closures only, under mpi_mu

  std::mutex mpi_mu;  // serialises the closures' MPI calls on `data`
  std::mutex mu;      // guards everything below
  std::condition_variable cv;  // pending or running changed
  ncclResult_t async = ncclSuccess;  // the first asynchronous error, sticky
  int progress_reports = 0;          // ncclCommGetAsyncError calls left that say ncclInProgress
  bool aborted = false, finalized = false, destroyed = false;
  int running = 0;                       // closures inside MPI now
  std::map<cudaStream_t, int> pending;   // closures queued and not yet finished, per stream
  char last_error[512] = "";
};

namespace {

using shardgpt::Bf16ToFloat;
using shardgpt::FloatToBf16;
using CommPtr = std::shared_ptr<ncclComm>;
// A closure's MPI work: returns "" or what failed.
using Body = std::function<std::string(MPI_Comm)>;

constexpr unsigned kConfigMagic = 0xcafebeef;
constexpr int kP2pTag = 0x6e63;  // send/receive matching: MPI keeps per-pair order
constexpr const char* kFailEnv = "SHARDGPT_NCCL_EMU_FAIL_AT";

// ---------------------------------------------------------------------------------------------
// Errors

thread_local char t_last_error[512] = "";

// Records `text` as this thread's last error (and the comm's, if any) and returns r.
ncclResult_t Error(ncclComm* c, ncclResult_t r, const std::string& text) {
  std::snprintf(t_last_error, sizeof(t_last_error), "%s", text.c_str());
  if (c != nullptr) {
    std::lock_guard<std::mutex> lock(c->mu);
    std::snprintf(c->last_error, sizeof(c->last_error), "%s", text.c_str());
  }
  return r;
}

// Sets the comm's asynchronous error (the first one sticks). Caller holds c.mu.
void SetAsyncLocked(ncclComm& c, ncclResult_t r, const std::string& text) {
  if (c.async != ncclSuccess) return;
  c.async = r;
  std::snprintf(c.last_error, sizeof(c.last_error), "%s", text.c_str());
}

// An MPI return code as "" (success) or "<call> failed: <MPI's text>".
std::string MpiCheck(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return "";
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  return std::string(call) + " failed: " + (len > 0 ? std::string(text, len) : "MPI error " + std::to_string(rc));
}

// A pointer as the messages print it (0x...).
std::string PtrText(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

// ---------------------------------------------------------------------------------------------
// Live communicators. The registry owns them from init to ncclCommDestroy (so an aborted comm
// stays valid, and reachable for the leak checker, until it is destroyed) and turns a handle
// that is no longer live into ncclInvalidArgument instead of a use after free.

std::mutex g_registry_mu;
// Every live comm by handle; guarded by g_registry_mu.
std::map<const ncclComm*, CommPtr>& Registry() {
  static auto* registry = new std::map<const ncclComm*, CommPtr>;  // never destroyed: closures may outlive main
  return *registry;
}

// The registered comm for a handle, or null.
CommPtr Lookup(const ncclComm* handle) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto it = Registry().find(handle);
  return it == Registry().end() ? nullptr : it->second;
}

// A handle that is not (or no longer) registered: refused instead of used after free.
ncclResult_t NotLive(const char* call, const ncclComm* handle) {
  return Error(nullptr, ncclInvalidArgument,
               std::string(call) + ": comm " + PtrText(handle) + " is not a live communicator (destroyed?)");
}

// The comm behind `handle` for any call: NULL, unknown (destroyed) and aborted comms are refused.
ncclResult_t Find(const char* call, const ncclComm* handle, CommPtr* out) {
  if (handle == nullptr) return Error(nullptr, ncclInvalidArgument, std::string(call) + ": comm is NULL");
  *out = Lookup(handle);
  if (*out == nullptr) return NotLive(call, handle);
  bool aborted;
  {
    std::lock_guard<std::mutex> lock((*out)->mu);
    aborted = (*out)->aborted;
  }
  if (aborted) return Error(out->get(), ncclInvalidUsage, std::string(call) + ": the communicator was aborted");
  return ncclSuccess;
}

// As Find, for a call that issues work: also refuses a finalized comm and one in error.
ncclResult_t FindReady(const char* call, const ncclComm* handle, CommPtr* out) {
  ncclResult_t r = Find(call, handle, out);
  if (r != ncclSuccess) return r;
  ncclComm& c = **out;
  std::unique_lock<std::mutex> lock(c.mu);
  if (c.finalized) {
    lock.unlock();
    return Error(&c, ncclInvalidUsage, std::string(call) + ": the communicator was finalized");
  }
  return c.async;  // its text is already the comm's last error
}

// ---------------------------------------------------------------------------------------------
// Types and reductions

struct Type {
  MPI_Datatype mpi;
  size_t size;
  bool reducible;  // fp16 and fp8 can be moved but not reduced
};

// The MPI type and size of an NCCL type; false for an unknown one.
bool TypeOf(ncclDataType_t t, Type* out) {
  switch (t) {
    case ncclInt8: *out = {MPI_INT8_T, 1, true}; return true;
    case ncclUint8: *out = {MPI_UINT8_T, 1, true}; return true;
    case ncclInt32: *out = {MPI_INT32_T, 4, true}; return true;
    case ncclUint32: *out = {MPI_UINT32_T, 4, true}; return true;
    case ncclInt64: *out = {MPI_INT64_T, 8, true}; return true;
    case ncclUint64: *out = {MPI_UINT64_T, 8, true}; return true;
    case ncclFloat16: *out = {MPI_UINT16_T, 2, false}; return true;
    case ncclFloat32: *out = {MPI_FLOAT, 4, true}; return true;
    case ncclFloat64: *out = {MPI_DOUBLE, 8, true}; return true;
    case ncclBfloat16: *out = {MPI_UINT16_T, 2, true}; return true;  // raw bits, reduced by our ops
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: *out = {MPI_UINT8_T, 1, false}; return true;
    default: return false;
  }
}

// The pairwise steps of the bf16 reductions, in fp32. Max and min keep a NaN.
float AddF(float a, float b) { return a + b; }
float MulF(float a, float b) { return a * b; }
float MaxF(float a, float b) { return a != a ? a : b != b ? b : (a > b ? a : b); }
float MinF(float a, float b) { return a != a ? a : b != b ? b : (a < b ? a : b); }

// MPI user op on bf16 bits: inout[i] = bf16(F(fp32(in[i]), fp32(inout[i]))), rounded to
// nearest even after this one step. Registered as commutative: MPI may pair in any order.
template <float (*F)(float, float)>
void Bf16Op(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = FloatToBf16(F(Bf16ToFloat(a[i]), Bf16ToFloat(b[i])));
}

MPI_Op g_bf16_ops[4];  // ncclSum, ncclProd, ncclMax, ncclMin; created once, never freed
std::once_flag g_bf16_once;

// Creates the bf16 ops (MPI must be initialised).
void CreateBf16Ops() {
  MPI_Op_create(&Bf16Op<AddF>, 1, &g_bf16_ops[ncclSum]);
  MPI_Op_create(&Bf16Op<MulF>, 1, &g_bf16_ops[ncclProd]);
  MPI_Op_create(&Bf16Op<MaxF>, 1, &g_bf16_ops[ncclMax]);
  MPI_Op_create(&Bf16Op<MinF>, 1, &g_bf16_ops[ncclMin]);
}

// The MPI op for a reduction (ncclAvg: the sum; the division follows).
MPI_Op MpiOp(ncclRedOp_t op, ncclDataType_t type) {
  const ncclRedOp_t base = op == ncclAvg ? ncclSum : op;
  if (type == ncclBfloat16) return g_bf16_ops[base];
  switch (base) {
    case ncclProd: return MPI_PROD;
    case ncclMax: return MPI_MAX;
    case ncclMin: return MPI_MIN;
    default: return MPI_SUM;
  }
}

// x /= n for every element, in the element type (integers: truncating division).
template <typename T>
void DivideAs(void* buf, size_t count, int n) {
  T* p = static_cast<T*>(buf);
  for (size_t i = 0; i < count; ++i) {
    if constexpr (std::is_floating_point_v<T>)
      p[i] /= static_cast<T>(n);  // a division, not a multiply by 1/n: exact when the quotient is
    else if constexpr (std::is_signed_v<T>)
      p[i] = static_cast<T>(static_cast<int64_t>(p[i]) / n);
    else
      p[i] = static_cast<T>(static_cast<uint64_t>(p[i]) / static_cast<uint64_t>(n));
  }
}

// ncclAvg after the sum: x = sum / n in the type (bf16: in fp32, rounded once).
void Divide(void* buf, size_t count, ncclDataType_t type, int n) {
  if (n == 1) return;
  switch (type) {
    case ncclInt8: return DivideAs<int8_t>(buf, count, n);
    case ncclUint8: return DivideAs<uint8_t>(buf, count, n);
    case ncclInt32: return DivideAs<int32_t>(buf, count, n);
    case ncclUint32: return DivideAs<uint32_t>(buf, count, n);
    case ncclInt64: return DivideAs<int64_t>(buf, count, n);
    case ncclUint64: return DivideAs<uint64_t>(buf, count, n);
    case ncclFloat32: return DivideAs<float>(buf, count, n);
    case ncclFloat64: return DivideAs<double>(buf, count, n);
    case ncclBfloat16: {
      uint16_t* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = FloatToBf16(Bf16ToFloat(p[i]) / static_cast<float>(n));
      return;
    }
    default: return;
  }
}

// ---------------------------------------------------------------------------------------------
// Validation. Argument errors return (as NCCL's); misuse that a GPU would punish ends the process.

// The checks common to every operation: a usable comm, a known type (reducible with an op),
// an op that is built in, and a count that MPI's int takes.
ncclResult_t Begin(const char* call, ncclComm_t handle, size_t count, ncclDataType_t type, const ncclRedOp_t* op,
                   CommPtr* c, Type* t) {
  ncclResult_t r = FindReady(call, handle, c);
  if (r != ncclSuccess) return r;
  auto refuse = [&](const std::string& why) {
    return Error(c->get(), ncclInvalidArgument, std::string(call) + ": " + why);
  };
  if (!TypeOf(type, t)) return refuse("unknown datatype " + std::to_string(type));
  if (op != nullptr && (*op < ncclSum || *op > ncclAvg))
    return refuse("op " + std::to_string(*op) + " is not a built-in reduction (user ops are not emulated)");
  if (op != nullptr && !t->reducible)
    return refuse("the emulation cannot reduce datatype " + std::to_string(type) + " (fp16/fp8)");
  if (count > static_cast<size_t>(INT_MAX))
    return refuse("count " + std::to_string(count) + " exceeds INT_MAX (an emulation limit)");
  return ncclSuccess;
}

// A NULL buffer with a non-zero count: refused, as by NCCL.
ncclResult_t NullBuffer(ncclComm* c, const char* call, const char* what, size_t count) {
  return Error(c, ncclInvalidArgument,
               std::string(call) + ": " + what + " is NULL (count " + std::to_string(count) + ")");
}

// A root or peer that is not a rank of the comm: refused, as by NCCL.
ncclResult_t BadRank(ncclComm* c, const char* call, const char* what, int value) {
  return Error(c, ncclInvalidArgument, std::string(call) + ": " + what + " " + std::to_string(value) + " outside [0, " +
                                           std::to_string(c->nranks) + ")");
}

// A GPU kernel cannot run on another device's stream with this comm: the stream must be its.
void CheckStream(const char* call, const ncclComm& c, cudaStream_t s) {
  const int d = cuda_emu::StreamDevice(s);
  if (d != c.device)
    cuda_emu::Fail(std::string(call) + ": stream " + PtrText(s) + " belongs to device " + std::to_string(d) +
                   " but the communicator to device " + std::to_string(c.device));
}

// The kernel would read or write [p, p + bytes) on the comm's device: it must lie in one of
// that device's allocations.
void CheckBuffer(const char* call, const char* what, const ncclComm& c, const void* p, size_t bytes) {
  if (cuda_emu::DeviceOf(p, bytes) != c.device)
    cuda_emu::Fail(std::string(call) + ": " + what + " " + PtrText(p) + " (" + std::to_string(bytes) +
                   " bytes) is not inside one allocation of device " + std::to_string(c.device));
}

// Buffers that overlap other than as NCCL's in-place forms: undefined on a GPU.
void CheckDisjoint(const char* call, const void* send, size_t send_bytes, const void* recv, size_t recv_bytes) {
  const auto s = reinterpret_cast<uintptr_t>(send), r = reinterpret_cast<uintptr_t>(recv);
  if (s < r + recv_bytes && r < s + send_bytes)
    cuda_emu::Fail(std::string(call) + ": sendbuff " + PtrText(send) + " (" + std::to_string(send_bytes) +
                   " bytes) overlaps recvbuff " + PtrText(recv) + " (" + std::to_string(recv_bytes) +
                   " bytes) other than in place");
}

// ---------------------------------------------------------------------------------------------
// Closures on streams

// True when this operation is the one SHARDGPT_NCCL_EMU_FAIL_AT names. Counts every queued
// operation of the process, from the first one that sees the variable's current value.
bool InjectFailure(long* index) {
  static std::mutex mu;
  static auto* seen = new std::string;  // never destroyed
  static long count = 0;
  std::lock_guard<std::mutex> lock(mu);
  const char* v = std::getenv(kFailEnv);
  const std::string now = v != nullptr ? v : "";
  if (now != *seen) *seen = now, count = 0;
  if (now.empty()) return false;
  *index = ++count;
  return count == std::strtol(now.c_str(), nullptr, 10);
}

// Frees a comm's MPI communicators, unless MPI has already been finalized.
void FreeMpi(MPI_Comm ctrl, MPI_Comm data) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (data != MPI_COMM_NULL) MPI_Comm_free(&data);
  if (ctrl != MPI_COMM_NULL) MPI_Comm_free(&ctrl);
}

// Takes the MPI communicators out of a destroyed comm once no closure is inside MPI; the
// caller frees them after releasing c.mu. Caller holds c.mu.
std::pair<MPI_Comm, MPI_Comm> TakeMpiIfIdleLocked(ncclComm& c) {
  if (!c.destroyed || c.running > 0) return {MPI_COMM_NULL, MPI_COMM_NULL};
  std::pair<MPI_Comm, MPI_Comm> out{c.ctrl, c.data};
  c.ctrl = c.data = MPI_COMM_NULL;
  return out;
}

// One queued closure's claim on its stream: released when the closure has run or, if the
// runtime drops it unrun, when it is destroyed. Finalize waits for all claims.
class Ticket {
 public:
  Ticket(CommPtr c, cudaStream_t s) : c_(std::move(c)), s_(s) {
    std::lock_guard<std::mutex> lock(c_->mu);
    ++c_->pending[s_];
  }
  ~Ticket() { Done(); }
  void Done() {
    std::lock_guard<std::mutex> lock(c_->mu);
    if (done_) return;
    done_ = true;
    if (--c_->pending[s_] == 0) c_->pending.erase(s_);
    c_->cv.notify_all();
  }

 private:
  CommPtr c_;
  cudaStream_t s_;
  bool done_ = false;  // guarded by c_->mu
};

// The closure: skipped when the comm is aborted, destroyed or in error, or when failure
// injection picked it; otherwise body() with MPI, outside c.mu.
void Run(ncclComm& c, const char* call, long fail_index, const Body& body) {
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.aborted || c.destroyed || c.async != ncclSuccess || c.data == MPI_COMM_NULL) return;
    if (fail_index > 0) {
      SetAsyncLocked(c, ncclRemoteError, std::string("emulated failure (") + kFailEnv + "): " + call + ", operation " +
                                             std::to_string(fail_index) + " of this process");
      return;
    }
    ++c.running;
  }
  std::string err;
  {
    std::lock_guard<std::mutex> mpi(c.mpi_mu);
    err = body(c.data);
  }
  std::pair<MPI_Comm, MPI_Comm> to_free;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    --c.running;
    if (!err.empty() && !c.aborted) SetAsyncLocked(c, ncclSystemError, std::string(call) + ": " + err);
    to_free = TakeMpiIfIdleLocked(c);  // destroyed after abort while we were in MPI
    c.cv.notify_all();
  }
  FreeMpi(to_free.first, to_free.second);
}

// Queues one operation as one closure on stream s.
void Queue(const CommPtr& c, cudaStream_t s, const char* call, Body body) {
  long index = 0;
  const long fail_index = InjectFailure(&index) ? index : 0;
  auto ticket = std::make_shared<Ticket>(c, s);
  cuda_emu::Enqueue(
      s,
      [c, ticket, call, fail_index, body = std::move(body)] {
        Run(*c, call, fail_index, body);
        ticket->Done();
      },
      cuda_emu::TraceKind::kCollective, call);
}

// Runs every closure of c still queued: waits (host) on each stream that holds one, as the
// device current at init (a NULL stream is that device's), until none is left.
void Drain(ncclComm& c) {
  int saved = 0;
  const bool restore = cudaGetDevice(&saved) == cudaSuccess;
  cudaSetDevice(c.ordinal);
  std::unique_lock<std::mutex> lock(c.mu);
  while (!c.pending.empty()) {
    std::vector<cudaStream_t> streams;
    for (const auto& entry : c.pending) streams.push_back(entry.first);
    lock.unlock();
    for (cudaStream_t s : streams) cudaStreamSynchronize(s);
    lock.lock();
    // a closure may still be running on another thread that waits on the same stream
    c.cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return c.pending.empty(); });
  }
  lock.unlock();
  if (restore) cudaSetDevice(saved);
}

// ---------------------------------------------------------------------------------------------
// Groups: thread-local, nested. Everything issued inside is queued at the outermost end.

struct P2p {
  bool send;
  void* buf;
  int count;
  MPI_Datatype type;
  int peer;
};

struct DeferredCall {
  CommPtr comm;
  cudaStream_t stream;
  const char* call;
  Body body;
};

struct DeferredP2p {
  CommPtr comm;
  cudaStream_t stream;
  std::vector<P2p> ops;
};

struct GroupState {
  int depth = 0;
  ncclResult_t error = ncclSuccess;   // the group's first error: NCCL then drops the group
  std::vector<DeferredCall> calls;    // in call order
  std::vector<DeferredP2p> p2p;       // one entry per (comm, stream), in first-use order
};

thread_local GroupState t_group;

// A call's result, also remembered as the group's error when it fails inside a group.
ncclResult_t Note(ncclResult_t r) {
  if (r != ncclSuccess && t_group.depth > 0 && t_group.error == ncclSuccess) t_group.error = r;
  return r;
}

// A collective: queued now, or at the end of the enclosing group.
ncclResult_t Submit(const CommPtr& c, cudaStream_t s, const char* call, Body body) {
  if (t_group.depth > 0)
    t_group.calls.push_back(DeferredCall{c, s, call, std::move(body)});
  else
    Queue(c, s, call, std::move(body));
  return ncclSuccess;
}

// Posts every send and receive, then waits for all (so that they progress together), and
// checks that each receive got the count it asked for.
std::string RunP2p(MPI_Comm m, const std::vector<P2p>& ops) {
  std::vector<MPI_Request> reqs(ops.size(), MPI_REQUEST_NULL);
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2p& op = ops[i];
    const int rc = op.send ? MPI_Isend(op.buf, op.count, op.type, op.peer, kP2pTag, m, &reqs[i])
                           : MPI_Irecv(op.buf, op.count, op.type, op.peer, kP2pTag, m, &reqs[i]);
    std::string err = MpiCheck(rc, op.send ? "MPI_Isend" : "MPI_Irecv");
    if (!err.empty()) return err;
  }
  std::vector<MPI_Status> status(ops.size());
  std::string err = MpiCheck(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), status.data()), "MPI_Waitall");
  for (size_t i = 0; i < ops.size() && err.empty(); ++i) {
    int got = 0;
    if (ops[i].send || MPI_Get_count(&status[i], ops[i].type, &got) != MPI_SUCCESS || got == ops[i].count) continue;
    err = "ncclRecv from rank " + std::to_string(ops[i].peer) + " expected " + std::to_string(ops[i].count) +
          " elements, the peer sent " + std::to_string(got);
  }
  return err;
}

// A send or receive: fused with the group's others on the same (comm, stream), or alone.
ncclResult_t SubmitP2p(const CommPtr& c, cudaStream_t s, const char* call, const P2p& op) {
  if (t_group.depth == 0) {
    Queue(c, s, call, [op](MPI_Comm m) { return RunP2p(m, {op}); });
    return ncclSuccess;
  }
  for (DeferredP2p& d : t_group.p2p) {
    if (d.comm == c && d.stream == s) {
      d.ops.push_back(op);
      return ncclSuccess;
    }
  }
  t_group.p2p.push_back(DeferredP2p{c, s, {op}});
  return ncclSuccess;
}

// ---------------------------------------------------------------------------------------------
// Bootstrap

// Init needs MPI initialised with MPI_THREAD_MULTIPLE: closures call MPI from any thread.
ncclResult_t MpiReady(const char* call) {
  int initialized = 0, finalized = 0, provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  const std::string name(call);
  if (!initialized || finalized)
    return Error(nullptr, ncclInvalidUsage, name + ": the NCCL emulation needs MPI initialised (MPI_Init_thread)");
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE)
    return Error(nullptr, ncclInvalidUsage,
                 name + ": the NCCL emulation needs MPI_THREAD_MULTIPLE (MPI provides level " +
                     std::to_string(provided) + ")");
  std::call_once(g_bf16_once, CreateBf16Ops);
  return ncclSuccess;
}

// "" when config is usable (sets *blocking), else why not. NULL: NCCL's defaults (blocking).
std::string ConfigError(const ncclConfig_t* config, bool* blocking) {
  *blocking = true;
  if (config == nullptr) return "";
  if (config->magic != kConfigMagic || config->size < offsetof(ncclConfig_t, blocking) + sizeof(int))
    return "config was not initialised with NCCL_CONFIG_INITIALIZER";
  *blocking = config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
  return "";
}

// The MPI_Comm_split color for an id: a non-negative hash (FNV-1a) of its bytes.
int Color(const ncclUniqueId& id) {
  uint64_t h = 1469598103934665603ull;
  for (char ch : id.internal) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  return static_cast<int>((h ^ (h >> 32)) & 0x7fffffff);
}

// Makes a comm from a freshly split MPI communicator (which it takes over) and registers it.
ncclResult_t MakeComm(const char* call, MPI_Comm joined, int ordinal, int device, bool blocking, ncclComm_t* out) {
  auto c = std::make_shared<ncclComm>();
  MPI_Comm_size(joined, &c->nranks);
  MPI_Comm_rank(joined, &c->rank);
  c->ordinal = ordinal, c->device = device, c->blocking = blocking;
  c->ctrl = joined;
  MPI_Comm_set_errhandler(joined, MPI_ERRORS_RETURN);  // errors become codes, then ncclSystemError
  std::string err = MpiCheck(MPI_Comm_dup(joined, &c->data), "MPI_Comm_dup");
  if (!err.empty()) {
    MPI_Comm_free(&c->ctrl);
    return Error(nullptr, ncclSystemError, std::string(call) + ": " + err);
  }
  c->progress_reports = blocking ? 0 : 1;
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    Registry()[c.get()] = c;
  }
  *out = c.get();
  return blocking ? ncclSuccess : ncclInProgress;
}

// A non-blocking init that failed during the bootstrap hands back a comm in error, as NCCL's
// does: ncclCommGetAsyncError and ncclGetLastError report it; abort or destroy it.
ncclResult_t ErrorComm(ncclResult_t r, const std::string& text, int ordinal, int device, ncclComm_t* out) {
  auto c = std::make_shared<ncclComm>();
  c->ordinal = ordinal, c->device = device, c->blocking = false;
  SetAsyncLocked(*c, r, text);  // not shared yet: no lock needed
  Error(nullptr, r, text);
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    Registry()[c.get()] = c;
  }
  *out = c.get();
  return ncclInProgress;
}

// After the split: every member checks that the group is what its caller described (nranks
// members, itself at `rank`), and all agree on the outcome.
std::string CheckJoined(MPI_Comm joined, int nranks, int rank) {
  int size = 0, me = 0;
  MPI_Comm_size(joined, &size);
  MPI_Comm_rank(joined, &me);
  int ok = size == nranks && me == rank;
  std::string err = MpiCheck(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_LAND, joined), "MPI_Allreduce");
  if (!err.empty() || ok) return err;
  return "the processes that passed this unique id form a group of " + std::to_string(size) +
         " in which this one is rank " + std::to_string(me) + ", but it was called with nranks " +
         std::to_string(nranks) + " and rank " + std::to_string(rank) +
         " (every member needs the same nranks and a distinct rank; in the emulation every process of MPI_COMM_WORLD "
         "must call init)";
}

}  // namespace

// =============================================================================================
// The API

extern "C" {

// The version of the real NCCL that the emulation follows.
ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return Error(nullptr, ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

// Random bytes with the pid, the time and a counter: distinct per call across the job.
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return Error(nullptr, ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  static std::atomic<uint32_t> counter{0};
  std::random_device rd;
  for (size_t i = 0; i < sizeof(id->internal); i += sizeof(unsigned)) {
    const unsigned r = rd();
    std::memcpy(id->internal + i, &r, sizeof(r));
  }
  const uint32_t pid = static_cast<uint32_t>(getpid()), n = counter++;
  const int64_t t = std::chrono::system_clock::now().time_since_epoch().count();
  std::memcpy(id->internal, &pid, sizeof(pid));
  std::memcpy(id->internal + 4, &n, sizeof(n));
  std::memcpy(id->internal + 8, &t, sizeof(t));
  return ncclSuccess;
}

// Joins the processes that pass the same id with MPI_Comm_split over MPI_COMM_WORLD (so every
// process of the job must call this), bound to the current CUDA device.
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config) {
  static const char* const kCall = "ncclCommInitRankConfig";
  ncclResult_t r = MpiReady(kCall);
  if (r != ncclSuccess) return r;
  bool blocking = true;
  std::string bad = ConfigError(config, &blocking);
  if (comm == nullptr) bad = "comm is NULL";
  if (nranks < 1 || rank < 0 || rank >= nranks)
    bad = "rank " + std::to_string(rank) + " outside [0, nranks " + std::to_string(nranks) + ")";
  int ordinal = 0;
  if (bad.empty() && cudaGetDevice(&ordinal) != cudaSuccess) bad = "no current CUDA device";
  if (comm != nullptr) *comm = nullptr;
  // Take part in the split even when refusing: the other processes are waiting in it.
  MPI_Comm joined = MPI_COMM_NULL;
  const int rc = MPI_Comm_split(MPI_COMM_WORLD, bad.empty() ? Color(commId) : MPI_UNDEFINED, rank, &joined);
  if (!bad.empty()) return Error(nullptr, ncclInvalidArgument, std::string(kCall) + ": " + bad);
  const int device = cuda_emu::StreamDevice(nullptr);
  std::string err = MpiCheck(rc, "MPI_Comm_split(MPI_COMM_WORLD)");
  if (err.empty()) err = CheckJoined(joined, nranks, rank);
  if (err.empty()) return MakeComm(kCall, joined, ordinal, device, blocking, comm);
  if (joined != MPI_COMM_NULL) MPI_Comm_free(&joined);
  const ncclResult_t why = rc != MPI_SUCCESS ? ncclSystemError : ncclInvalidArgument;
  if (!blocking) return ErrorComm(why, std::string(kCall) + ": " + err, ordinal, device, comm);
  return Error(nullptr, why, std::string(kCall) + ": " + err);
}

// ncclCommInitRankConfig with NCCL's default config (blocking).
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return ncclCommInitRankConfig(comm, nranks, commId, rank, nullptr);
}

// MPI_Comm_split of the parent (collective over it, as NCCL's); the child is bound to the
// parent's device and inherits its blocking mode unless config says otherwise.
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  static const char* const kCall = "ncclCommSplit";
  CommPtr c;
  ncclResult_t r = FindReady(kCall, comm, &c);
  if (r != ncclSuccess) return r;
  bool blocking = c->blocking;
  std::string bad = config != nullptr ? ConfigError(config, &blocking) : "";
  if (newcomm == nullptr) bad = "newcomm is NULL";
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    bad = "color " + std::to_string(color) + " is negative and not NCCL_SPLIT_NOCOLOR";
  if (newcomm != nullptr) *newcomm = nullptr;
  // Take part in the split even when refusing: the parent's other ranks are waiting in it.
  const int mpi_color = !bad.empty() || color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color;
  MPI_Comm part = MPI_COMM_NULL;
  std::string err = MpiCheck(MPI_Comm_split(c->ctrl, mpi_color, key, &part), "MPI_Comm_split");
  if (!bad.empty()) return Error(c.get(), ncclInvalidArgument, std::string(kCall) + ": " + bad);
  if (!err.empty()) return Error(c.get(), ncclSystemError, std::string(kCall) + ": " + err);
  if (part == MPI_COMM_NULL) return ncclSuccess;  // NCCL_SPLIT_NOCOLOR: no communicator
  return MakeComm(kCall, part, c->ordinal, c->device, blocking, newcomm);
}

// Runs (by waiting on their streams) every closure queued on the comm; then the comm takes
// no more work. Non-blocking: ncclInProgress, then ncclCommGetAsyncError says when done.
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  CommPtr c;
  ncclResult_t r = FindReady("ncclCommFinalize", comm, &c);
  if (r != ncclSuccess) return r;
  Drain(*c);
  std::lock_guard<std::mutex> lock(c->mu);
  c->finalized = true;
  if (c->blocking) return c->async;
  c->progress_reports = 1;
  return ncclInProgress;
}

// Frees the comm. Without a finalize (and not aborted) it first finalizes (drains). After an
// abort with a closure still inside MPI, that closure frees the MPI communicators when it returns.
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  CommPtr c = Lookup(comm);
  if (c == nullptr) return NotLive("ncclCommDestroy", comm);
  bool drain;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    drain = !c->aborted && !c->finalized;
  }
  if (drain) Drain(*c);
  std::pair<MPI_Comm, MPI_Comm> to_free;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    c->destroyed = true;
    to_free = TakeMpiIfIdleLocked(*c);
  }
  FreeMpi(to_free.first, to_free.second);
  std::lock_guard<std::mutex> lock(g_registry_mu);
  Registry().erase(comm);
  return ncclSuccess;
}

// Marks the comm aborted and returns at once (never blocks): its queued closures will do
// nothing, later calls return ncclInvalidUsage, ncclCommDestroy frees it.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  CommPtr c = Lookup(comm);
  if (c == nullptr) return NotLive("ncclCommAbort", comm);
  std::lock_guard<std::mutex> lock(c->mu);
  c->aborted = true;
  c->cv.notify_all();
  return ncclSuccess;
}

// The comm's asynchronous state: its error if any, else ncclInProgress for the first poll
// after a non-blocking init, split or finalize, else ncclSuccess. Never waits for MPI.
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (asyncError == nullptr) return Error(nullptr, ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  CommPtr c;
  ncclResult_t r = Find("ncclCommGetAsyncError", comm, &c);
  if (r != ncclSuccess) {
    *asyncError = r;  // so that a polling loop that reads only *asyncError ends
    return r;
  }
  std::lock_guard<std::mutex> lock(c->mu);
  if (c->async != ncclSuccess) {
    *asyncError = c->async;
  } else if (c->progress_reports > 0) {
    --c->progress_reports;
    *asyncError = ncclInProgress;
  } else {
    *asyncError = ncclSuccess;
  }
  return ncclSuccess;
}

// The queries: what init recorded (refused on an aborted comm, as every call).
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  CommPtr c;
  ncclResult_t r = Find("ncclCommCount", comm, &c);
  if (r == ncclSuccess && count == nullptr) r = Error(c.get(), ncclInvalidArgument, "ncclCommCount: count is NULL");
  if (r == ncclSuccess) *count = c->nranks;
  return r;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  CommPtr c;
  ncclResult_t r = Find("ncclCommCuDevice", comm, &c);
  if (r == ncclSuccess && device == nullptr)
    r = Error(c.get(), ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
  if (r == ncclSuccess) *device = c->ordinal;
  return r;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  CommPtr c;
  ncclResult_t r = Find("ncclCommUserRank", comm, &c);
  if (r == ncclSuccess && rank == nullptr) r = Error(c.get(), ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
  if (r == ncclSuccess) *rank = c->rank;
  return r;
}

// NCCL's texts, less the NCCL_DEBUG hints (the emulation's detail is in ncclGetLastError).
const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

// The comm's last error text if it has one, else the calling thread's.
const char* ncclGetLastError(ncclComm_t comm) {
  CommPtr c = comm != nullptr ? Lookup(comm) : nullptr;
  if (c == nullptr) return t_last_error;
  std::lock_guard<std::mutex> lock(c->mu);
  return c->last_error[0] != '\0' ? c->last_error : t_last_error;
}

}  // extern "C"

namespace {

// ncclAllReduce: MPI_Allreduce (in place when recvbuff == sendbuff), then the ncclAvg division.
ncclResult_t AllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                       ncclComm_t comm, cudaStream_t stream) {
  static const char* const kCall = "ncclAllReduce";
  CommPtr c;
  Type t;
  ncclResult_t r = Begin(kCall, comm, count, type, &op, &c, &t);
  if (r != ncclSuccess || count == 0) return r;
  if (send == nullptr) return NullBuffer(c.get(), kCall, "sendbuff", count);
  if (recv == nullptr) return NullBuffer(c.get(), kCall, "recvbuff", count);
  const size_t bytes = count * t.size;
  CheckStream(kCall, *c, stream);
  CheckBuffer(kCall, "sendbuff", *c, send, bytes);
  CheckBuffer(kCall, "recvbuff", *c, recv, bytes);
  const bool in_place = send == recv;
  if (!in_place) CheckDisjoint(kCall, send, bytes, recv, bytes);
  const int nranks = c->nranks;
  return Submit(c, stream, kCall, [=](MPI_Comm m) {
    std::string err = MpiCheck(MPI_Allreduce(in_place ? MPI_IN_PLACE : send, recv, static_cast<int>(count), t.mpi,
                                             MpiOp(op, type), m),
                               "MPI_Allreduce");
    if (err.empty() && op == ncclAvg) Divide(recv, count, type, nranks);
    return err;
  });
}

// ncclReduceScatter: MPI_Reduce_scatter_block; in place (recvbuff = this rank's block of
// sendbuff) through a temporary, since MPI forbids the aliasing.
ncclResult_t ReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  static const char* const kCall = "ncclReduceScatter";
  CommPtr c;
  Type t;
  ncclResult_t r = Begin(kCall, comm, count, type, &op, &c, &t);
  if (r != ncclSuccess || count == 0) return r;
  if (send == nullptr) return NullBuffer(c.get(), kCall, "sendbuff", count);
  if (recv == nullptr) return NullBuffer(c.get(), kCall, "recvbuff", count);
  const size_t rbytes = count * t.size, sbytes = rbytes * c->nranks;
  CheckStream(kCall, *c, stream);
  CheckBuffer(kCall, "sendbuff", *c, send, sbytes);
  CheckBuffer(kCall, "recvbuff", *c, recv, rbytes);
  const bool in_place = recv == static_cast<const char*>(send) + static_cast<size_t>(c->rank) * rbytes;
  if (!in_place) CheckDisjoint(kCall, send, sbytes, recv, rbytes);
  const int nranks = c->nranks;
  return Submit(c, stream, kCall, [=](MPI_Comm m) {
    std::vector<char> tmp(in_place ? rbytes : 0);
    void* out = in_place ? static_cast<void*>(tmp.data()) : recv;
    std::string err = MpiCheck(MPI_Reduce_scatter_block(send, out, static_cast<int>(count), t.mpi, MpiOp(op, type), m),
                               "MPI_Reduce_scatter_block");
    if (err.empty() && in_place) std::memcpy(recv, tmp.data(), rbytes);
    if (err.empty() && op == ncclAvg) Divide(recv, count, type, nranks);
    return err;
  });
}

// ncclAllGather: MPI_Allgather; in place (sendbuff = this rank's block of recvbuff) is
// exactly MPI_IN_PLACE.
ncclResult_t AllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                       cudaStream_t stream) {
  static const char* const kCall = "ncclAllGather";
  CommPtr c;
  Type t;
  ncclResult_t r = Begin(kCall, comm, count, type, nullptr, &c, &t);
  if (r != ncclSuccess || count == 0) return r;
  if (send == nullptr) return NullBuffer(c.get(), kCall, "sendbuff", count);
  if (recv == nullptr) return NullBuffer(c.get(), kCall, "recvbuff", count);
  const size_t sbytes = count * t.size, rbytes = sbytes * c->nranks;
  CheckStream(kCall, *c, stream);
  CheckBuffer(kCall, "sendbuff", *c, send, sbytes);
  CheckBuffer(kCall, "recvbuff", *c, recv, rbytes);
  const bool in_place = send == static_cast<const char*>(recv) + static_cast<size_t>(c->rank) * sbytes;
  if (!in_place) CheckDisjoint(kCall, send, sbytes, recv, rbytes);
  return Submit(c, stream, kCall, [=](MPI_Comm m) {
    const int n = static_cast<int>(count);
    return MpiCheck(MPI_Allgather(in_place ? MPI_IN_PLACE : send, n, t.mpi, recv, n, t.mpi, m), "MPI_Allgather");
  });
}

// ncclBroadcast: the root copies sendbuff to recvbuff (unless in place), then MPI_Bcast of
// recvbuff. sendbuff is only used (and checked) on the root.
ncclResult_t Broadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  static const char* const kCall = "ncclBroadcast";
  CommPtr c;
  Type t;
  ncclResult_t r = Begin(kCall, comm, count, type, nullptr, &c, &t);
  if (r != ncclSuccess) return r;
  if (root < 0 || root >= c->nranks) return BadRank(c.get(), kCall, "root", root);
  if (count == 0) return ncclSuccess;
  const bool is_root = c->rank == root;
  if (is_root && send == nullptr) return NullBuffer(c.get(), kCall, "sendbuff", count);
  if (recv == nullptr) return NullBuffer(c.get(), kCall, "recvbuff", count);
  const size_t bytes = count * t.size;
  CheckStream(kCall, *c, stream);
  CheckBuffer(kCall, "recvbuff", *c, recv, bytes);
  const bool copy = is_root && send != recv;
  if (copy) {
    CheckBuffer(kCall, "sendbuff", *c, send, bytes);
    CheckDisjoint(kCall, send, bytes, recv, bytes);
  }
  return Submit(c, stream, kCall, [=](MPI_Comm m) {
    if (copy) std::memcpy(recv, send, bytes);
    return MpiCheck(MPI_Bcast(recv, static_cast<int>(count), t.mpi, root, m), "MPI_Bcast");
  });
}

// ncclReduce: MPI_Reduce to the root (in place there when recvbuff == sendbuff), then the
// ncclAvg division on the root. recvbuff is only used (and checked) on the root.
ncclResult_t Reduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root,
                    ncclComm_t comm, cudaStream_t stream) {
  static const char* const kCall = "ncclReduce";
  CommPtr c;
  Type t;
  ncclResult_t r = Begin(kCall, comm, count, type, &op, &c, &t);
  if (r != ncclSuccess) return r;
  if (root < 0 || root >= c->nranks) return BadRank(c.get(), kCall, "root", root);
  if (count == 0) return ncclSuccess;
  const bool is_root = c->rank == root;
  if (send == nullptr) return NullBuffer(c.get(), kCall, "sendbuff", count);
  if (is_root && recv == nullptr) return NullBuffer(c.get(), kCall, "recvbuff", count);
  const size_t bytes = count * t.size;
  CheckStream(kCall, *c, stream);
  CheckBuffer(kCall, "sendbuff", *c, send, bytes);
  const bool in_place = is_root && send == recv;
  if (is_root && !in_place) {
    CheckBuffer(kCall, "recvbuff", *c, recv, bytes);
    CheckDisjoint(kCall, send, bytes, recv, bytes);
  }
  void* out = is_root ? recv : nullptr;
  const int nranks = c->nranks;
  return Submit(c, stream, kCall, [=](MPI_Comm m) {
    std::string err = MpiCheck(MPI_Reduce(in_place ? MPI_IN_PLACE : send, out, static_cast<int>(count), t.mpi,
                                          MpiOp(op, type), root, m),
                               "MPI_Reduce");
    if (err.empty() && is_root && op == ncclAvg) Divide(recv, count, type, nranks);
    return err;
  });
}

// ncclSend / ncclRecv: checked, then queued alone or fused with the group's.
ncclResult_t PointToPoint(const char* call, bool send, void* buf, size_t count, ncclDataType_t type, int peer,
                          ncclComm_t comm, cudaStream_t stream) {
  CommPtr c;
  Type t;
  ncclResult_t r = Begin(call, comm, count, type, nullptr, &c, &t);
  if (r != ncclSuccess) return r;
  if (peer < 0 || peer >= c->nranks) return BadRank(c.get(), call, "peer", peer);
  if (count == 0) return ncclSuccess;
  if (buf == nullptr) return NullBuffer(c.get(), call, send ? "sendbuff" : "recvbuff", count);
  CheckStream(call, *c, stream);
  CheckBuffer(call, send ? "sendbuff" : "recvbuff", *c, buf, count * t.size);
  return SubmitP2p(c, stream, send ? "ncclSend" : "ncclRecv", P2p{send, buf, static_cast<int>(count), t.mpi, peer});
}

}  // namespace

extern "C" {

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return Note(AllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream));
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return Note(ReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream));
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return Note(AllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream));
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return Note(Broadcast(sendbuff, recvbuff, count, datatype, root, comm, stream));
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  return Note(Reduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream));
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  // MPI_Isend reads the buffer only; P2p keeps one pointer type for both directions
  return Note(PointToPoint("ncclSend", true, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream));
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return Note(PointToPoint("ncclRecv", false, recvbuff, count, datatype, peer, comm, stream));
}

// Opens a (nested) group on this thread.
ncclResult_t ncclGroupStart(void) {
  ++t_group.depth;
  return ncclSuccess;
}

// Closes a group; the outermost end queues the group's calls: collectives in call order, then
// one fused send/receive closure per (comm, stream). A group in which a call failed is
// dropped and its first error returned, as NCCL does.
ncclResult_t ncclGroupEnd(void) {
  if (t_group.depth == 0) return Error(nullptr, ncclInvalidUsage, "ncclGroupEnd: no matching ncclGroupStart");
  if (--t_group.depth > 0) return ncclSuccess;
  GroupState group = std::move(t_group);
  t_group = GroupState{};
  if (group.error != ncclSuccess) return group.error;
  for (DeferredCall& d : group.calls) Queue(d.comm, d.stream, d.call, std::move(d.body));
  for (DeferredP2p& d : group.p2p) {
    Queue(d.comm, d.stream, "ncclSend/ncclRecv (group)",
          [ops = std::move(d.ops)](MPI_Comm m) { return RunP2p(m, ops); });
  }
  return ncclSuccess;
}

}  // extern "C"
