// The CUDA emulation's NCCL (build option SHARDGPT_CUDA_EMULATION): the subset of NCCL 2.28.9
// that shardgpt uses, carried over MPI, so that parallel/nccl/ compiles and runs unchanged on
// the CPU. Names, numeric values, NCCL_CONFIG_INITIALIZER and NCCL_SPLIT_NOCOLOR are those of
// the real nccl.h; the declarations are our own (never include the real header).
//
// What the emulation guarantees:
//  - Every collective and send/receive is validated when it is called and then runs as ONE
//    host closure queued on the given stream (cuda_emu::Enqueue): it happens in stream order,
//    on whichever host thread next waits on the stream, with MPI on a communicator of its own.
//    Count 0 is a no-op (nothing is queued).
//  - Results: reductions of fp32/fp64/integers are MPI's built-in MPI_SUM/PROD/MAX/MIN.
//    bf16 (raw uint16 bits) is reduced by user-defined MPI ops that compute in fp32 and round
//    to bf16 (round to nearest even, NaN stays NaN) after every pairwise step: with two
//    contributions the result is exactly bf16(float(a) + float(b)). ncclAvg is the sum, then a
//    division by nranks: fp32 x = sum / n (fp32 division); fp64 likewise; bf16
//    x = bf16(float(bf16 sum) / n) (one more rounding); integers truncate (sum / n). Real NCCL
//    computes a floating-point average as sum(x_i * (1/n)), which can differ in the last bit.
//  - In place as NCCL allows: recvbuff == sendbuff (all-reduce, broadcast, reduce), recvbuff
//    == sendbuff + rank * recvcount (reduce-scatter), sendbuff == recvbuff + rank * sendcount
//    (all-gather). Any other overlap of sendbuff and recvbuff is a misuse.
//  - Misuse that a real GPU punishes with a crash or garbage ends the process through
//    cuda_emu::Fail with one line naming the call: a stream of another device than the
//    communicator's, a buffer not inside one cudaMalloc allocation of the communicator's
//    device, an illegal overlap. Argument errors return ncclInvalidArgument and set
//    ncclGetLastError, as NCCL does (NULL buffer, bad type/op/root/peer, count > INT_MAX).
//  - ncclSend/ncclRecv inside ncclGroupStart/End are fused: at the outermost ncclGroupEnd, one
//    closure per (communicator, stream) posts every MPI_Isend/MPI_Irecv and waits for all, so
//    an all-to-all of sends and receives cannot deadlock. All calls of a group are queued at
//    the outermost ncclGroupEnd: collectives in call order, then the fused send/receives.
//  - config.blocking == 0: init, split and finalize return ncclInProgress, and
//    ncclCommGetAsyncError then reports ncclInProgress once and ncclSuccess afterwards.
//  - ncclCommAbort never blocks; afterwards every call on the comm returns ncclInvalidUsage
//    (the handle stays valid until ncclCommDestroy) and its queued closures do nothing.
//  - Failure injection: SHARDGPT_NCCL_EMU_FAIL_AT=N makes the N-th operation of the process
//    (a collective, an ungrouped send or receive, or one fused group of them; counted when
//    queued, from when the variable got its current value) do nothing and set the comm's
//    asynchronous error to ncclRemoteError with ncclGetLastError
//    "emulated failure (SHARDGPT_NCCL_EMU_FAIL_AT)". After an asynchronous error, later calls
//    on the comm return that error and its queued closures do nothing.
//
// What it does not guarantee (limitations):
//  - Initialisation is collective over MPI_COMM_WORLD: ncclCommInitRank[Config] is an
//    MPI_Comm_split(MPI_COMM_WORLD, hash of the id, rank), so EVERY process of the MPI job must
//    call it, the same number of times in the same order (disjoint groups with different ids
//    may initialise in the same round). It blocks until all have. Not inside a group.
//  - Non-blocking mode is emulated: init, split and finalize do their work before returning.
//    ncclCommFinalize (and ncclCommDestroy without it) waits, with cudaStreamSynchronize, on
//    every stream that still holds a closure of the comm, so that they run.
//  - Operations of one comm run in the order the threads waiting on its streams reach them;
//    they are serialised per comm but not forced into issue order: with several streams per
//    comm, every rank must wait on them in the same order. Ranks are not checked to use
//    distinct devices. MPI needs MPI_THREAD_MULTIPLE (init fails otherwise).
//  - Not emulated: fp16/fp8 reductions (ncclInvalidArgument; they can be moved), user
//    reduction ops, buffer registration, ncclCommInitAll/Shrink/Revoke, ncclAlltoAll, ...
//  - An aborted comm whose closure is blocked in MPI keeps its MPI communicators until that
//    closure returns. A comm that is aborted but never destroyed is kept until the process ends.
#pragma once

#include <limits.h>
#include <stddef.h>

#include "cuda_runtime.h"

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""
#define NCCL_VERSION_CODE 22809
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm* ncclComm_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1

// The real 2.28 layout, so that code setting any field compiles; only `blocking` is honoured
// (NCCL_CONFIG_UNDEF_INT means blocking, NCCL's default). size and magic are checked.
typedef struct ncclConfig_v22800 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                                           \
  {                                                                                                       \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),                   \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,       \
        NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR,       \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,       \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                                                      \
  }

typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0, ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2, ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6, ncclHalf = 6,
  ncclFloat32 = 7, ncclFloat = 7,
  ncclFloat64 = 8, ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
const char* ncclGetErrorString(ncclResult_t result);
// The last error of `comm` (NULL: of the calling thread). The text may be overwritten by a
// later error; copy it.
const char* ncclGetLastError(ncclComm_t comm);

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#ifdef __cplusplus
}  // extern "C"
#endif
