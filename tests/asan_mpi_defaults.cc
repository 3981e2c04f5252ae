// AddressSanitizer's defaults for an executable that initialises MPI; linked into those
// executables in the sanitizer builds only (CMakeLists.txt: SHARDGPT_MPI_ASAN_DEFAULTS).
// Open MPI keeps blocks from MPI_Init to exit, allocated in components it unloads at
// MPI_Finalize: only a full allocation stack (the slow unwinder) still reaches a frame in a
// library that tests/lsan.supp names. An executable without MPI keeps the fast unwinder, which
// costs far less per allocation. ASAN_OPTIONS in the environment override these.
extern "C" __attribute__((visibility("default"), used)) const char* __asan_default_options() {
  return "fast_unwind_on_malloc=0";
}
