#include "io/checkpoint_index.h"

#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>

#include "io/checkpoint_h5.h"
#include "io/file_checks.h"

namespace shardgpt {

using h5::Id;

namespace {

constexpr const char* kIndexFormat = "shardgpt-checkpoint";
constexpr const char* kHeaderMagic = "shardgpt checkpoint index\n";
constexpr char kHdf5Signature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
constexpr int64_t kMaxWorld = int64_t{1} << 24;
constexpr int64_t kMaxStep = 2147483647;  // the training loop counts steps in an int

// ---- records of the compound tables ----

struct TensorRec {
  char name[96];
  int32_t unit;
  int32_t ndim;
  int64_t shape[4];
  int64_t offset;  // element offset inside the unit
  int64_t numel;
  char dtype[8];
};
struct UnitRec {
  char name[32];
  int64_t offset;  // element offset in the global flat buffer
  int64_t numel;
};
struct PieceRec {
  int32_t unit;
  int32_t file;
  int64_t begin, end, file_offset;
};
struct FileRec {
  char name[32];
  int64_t elements;
  int64_t bytes;
  uint32_t crc32c_master, crc32c_m, crc32c_v;
};

Id StrType(size_t n) {
  Id t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t.get(), n);
  H5Tset_strpad(t.get(), H5T_STR_NULLTERM);
  return t;
}

Id TensorType() {
  Id t(H5Tcreate(H5T_COMPOUND, sizeof(TensorRec)), H5Tclose);
  Id name = StrType(sizeof(TensorRec::name)), dtype = StrType(sizeof(TensorRec::dtype));
  const hsize_t four = 4;
  Id shape(H5Tarray_create2(H5T_NATIVE_INT64, 1, &four), H5Tclose);
  H5Tinsert(t.get(), "name", HOFFSET(TensorRec, name), name.get());
  H5Tinsert(t.get(), "unit", HOFFSET(TensorRec, unit), H5T_NATIVE_INT32);
  H5Tinsert(t.get(), "ndim", HOFFSET(TensorRec, ndim), H5T_NATIVE_INT32);
  H5Tinsert(t.get(), "shape", HOFFSET(TensorRec, shape), shape.get());
  H5Tinsert(t.get(), "offset", HOFFSET(TensorRec, offset), H5T_NATIVE_INT64);
  H5Tinsert(t.get(), "numel", HOFFSET(TensorRec, numel), H5T_NATIVE_INT64);
  H5Tinsert(t.get(), "dtype", HOFFSET(TensorRec, dtype), dtype.get());
  return t;
}
Id UnitType() {
  Id t(H5Tcreate(H5T_COMPOUND, sizeof(UnitRec)), H5Tclose);
  Id name = StrType(sizeof(UnitRec::name));
  H5Tinsert(t.get(), "name", HOFFSET(UnitRec, name), name.get());
  H5Tinsert(t.get(), "offset", HOFFSET(UnitRec, offset), H5T_NATIVE_INT64);
  H5Tinsert(t.get(), "numel", HOFFSET(UnitRec, numel), H5T_NATIVE_INT64);
  return t;
}
Id PieceType() {
  Id t(H5Tcreate(H5T_COMPOUND, sizeof(PieceRec)), H5Tclose);
  H5Tinsert(t.get(), "unit", HOFFSET(PieceRec, unit), H5T_NATIVE_INT32);
  H5Tinsert(t.get(), "file", HOFFSET(PieceRec, file), H5T_NATIVE_INT32);
  H5Tinsert(t.get(), "begin", HOFFSET(PieceRec, begin), H5T_NATIVE_INT64);
  H5Tinsert(t.get(), "end", HOFFSET(PieceRec, end), H5T_NATIVE_INT64);
  H5Tinsert(t.get(), "file_offset", HOFFSET(PieceRec, file_offset), H5T_NATIVE_INT64);
  return t;
}
Id FileType() {
  Id t(H5Tcreate(H5T_COMPOUND, sizeof(FileRec)), H5Tclose);
  Id name = StrType(sizeof(FileRec::name));
  H5Tinsert(t.get(), "name", HOFFSET(FileRec, name), name.get());
  H5Tinsert(t.get(), "elements", HOFFSET(FileRec, elements), H5T_NATIVE_INT64);
  H5Tinsert(t.get(), "bytes", HOFFSET(FileRec, bytes), H5T_NATIVE_INT64);
  H5Tinsert(t.get(), "crc32c_master", HOFFSET(FileRec, crc32c_master), H5T_NATIVE_UINT32);
  H5Tinsert(t.get(), "crc32c_m", HOFFSET(FileRec, crc32c_m), H5T_NATIVE_UINT32);
  H5Tinsert(t.get(), "crc32c_v", HOFFSET(FileRec, crc32c_v), H5T_NATIVE_UINT32);
  return t;
}

template <typename Rec>
bool WriteRecords(hid_t parent, const char* name, hid_t type, const std::vector<Rec>& recs) {
  const hsize_t n = recs.size();
  Id space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  Id dset(H5Dcreate2(parent, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  return dset.valid() && (n == 0 || H5Dwrite(dset.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, recs.data()) >= 0);
}

// Reads table `name` of `parent` into recs. The table must be what the writer makes: a 1-D
// dataset of exactly `type` (no conversion), stored plainly (contiguous or compact, no
// filters) with every record present in the image, so the records we allocate never
// outnumber the bytes that hold them (a crafted dataspace cannot claim more).
template <typename Rec>
Status ReadRecords(hid_t parent, const std::string& group, const char* name, hid_t type, uint64_t image_bytes,
                   std::vector<Rec>* recs, const std::string& path) {
  const std::string what = path + ": /" + group + "/" + name;
  if (H5Lexists(parent, name, H5P_DEFAULT) <= 0) return Status::Corruption(what + " missing");
  Id dset(H5Dopen2(parent, name, H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) return Status::Corruption(what + ": cannot open (" + h5::LastError() + ")");
  Id ftype(H5Dget_type(dset.get()), H5Tclose);
  if (!ftype.valid() || H5Tequal(ftype.get(), type) <= 0)
    return Status::Corruption(what + ": not a table of this format's records (its record type differs)");
  Id space(H5Dget_space(dset.get()), H5Sclose);
  hsize_t n = 0;
  if (!space.valid() || H5Sget_simple_extent_type(space.get()) != H5S_SIMPLE ||
      H5Sget_simple_extent_ndims(space.get()) != 1 || H5Sget_simple_extent_dims(space.get(), &n, nullptr) != 1)
    return Status::Corruption(what + ": expected a 1-D table");
  Id dcpl(H5Dget_create_plist(dset.get()), H5Pclose);
  const H5D_layout_t layout = dcpl.valid() ? H5Pget_layout(dcpl.get()) : H5D_LAYOUT_ERROR;
  if ((layout != H5D_CONTIGUOUS && layout != H5D_COMPACT) || H5Pget_nfilters(dcpl.get()) != 0)
    return Status::Corruption(what + ": expected plain (contiguous, unfiltered) storage");
  const uint64_t rec_bytes = sizeof(Rec);
  if (n > image_bytes / rec_bytes || (n > 0 && H5Dget_storage_size(dset.get()) < n * rec_bytes))
    return Status::Corruption(what + ": claims " + std::to_string(n) + " records of " + std::to_string(rec_bytes) +
                              " bytes, more than the file stores");
  recs->assign(n, Rec{});
  if (n > 0 && H5Dread(dset.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, recs->data()) < 0)
    return Status::Corruption(what + ": read failed (" + h5::LastError() + ")");
  return Status::OK();
}

bool CopyName(char* dst, size_t cap, const std::string& s) {
  if (s.size() + 1 > cap) return false;
  std::memset(dst, 0, cap);
  std::memcpy(dst, s.data(), s.size());
  return true;
}
std::string FromName(const char* src, size_t cap) { return std::string(src, strnlen(src, cap)); }

// The user block: a few lines of text, zero-padded to 512 bytes (so `head -4 index.h5` shows
// it), with the CRC-32C of bytes [512, size) and the size.
std::string IndexHeader(int version, uint32_t crc, uint64_t size) {
  char text[160];
  std::snprintf(text, sizeof(text), "%sformat %d\ncrc32c %08" PRIx32 "\nbytes %" PRIu64 "\n", kHeaderMagic, version,
                crc, size);
  std::string header(kIndexHeaderBytes, '\0');
  std::memcpy(&header[0], text, std::strlen(text));
  return header;
}

uint32_t ImageCrc(const std::string& bytes) {
  return Crc32c(0, bytes.data() + kIndexHeaderBytes, bytes.size() - kIndexHeaderBytes);
}

// The checksum, before HDF5 sees a byte.
Status CheckIndexHeader(const std::string& bytes, const std::string& path) {
  if (bytes.size() >= sizeof(kHdf5Signature) && std::memcmp(bytes.data(), kHdf5Signature, 8) == 0)
    return Status::Unimplemented(path + ": checkpoint index format version 1 (no checksum) is not read by this "
                                 "build (it reads version " + std::to_string(kCheckpointFormatVersion) +
                                 ", see docs/CHECKPOINT.md)");
  const size_t magic_len = std::strlen(kHeaderMagic);
  if (bytes.size() <= kIndexHeaderBytes || bytes.compare(0, magic_len, kHeaderMagic) != 0)
    return Status::Corruption(path + ": not a shardgpt checkpoint index (no '" +
                              std::string(kHeaderMagic, magic_len - 1) + "' header)");
  int version = 0;
  if (std::sscanf(bytes.c_str() + magic_len, "format %d", &version) != 1 || version != kCheckpointFormatVersion)
    return Status::Unimplemented(path + ": checkpoint index format version " + std::to_string(version) +
                                 ", this build reads " + std::to_string(kCheckpointFormatVersion));
  const uint32_t crc = ImageCrc(bytes);
  if (bytes.compare(0, kIndexHeaderBytes, IndexHeader(version, crc, bytes.size())) != 0) {
    char msg[160];
    std::snprintf(msg, sizeof(msg), "(CRC-32C %08" PRIx32 " of bytes [%zu, %zu)); the index is damaged", crc,
                  kIndexHeaderBytes, bytes.size());
    return Status::Corruption(path + ": checksum mismatch: its header does not match its content " + msg);
  }
  return Status::OK();
}

Status ReadAttrsAndTables(hid_t f, const std::string& path, uint64_t image_bytes, CheckpointIndex* idx) {
  std::string format;
  int64_t version = 0;
  if (!h5::ReadAttrStr(f, "format", &format) || format != kIndexFormat)
    return Status::Corruption(path + ": not a shardgpt checkpoint index (format attribute)");
  if (!h5::ReadAttrI64(f, "format_version", &version) || version != kCheckpointFormatVersion)
    return Status::Corruption(path + ": format_version attribute " + std::to_string(version) +
                              " disagrees with its header (" + std::to_string(kCheckpointFormatVersion) + ")");
  idx->format_version = static_cast<int>(version);
  int64_t world = 0, stage = 0;
  struct I64 {
    const char* name;
    int64_t* v;
  };
  for (const I64& a : {I64{"world_size", &world}, I64{"zero_stage", &stage}, I64{"step", &idx->state.step},
                       I64{"tokens", &idx->state.tokens}})
    if (!h5::ReadAttrI64(f, a.name, a.v))
      return Status::Corruption(path + ": attribute " + a.name + " missing or not an int64");
  if (!h5::ReadAttrU64(f, "checkpoint_id", &idx->checkpoint_id) ||
      !h5::ReadAttrU64(f, "loader_position", &idx->state.loader_position) ||
      !h5::ReadAttrU64(f, "seed", &idx->state.seed))
    return Status::Corruption(path + ": attribute checkpoint_id, loader_position or seed missing or not a uint64");
  if (!h5::ReadAttrStr(f, "dtype", &idx->dtype)) return Status::Corruption(path + ": attribute dtype missing");
  // Ranges are checked here, where the values are still 64-bit (ValidateCheckpointIndex sees ints).
  if (world < 1 || world > kMaxWorld)
    return Status::Corruption(path + ": world_size " + std::to_string(world) + " (expected 1 to 2^24 ranks)");
  if (stage < 0 || stage > 3)
    return Status::Corruption(path + ": zero_stage " + std::to_string(stage) + " (expected 0 to 3)");
  idx->world_size = static_cast<int>(world);
  idx->zero_stage = static_cast<int>(stage);

  if (H5Lexists(f, "config", H5P_DEFAULT) <= 0) return Status::Corruption(path + ": /config missing");
  {
    Id config(H5Gopen2(f, "config", H5P_DEFAULT), H5Gclose);
    if (!config.valid()) return Status::Corruption(path + ": /config is not a group");
    int64_t v[6];
    const char* names[6] = {"n_layer", "n_head", "n_embd", "max_seq_len", "vocab_size", "padded_vocab_size"};
    for (int i = 0; i < 6; i++) {
      if (!h5::ReadAttrI64(config.get(), names[i], &v[i]))
        return Status::Corruption(path + ": /config attribute " + names[i] + " missing or not an int64");
      if (v[i] < 1 || v[i] > 2147483647)
        return Status::Corruption(path + ": /config " + names[i] + " " + std::to_string(v[i]) +
                                  " (expected 1 to 2^31-1)");
    }
    idx->config = GPTConfig{static_cast<int>(v[0]), static_cast<int>(v[1]), static_cast<int>(v[2]),
                            static_cast<int>(v[3]), static_cast<int>(v[4])};
    SHARDGPT_RETURN_IF_ERROR(CheckFileConfig(idx->config, path + ": /config"));
    if (v[5] != idx->config.padded_vocab())
      return Status::Corruption(path + ": /config padded_vocab_size " + std::to_string(v[5]) + " (expected " +
                                std::to_string(idx->config.padded_vocab()) + " for vocab_size " +
                                std::to_string(v[4]) + ")");
  }

  std::vector<TensorRec> trecs;
  std::vector<UnitRec> urecs;
  std::vector<PieceRec> precs;
  std::vector<FileRec> frecs;
  if (H5Lexists(f, "layout", H5P_DEFAULT) <= 0 || H5Lexists(f, "plan", H5P_DEFAULT) <= 0)
    return Status::Corruption(path + ": /layout or /plan missing");
  {
    Id layout(H5Gopen2(f, "layout", H5P_DEFAULT), H5Gclose), plan(H5Gopen2(f, "plan", H5P_DEFAULT), H5Gclose);
    if (!layout.valid() || !plan.valid()) return Status::Corruption(path + ": /layout or /plan is not a group");
    SHARDGPT_RETURN_IF_ERROR(
        ReadRecords(layout.get(), "layout", "tensors", TensorType().get(), image_bytes, &trecs, path));
    SHARDGPT_RETURN_IF_ERROR(ReadRecords(layout.get(), "layout", "units", UnitType().get(), image_bytes, &urecs, path));
    SHARDGPT_RETURN_IF_ERROR(ReadRecords(plan.get(), "plan", "pieces", PieceType().get(), image_bytes, &precs, path));
    SHARDGPT_RETURN_IF_ERROR(ReadRecords(plan.get(), "plan", "files", FileType().get(), image_bytes, &frecs, path));
  }
  // Signed fields go to unsigned ones below: refuse negatives here, naming the record.
  auto negative = [&](const std::string& table, size_t i, const char* field, int64_t v) {
    return Status::Corruption(path + ": /" + table + "[" + std::to_string(i) + "] " + field + " " +
                              std::to_string(v) + " (expected >= 0)");
  };
  for (size_t i = 0; i < trecs.size(); i++) {
    const TensorRec& r = trecs[i];
    TensorInfo t;
    t.name = FromName(r.name, sizeof(r.name));
    if (r.ndim < 1 || r.ndim > 4)
      return Status::Corruption(path + ": /layout/tensors[" + std::to_string(i) + "] '" + t.name + "' ndim " +
                                std::to_string(r.ndim) + " (expected 1 to 4)");
    if (FromName(r.dtype, sizeof(r.dtype)) != "f32")
      return Status::Corruption(path + ": /layout/tensors[" + std::to_string(i) + "] '" + t.name + "' dtype '" +
                                FromName(r.dtype, sizeof(r.dtype)) + "' (expected f32)");
    if (r.offset < 0) return negative("layout/tensors", i, "offset", r.offset);
    if (r.numel < 0) return negative("layout/tensors", i, "numel", r.numel);
    t.unit = r.unit;
    t.shape.assign(r.shape, r.shape + r.ndim);
    t.offset = static_cast<size_t>(r.offset);
    t.numel = static_cast<size_t>(r.numel);
    idx->tensors.push_back(t);
  }
  for (size_t i = 0; i < urecs.size(); i++) {
    const UnitRec& r = urecs[i];
    if (r.offset < 0) return negative("layout/units", i, "offset", r.offset);
    if (r.numel < 0) return negative("layout/units", i, "numel", r.numel);
    UnitInfo u;
    u.name = FromName(r.name, sizeof(r.name));
    u.offset = static_cast<size_t>(r.offset);
    u.numel = static_cast<size_t>(r.numel);
    idx->units.push_back(u);
  }
  for (size_t i = 0; i < precs.size(); i++) {
    const PieceRec& r = precs[i];
    if (r.begin < 0) return negative("plan/pieces", i, "begin", r.begin);
    if (r.end < 0) return negative("plan/pieces", i, "end", r.end);
    if (r.file_offset < 0) return negative("plan/pieces", i, "file_offset", r.file_offset);
    idx->pieces.push_back(SavedPiece{r.unit, r.file, static_cast<uint64_t>(r.begin), static_cast<uint64_t>(r.end),
                                     static_cast<uint64_t>(r.file_offset)});
  }
  for (size_t i = 0; i < frecs.size(); i++) {
    const FileRec& r = frecs[i];
    if (r.elements < 0) return negative("plan/files", i, "elements", r.elements);
    if (r.bytes < 0) return negative("plan/files", i, "bytes", r.bytes);
    idx->files.push_back(CheckpointFile{FromName(r.name, sizeof(r.name)), static_cast<uint64_t>(r.elements),
                                        static_cast<uint64_t>(r.bytes), r.crc32c_master, r.crc32c_m, r.crc32c_v});
  }
  return Status::OK();
}

}  // namespace

uint64_t CheckpointIndex::total_bytes() const {
  uint64_t b = 0;
  for (const CheckpointFile& f : files) b += f.bytes;
  return b;
}

std::string ShardFileName(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank_%05d.h5", rank);
  return buf;
}

void SealCheckpointIndexImage(std::string* bytes) {
  if (bytes->size() <= kIndexHeaderBytes) return;
  bytes->replace(0, kIndexHeaderBytes, IndexHeader(kCheckpointFormatVersion, ImageCrc(*bytes), bytes->size()));
}

Status ValidateCheckpointIndex(const CheckpointIndex& idx, const std::string& where) {
  auto bad = [&](const std::string& what) { return Status::Corruption(where + ": " + what); };
  if (idx.format_version != kCheckpointFormatVersion)
    return bad("format_version " + std::to_string(idx.format_version) + " (expected " +
               std::to_string(kCheckpointFormatVersion) + ")");
  if (idx.checkpoint_id == 0) return bad("checkpoint_id 0 (expected the save's random nonzero id)");
  if (idx.world_size < 1 || idx.world_size > kMaxWorld)
    return bad("world_size " + std::to_string(idx.world_size) + " (expected 1 to 2^24 ranks)");
  if (idx.zero_stage < 0 || idx.zero_stage > 3)
    return bad("zero_stage " + std::to_string(idx.zero_stage) + " (expected 0 to 3)");
  if (idx.dtype != "f32" && idx.dtype != "bf16") return bad("dtype '" + idx.dtype + "' (expected f32 or bf16)");
  if (idx.state.step < 0 || idx.state.step > kMaxStep)
    return bad("step " + std::to_string(idx.state.step) + " (expected 0 to 2^31-1)");
  if (idx.state.tokens < 0) return bad("tokens " + std::to_string(idx.state.tokens) + " (expected >= 0)");

  // The config, then the tables it implies. The table sizes are checked before the layout
  // is built, so a config cannot make us build more than the file's tables hold.
  SHARDGPT_RETURN_IF_ERROR(CheckFileConfig(idx.config, where + ": /config"));
  const GPTConfig& c = idx.config;
  uint64_t params = 0;
  if (!FileParamCount(c, &params)) return bad("/config " + c.ToString() + " describes more than 2^50 parameters");
  const uint64_t want_tensors = 12 * static_cast<uint64_t>(c.n_layer) + 4;
  const uint64_t want_units = static_cast<uint64_t>(c.n_layer) + 2;
  if (idx.tensors.size() != want_tensors || idx.units.size() != want_units)
    return bad("/layout has " + std::to_string(idx.tensors.size()) + " tensors in " +
               std::to_string(idx.units.size()) + " units, /config n_layer " + std::to_string(c.n_layer) +
               " implies " + std::to_string(want_tensors) + " in " + std::to_string(want_units));
  const ParamLayout layout(c);
  for (size_t i = 0; i < layout.tensors().size(); i++) {
    const TensorInfo &a = idx.tensors[i], &e = layout.tensors()[i];
    std::string field;
    if (a.name != e.name) field = "name '" + a.name + "'";
    else if (a.unit != e.unit) field = "unit " + std::to_string(a.unit);
    else if (a.shape != e.shape) field = "shape";
    else if (a.offset != e.offset) field = "offset " + std::to_string(a.offset);
    else if (a.numel != e.numel) field = "numel " + std::to_string(a.numel);
    if (!field.empty())
      return bad("/layout/tensors[" + std::to_string(i) + "] " + field + " differs from the layout /config implies ('" +
                 e.name + "', unit " + std::to_string(e.unit) + ", offset " + std::to_string(e.offset) + ", numel " +
                 std::to_string(e.numel) + ")");
  }
  std::vector<uint64_t> unit_numel;
  for (size_t u = 0; u < layout.units().size(); u++) {
    const UnitInfo &a = idx.units[u], &e = layout.units()[u];
    if (a.name != e.name || a.offset != e.offset || a.numel != e.numel)
      return bad("/layout/units[" + std::to_string(u) + "] '" + a.name + "' offset " + std::to_string(a.offset) +
                 " numel " + std::to_string(a.numel) + " (expected '" + e.name + "' offset " +
                 std::to_string(e.offset) + " numel " + std::to_string(e.numel) + " from /config)");
    unit_numel.push_back(e.numel);
  }

  // The plan: every element of every unit exactly once, each file contiguous from 0.
  if (idx.files.size() != static_cast<size_t>(idx.world_size))
    return bad("/plan/files has " + std::to_string(idx.files.size()) + " records for world_size " +
               std::to_string(idx.world_size) + " (expected one per saving rank)");
  if (Status st = CheckPieces(idx.pieces, unit_numel, idx.world_size); !st.ok())
    return bad("/plan/pieces: " + st.message());
  const std::vector<uint64_t> elems = FileElements(idx.pieces, idx.world_size);
  for (int i = 0; i < idx.world_size; i++) {
    const CheckpointFile& f = idx.files[i];
    const std::string rec = "/plan/files[" + std::to_string(i) + "]";
    if (f.name != ShardFileName(i)) return bad(rec + " name '" + f.name + "' (expected " + ShardFileName(i) + ")");
    if (f.elements != elems[i])
      return bad(rec + " " + f.name + ": elements " + std::to_string(f.elements) + ", the plan stores " +
                 std::to_string(elems[i]));
    if (f.bytes / 12 < f.elements)
      return bad(rec + " " + f.name + ": bytes " + std::to_string(f.bytes) + ", too small for 3 datasets of " +
                 std::to_string(f.elements) + " floats");
  }
  return Status::OK();
}

StatusOr<CheckpointIndex> ParseCheckpointIndex(const std::string& bytes, const std::string& path,
                                               const std::string& dir) {
  h5::InitH5();
  SHARDGPT_RETURN_IF_ERROR(CheckIndexHeader(bytes, path));
  // HDF5 opens the bytes just checked (an in-memory image: the core driver, no backing file),
  // so what is parsed is exactly what was checksummed.
  Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (!fapl.valid() || H5Pset_fapl_core(fapl.get(), 1 << 16, /*backing_store=*/0) < 0 ||
      H5Pset_file_image(fapl.get(), const_cast<char*>(bytes.data()), bytes.size()) < 0)
    return Status::Internal(path + ": cannot set up an HDF5 file image (" + h5::LastError() + ")");
  // The name only labels the image: the core driver refuses one that exists on disk.
  Id file(H5Fopen("shardgpt index image (in memory)", H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  if (!file.valid()) return Status::Corruption(path + ": not a readable HDF5 file (" + h5::LastError() + ")");
  CheckpointIndex idx;
  idx.dir = dir;
  SHARDGPT_RETURN_IF_ERROR(ReadAttrsAndTables(file.get(), path, bytes.size(), &idx));
  SHARDGPT_RETURN_IF_ERROR(ValidateCheckpointIndex(idx, path));
  return idx;
}

StatusOr<CheckpointIndex> ReadCheckpointIndex(const std::string& checkpoint_dir) {
  const std::string path = checkpoint_dir + "/index.h5";
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> f(std::fopen(path.c_str(), "rb"));
  if (!f) {
    if (errno == ENOENT) return Status::InvalidArgument(checkpoint_dir + ": not a checkpoint (no index.h5)");
    return Status::IOError(path + ": cannot open: " + std::strerror(errno));
  }
  if (std::fseek(f.get(), 0, SEEK_END) != 0) return Status::IOError(path + ": cannot seek (not a regular file?)");
  const long size = std::ftell(f.get());
  if (size < 0 || static_cast<uint64_t>(size) > kMaxIndexBytes)
    return Status::Corruption(path + ": " + std::to_string(size) + " bytes (expected at most 256 MiB for an index)");
  std::string bytes(static_cast<size_t>(size), '\0');
  std::rewind(f.get());
  if (size > 0 && std::fread(&bytes[0], 1, bytes.size(), f.get()) != bytes.size())
    return Status::IOError(path + ": short read (file changed while reading?)");
  return ParseCheckpointIndex(bytes, path, checkpoint_dir);
}

namespace {

// The HDF5 content (attributes, /config, the four tables), written through HDF5's own
// driver into a file that reserves the user block.
Status WriteHdf5(const std::string& path, const CheckpointIndex& idx) {
  Id fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
  if (!fcpl.valid() || H5Pset_userblock(fcpl.get(), kIndexHeaderBytes) < 0)
    return Status::Internal(path + ": cannot set up the index user block: " + h5::LastError());
  Id file(H5Fcreate(path.c_str(), H5F_ACC_EXCL, fcpl.get(), H5P_DEFAULT), H5Fclose);
  if (!file.valid()) return Status::IOError(path + ": cannot create: " + h5::LastError());
  const hid_t f = file.get();
  bool ok = h5::WriteAttrStr(f, "format", kIndexFormat) &&
            h5::WriteAttrI64(f, "format_version", kCheckpointFormatVersion) &&
            h5::WriteAttrU64(f, "checkpoint_id", idx.checkpoint_id) &&
            h5::WriteAttrI64(f, "world_size", idx.world_size) && h5::WriteAttrI64(f, "zero_stage", idx.zero_stage) &&
            h5::WriteAttrStr(f, "dtype", idx.dtype) && h5::WriteAttrI64(f, "step", idx.state.step) &&
            h5::WriteAttrI64(f, "tokens", idx.state.tokens) &&
            h5::WriteAttrI64(f, "lr_schedule_position", idx.state.step) &&
            h5::WriteAttrI64(f, "adamw_t", idx.state.step) &&
            h5::WriteAttrU64(f, "loader_position", idx.state.loader_position) &&
            h5::WriteAttrU64(f, "seed", idx.state.seed) &&
            h5::WriteAttrStr(f, "rng", "derived: every random stream is a function of (seed, position)");
  Id config(H5Gcreate2(f, "config", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  const GPTConfig& c = idx.config;
  ok = ok && config.valid() && h5::WriteAttrI64(config.get(), "n_layer", c.n_layer) &&
       h5::WriteAttrI64(config.get(), "n_head", c.n_head) && h5::WriteAttrI64(config.get(), "n_embd", c.n_embd) &&
       h5::WriteAttrI64(config.get(), "max_seq_len", c.max_seq_len) &&
       h5::WriteAttrI64(config.get(), "vocab_size", c.vocab_size) &&
       h5::WriteAttrI64(config.get(), "padded_vocab_size", c.padded_vocab());
  std::vector<TensorRec> trecs;
  for (const TensorInfo& t : idx.tensors) {
    TensorRec r{};
    if (!CopyName(r.name, sizeof(r.name), t.name) || t.shape.size() > 4)
      return Status::Internal(path + ": tensor '" + t.name + "' does not fit the index record");
    r.unit = t.unit;
    r.ndim = static_cast<int32_t>(t.shape.size());
    for (size_t d = 0; d < t.shape.size(); d++) r.shape[d] = t.shape[d];
    r.offset = static_cast<int64_t>(t.offset);
    r.numel = static_cast<int64_t>(t.numel);
    CopyName(r.dtype, sizeof(r.dtype), "f32");
    trecs.push_back(r);
  }
  std::vector<UnitRec> urecs;
  for (const UnitInfo& u : idx.units) {
    UnitRec r{};
    CopyName(r.name, sizeof(r.name), u.name);
    r.offset = static_cast<int64_t>(u.offset);
    r.numel = static_cast<int64_t>(u.numel);
    urecs.push_back(r);
  }
  std::vector<PieceRec> precs;
  for (const SavedPiece& p : idx.pieces)
    precs.push_back(PieceRec{p.unit, p.file, static_cast<int64_t>(p.begin), static_cast<int64_t>(p.end),
                             static_cast<int64_t>(p.file_offset)});
  std::vector<FileRec> frecs;
  for (const CheckpointFile& cf : idx.files) {
    FileRec r{};
    CopyName(r.name, sizeof(r.name), cf.name);
    r.elements = static_cast<int64_t>(cf.elements);
    r.bytes = static_cast<int64_t>(cf.bytes);
    r.crc32c_master = cf.crc_master;
    r.crc32c_m = cf.crc_m;
    r.crc32c_v = cf.crc_v;
    frecs.push_back(r);
  }
  Id layout(H5Gcreate2(f, "layout", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  Id plan(H5Gcreate2(f, "plan", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  ok = ok && layout.valid() && plan.valid() && WriteRecords(layout.get(), "tensors", TensorType().get(), trecs) &&
       WriteRecords(layout.get(), "units", UnitType().get(), urecs) &&
       WriteRecords(plan.get(), "pieces", PieceType().get(), precs) &&
       WriteRecords(plan.get(), "files", FileType().get(), frecs);
  if (!ok) return Status::IOError(path + ": cannot write the index: " + h5::LastError());
  config.Close();
  layout.Close();
  plan.Close();
  if (!file.Close()) return Status::IOError(path + ": cannot close: " + h5::LastError());
  return Status::OK();
}

}  // namespace

Status WriteCheckpointIndex(const std::string& path, const CheckpointIndex& idx) {
  h5::InitH5();
  SHARDGPT_RETURN_IF_ERROR(WriteHdf5(path, idx));
  // Seal: read the file back, put the checksum of everything after the user block into it.
  std::FILE* f = std::fopen(path.c_str(), "r+b");
  if (f == nullptr) return Status::IOError(path + ": cannot reopen to seal: " + std::strerror(errno));
  std::string bytes;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) bytes.append(buf, n);
  SealCheckpointIndexImage(&bytes);
  bool ok = !std::ferror(f) && bytes.size() > kIndexHeaderBytes && std::fseek(f, 0, SEEK_SET) == 0 &&
            std::fwrite(bytes.data(), 1, kIndexHeaderBytes, f) == kIndexHeaderBytes && std::fflush(f) == 0 &&
            fsync(fileno(f)) == 0;
  const int err = errno;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) return Status::IOError(path + ": cannot write the index header: " + std::strerror(err));
  return Status::OK();
}

}  // namespace shardgpt
