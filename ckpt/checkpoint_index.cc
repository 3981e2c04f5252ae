#include "ckpt/checkpoint_index.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint_h5.h"
#include "io/file_checks.h"

namespace shardgpt {

using h5::Id;

namespace {

constexpr const char* kIndexFormat = "shardgpt-checkpoint";
constexpr const char* kHeaderMagic = "shardgpt checkpoint index\n";
constexpr char kHdf5Signature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
constexpr int64_t kMaxWorld = int64_t{1} << 24;
constexpr int64_t kMaxStep = 2147483647;  // the training loop counts steps in an int
constexpr const char* kKinds[3] = {"master", "m", "v"};

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
struct ChunkRec {
  int32_t tensor;
  int32_t file;
  int32_t ndim;
  int64_t offsets[4], sizes[4];
  int64_t file_offset;
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
Id ChunkType() {
  Id t(H5Tcreate(H5T_COMPOUND, sizeof(ChunkRec)), H5Tclose);
  const hsize_t four = 4;
  Id arr(H5Tarray_create2(H5T_NATIVE_INT64, 1, &four), H5Tclose);
  H5Tinsert(t.get(), "tensor", HOFFSET(ChunkRec, tensor), H5T_NATIVE_INT32);
  H5Tinsert(t.get(), "file", HOFFSET(ChunkRec, file), H5T_NATIVE_INT32);
  H5Tinsert(t.get(), "ndim", HOFFSET(ChunkRec, ndim), H5T_NATIVE_INT32);
  H5Tinsert(t.get(), "offsets", HOFFSET(ChunkRec, offsets), arr.get());
  H5Tinsert(t.get(), "sizes", HOFFSET(ChunkRec, sizes), arr.get());
  H5Tinsert(t.get(), "file_offset", HOFFSET(ChunkRec, file_offset), H5T_NATIVE_INT64);
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

bool CopyName(char* dst, size_t cap, const std::string& s) {
  if (s.size() + 1 > cap) return false;
  std::memset(dst, 0, cap);
  std::memcpy(dst, s.data(), s.size());
  return true;
}
std::string FromName(const char* src, size_t cap) { return std::string(src, strnlen(src, cap)); }

using json = nlohmann::json;

// The header: a few lines of text, zero-padded to kIndexHeaderBytes (so `head -5 index.h5`
// shows it): the format version, the CRC-32C of the file (ImageCrc), the size, and the
// length of the JSON that follows the header.
std::string IndexHeader(int version, uint32_t crc, uint64_t size, uint64_t json_bytes) {
  char text[kIndexHeaderBytes];
  std::snprintf(text, sizeof(text), "%sformat %d\ncrc32c %08" PRIx32 "\nbytes %" PRIu64 "\njson %" PRIu64 "\n",
                kHeaderMagic, version, crc, size, json_bytes);
  std::string header(kIndexHeaderBytes, '\0');
  std::memcpy(&header[0], text, std::strlen(text));
  return header;
}

// The CRC-32C of the whole file as it is with the header's own crc32c field written as
// 00000000: every byte but that field is covered, the header's other fields included.
uint32_t ImageCrc(int version, uint64_t json_bytes, const std::string& bytes) {
  const std::string header = IndexHeader(version, 0, bytes.size(), json_bytes);
  return Crc32c(Crc32c(0, header.data(), header.size()), bytes.data() + kIndexHeaderBytes,
                bytes.size() - kIndexHeaderBytes);
}

// The JSON length the header states (0 when it states none).
uint64_t HeaderJsonBytes(const std::string& bytes) {
  const std::string header = bytes.substr(0, std::min(bytes.size(), kIndexHeaderBytes));
  const size_t at = header.find("\njson ");
  if (at == std::string::npos) return 0;
  uint64_t n = 0;
  for (size_t i = at + 6; i < header.size() && header[i] >= '0' && header[i] <= '9' && n < (uint64_t{1} << 40); i++)
    n = n * 10 + static_cast<uint64_t>(header[i] - '0');
  return n;
}

// The checksum, before anything else is looked at.
Status CheckIndexHeader(const std::string& bytes, const std::string& path, uint64_t* json_bytes, int* header_version) {
  if (bytes.size() >= sizeof(kHdf5Signature) && std::memcmp(bytes.data(), kHdf5Signature, 8) == 0)
    return Status::Unimplemented(path + ": checkpoint index format version 1 (no checksum) is not read by this "
                                 "build (it reads version " + std::to_string(kCheckpointFormatVersion) +
                                 ", see docs/CHECKPOINT.md)");
  const size_t magic_len = std::strlen(kHeaderMagic);
  if (bytes.size() <= kIndexHeaderBytes || bytes.compare(0, magic_len, kHeaderMagic) != 0)
    return Status::Corruption(path + ": not a shardgpt checkpoint index (no '" +
                              std::string(kHeaderMagic, magic_len - 1) + "' header)");
  int version = 0;  // "format N\n" (digits read by hand: sscanf's %d has no defined overflow)
  if (bytes.compare(magic_len, 7, "format ") == 0)
    for (size_t i = magic_len + 7; i < kIndexHeaderBytes && bytes[i] >= '0' && bytes[i] <= '9' && version < 100000; i++)
      version = version * 10 + (bytes[i] - '0');
  if (version < kOldestReadFormatVersion || version > kCheckpointFormatVersion)
    return Status::Unimplemented(path + ": checkpoint index format version " + std::to_string(version) +
                                 ", this build reads versions " + std::to_string(kOldestReadFormatVersion) + " to " +
                                 std::to_string(kCheckpointFormatVersion) + " (see docs/CHECKPOINT.md)");
  *header_version = version;
  *json_bytes = std::min<uint64_t>(HeaderJsonBytes(bytes), bytes.size() - kIndexHeaderBytes);
  const uint32_t crc = ImageCrc(version, *json_bytes, bytes);
  if (bytes.compare(0, kIndexHeaderBytes, IndexHeader(version, crc, bytes.size(), *json_bytes)) != 0) {
    char msg[160];
    std::snprintf(msg, sizeof(msg), "(CRC-32C %08" PRIx32 " over its %zu bytes); the index is damaged", crc,
                  bytes.size());
    return Status::Corruption(path + ": checksum mismatch: its header does not match its content " + msg);
  }
  return Status::OK();
}

// ---- JSON fields with exact types: no float for an integer, no wrap-around ----

bool AsI64(const json& j, int64_t* v) {
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return false;
    *v = static_cast<int64_t>(u);
    return true;
  }
  if (!j.is_number_integer()) return false;
  *v = j.get<int64_t>();
  return true;
}
bool AsU64(const json& j, uint64_t* v) {
  if (!j.is_number_unsigned()) return false;
  *v = j.get<uint64_t>();
  return true;
}
bool AsInt(const json& j, int* v) {
  int64_t x = 0;
  if (!AsI64(j, &x) || x < INT32_MIN || x > INT32_MAX) return false;
  *v = static_cast<int>(x);
  return true;
}
bool AsString(const json& j, std::string* v, size_t max_len) {
  if (!j.is_string() || j.get_ref<const std::string&>().size() > max_len) return false;
  *v = j.get<std::string>();
  return true;
}
const json* Member(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

// Reads the index's fields; each failure names the field as /group/table[i] field.
class FieldReader {
 public:
  explicit FieldReader(const std::string& path) : path_(path) {}
  Status Bad(const std::string& field, const std::string& expected) const {
    return Status::Corruption(path_ + ": " + field + " missing or not " + expected);
  }
  Status Negative(const std::string& field, int64_t v) const {
    return Status::Corruption(path_ + ": " + field + " " + std::to_string(v) + " (expected >= 0)");
  }
  // An integer member that must be >= 0, as a size_t/uint64.
  template <typename U>
  Status Size(const json& j, const std::string& field, U* out) const {
    int64_t v = 0;
    if (!AsI64(j, &v)) return Bad(field, "an integer");
    if (v < 0) return Negative(field, v);
    *out = static_cast<U>(v);
    return Status::OK();
  }

 private:
  std::string path_;
};

// The optional /run object: what the saving run's data order depended on (TrainState's
// batch_samples, seq_len, shuffle, data_files). Absent in indexes written before it existed.
Status RunFromJson(const json& root, const FieldReader& r, TrainState* st) {
  const json* run = Member(root, "run");
  if (!run) return Status::OK();
  if (!run->is_object()) return r.Bad("/run", "an object");
  const json* m = nullptr;
  int64_t shuffle = 0;
  if (!(m = Member(*run, "batch_samples")) || !AsI64(*m, &st->batch_samples) || st->batch_samples < 1)
    return r.Bad("/run batch_samples", "an integer >= 1");
  if (!(m = Member(*run, "seq_len")) || !AsI64(*m, &st->seq_len) || st->seq_len < 1 || st->seq_len > INT32_MAX)
    return r.Bad("/run seq_len", "an integer in [1, 2^31-1]");
  if (!(m = Member(*run, "shuffle")) || !AsI64(*m, &shuffle) || (shuffle != 0 && shuffle != 1))
    return r.Bad("/run shuffle", "0 or 1");
  st->shuffle = static_cast<int>(shuffle);
  const json* files = Member(*run, "data_files");
  if (!files || !files->is_array() || files->size() > (size_t{1} << 20))
    return r.Bad("/run data_files", "an array of at most 2^20 [path, tokens]");
  for (const json& f : *files) {
    TrainState::DataFile d;
    if (!f.is_array() || f.size() != 2 || !AsString(f[0], &d.path, 4096) || !AsU64(f[1], &d.tokens))
      return r.Bad("/run data_files", "[path, tokens] pairs");
    st->data_files.push_back(std::move(d));
  }
  return Status::OK();
}

Status FromJson(const json& root, const std::string& path, CheckpointIndex* idx) {
  const FieldReader r(path);
  if (!root.is_object()) return Status::Corruption(path + ": the index's JSON content is not an object");
  std::string format;
  const json* m = Member(root, "format");
  if (!m || !AsString(*m, &format, 64) || format != kIndexFormat)
    return Status::Corruption(path + ": not a shardgpt checkpoint index (format field)");
  m = Member(root, "format_version");
  if (!m || !AsInt(*m, &idx->format_version)) return r.Bad("format_version", "an integer");
  int64_t world = 0, stage = 0;
  struct I64 {
    const char* name;
    int64_t* v;
  };
  for (const I64& f : {I64{"world_size", &world}, I64{"zero_stage", &stage}, I64{"step", &idx->state.step},
                       I64{"tokens", &idx->state.tokens}})
    if (!(m = Member(root, f.name)) || !AsI64(*m, f.v)) return r.Bad(f.name, "an integer");
  struct U64 {
    const char* name;
    uint64_t* v;
  };
  for (const U64& f : {U64{"checkpoint_id", &idx->checkpoint_id}, U64{"loader_position", &idx->state.loader_position},
                       U64{"seed", &idx->state.seed}})
    if (!(m = Member(root, f.name)) || !AsU64(*m, f.v)) return r.Bad(f.name, "an unsigned integer");
  if (!(m = Member(root, "dtype")) || !AsString(*m, &idx->dtype, 16)) return r.Bad("dtype", "a short string");
  if ((m = Member(root, "optimizer")) && !AsString(*m, &idx->optimizer, 16)) return r.Bad("optimizer", "a short string");
  // Ranges are checked here, where the values are still 64-bit (ValidateCheckpointIndex sees ints).
  if (world < 1 || world > kMaxWorld)
    return Status::Corruption(path + ": world_size " + std::to_string(world) + " (expected 1 to 2^24 ranks)");
  if (stage < 0 || stage > 3)
    return Status::Corruption(path + ": zero_stage " + std::to_string(stage) + " (expected 0 to 3)");
  idx->world_size = static_cast<int>(world);
  idx->zero_stage = static_cast<int>(stage);
  // HSDP fields (absent in indexes written before HSDP: one group of all ranks)
  int64_t ranks = world, group = world;
  if ((m = Member(root, "ranks")) && !AsI64(*m, &ranks)) return r.Bad("ranks", "an integer");
  if ((m = Member(root, "shard_group_size")) && !AsI64(*m, &group)) return r.Bad("shard_group_size", "an integer");
  if (group != world)
    return Status::Corruption(path + ": shard_group_size " + std::to_string(group) + " (expected world_size " +
                              std::to_string(world) + ": one file per rank of a group)");
  if (ranks < world || ranks > kMaxWorld * 64 || ranks % world != 0)
    return Status::Corruption(path + ": ranks " + std::to_string(ranks) + " (expected a multiple of world_size " +
                              std::to_string(world) + ")");
  idx->ranks = static_cast<int>(ranks);
  idx->shard_group_size = static_cast<int>(group);

  const json* config = Member(root, "config");
  int64_t v[6];
  const char* names[6] = {"n_layer", "n_head", "n_embd", "max_seq_len", "vocab_size", "padded_vocab_size"};
  for (int i = 0; i < 6; i++) {
    if (!config || !(m = Member(*config, names[i])) || !AsI64(*m, &v[i]))
      return r.Bad(std::string("/config ") + names[i], "an integer");
    if (v[i] < 1 || v[i] > INT32_MAX)
      return Status::Corruption(path + ": /config " + names[i] + " " + std::to_string(v[i]) + " (expected 1 to 2^31-1)");
  }
  idx->config = GPTConfig{static_cast<int>(v[0]), static_cast<int>(v[1]), static_cast<int>(v[2]),
                          static_cast<int>(v[3]), static_cast<int>(v[4])};
  // The architecture (absent: gpt2, as every index written before llama) and llama's fields.
  std::string arch = "gpt2";
  if ((m = Member(*config, "arch")) && !AsString(*m, &arch, 16)) return r.Bad("/config arch", "a short string");
  if (arch == "llama") {
    GPTConfig& c = idx->config;
    c.arch = Arch::kLlama;
    double theta = 0, eps = 0;
    int64_t tied = 0;
    if (!(m = Member(*config, "n_kv_head")) || !AsInt(*m, &c.n_kv_head)) return r.Bad("/config n_kv_head", "an integer");
    if (!(m = Member(*config, "ffn_hidden")) || !AsInt(*m, &c.ffn_hidden))
      return r.Bad("/config ffn_hidden", "an integer");
    if (!(m = Member(*config, "rope_theta")) || !m->is_number()) return r.Bad("/config rope_theta", "a number");
    theta = m->get<double>();
    if (!(m = Member(*config, "norm_eps")) || !m->is_number()) return r.Bad("/config norm_eps", "a number");
    eps = m->get<double>();
    if (!(m = Member(*config, "tie_embeddings")) || !AsI64(*m, &tied) || (tied != 0 && tied != 1))
      return r.Bad("/config tie_embeddings", "0 or 1");
    c.rope_theta = static_cast<float>(theta), c.norm_eps = static_cast<float>(eps), c.tie_embeddings = tied == 1;
  } else if (arch != "gpt2") {
    return Status::Corruption(path + ": /config arch " + Quoted(arch) + " (expected gpt2 or llama)");
  }
  SHARDGPT_RETURN_IF_ERROR(CheckFileConfig(idx->config, path + ": /config"));
  if (v[5] != idx->config.padded_vocab())
    return Status::Corruption(path + ": /config padded_vocab_size " + std::to_string(v[5]) + " (expected " +
                              std::to_string(idx->config.padded_vocab()) + " for vocab_size " + std::to_string(v[4]) +
                              ")");

  const json* layout = Member(root, "layout");
  const json* plan = Member(root, "plan");
  const json* tensors = layout ? Member(*layout, "tensors") : nullptr;
  const json* units = layout ? Member(*layout, "units") : nullptr;
  // format 2: /plan/pieces (unit coordinates); format 3: /plan/chunks (per parameter)
  const bool v2 = idx->format_version == 2;
  const json* pieces = plan ? Member(*plan, v2 ? "pieces" : "chunks") : nullptr;
  const json* files = plan ? Member(*plan, "files") : nullptr;
  if (!tensors || !tensors->is_array()) return r.Bad("/layout/tensors", "an array");
  if (!units || !units->is_array()) return r.Bad("/layout/units", "an array");
  if (!pieces || !pieces->is_array()) return r.Bad(v2 ? "/plan/pieces" : "/plan/chunks", "an array");
  if (!files || !files->is_array()) return r.Bad("/plan/files", "an array");
  if (!v2 && (!(m = Member(root, "shard_layout")) || !AsString(*m, &idx->shard_layout, 16)))
    return r.Bad("shard_layout", "a short string");

  for (size_t i = 0; i < tensors->size(); i++) {
    const json& t = (*tensors)[i];
    const std::string at = "/layout/tensors[" + std::to_string(i) + "]";
    TensorInfo info;
    if (!t.is_array() || t.size() != 5 || !AsString(t[0], &info.name, 256) || !AsInt(t[1], &info.unit) ||
        !t[2].is_array())
      return r.Bad(at, "[name, unit, shape, offset, numel]");
    if (t[2].size() < 1 || t[2].size() > 4)
      return Status::Corruption(path + ": " + at + " '" + info.name + "' ndim " + std::to_string(t[2].size()) +
                                " (expected 1 to 4)");
    for (const json& d : t[2]) {
      int64_t x = 0;
      if (!AsI64(d, &x)) return r.Bad(at + " shape", "integers");
      info.shape.push_back(x);
    }
    SHARDGPT_RETURN_IF_ERROR(r.Size(t[3], at + " offset", &info.offset));
    SHARDGPT_RETURN_IF_ERROR(r.Size(t[4], at + " numel", &info.numel));
    idx->tensors.push_back(std::move(info));
  }
  for (size_t i = 0; i < units->size(); i++) {
    const json& u = (*units)[i];
    const std::string at = "/layout/units[" + std::to_string(i) + "]";
    UnitInfo info;
    if (!u.is_array() || u.size() != 3 || !AsString(u[0], &info.name, 256)) return r.Bad(at, "[name, offset, numel]");
    SHARDGPT_RETURN_IF_ERROR(r.Size(u[1], at + " offset", &info.offset));
    SHARDGPT_RETURN_IF_ERROR(r.Size(u[2], at + " numel", &info.numel));
    idx->units.push_back(std::move(info));
  }
  for (size_t i = 0; i < pieces->size() && !v2; i++) {
    const json& c = (*pieces)[i];
    const std::string at = "/plan/chunks[" + std::to_string(i) + "]";
    SavedChunk chunk;
    if (!c.is_array() || c.size() != 5 || !AsInt(c[0], &chunk.tensor) || !AsInt(c[1], &chunk.file) ||
        !c[2].is_array() || !c[3].is_array() || c[2].size() > 4 || c[3].size() > 4)
      return r.Bad(at, "[tensor, file, [offsets], [sizes], file_offset] with at most 4 dimensions");
    for (int k = 2; k <= 3; k++)
      for (const json& x : c[k]) {
        uint64_t v = 0;
        SHARDGPT_RETURN_IF_ERROR(r.Size(x, at + (k == 2 ? " offsets" : " sizes"), &v));
        (k == 2 ? chunk.offsets : chunk.sizes).push_back(v);
      }
    SHARDGPT_RETURN_IF_ERROR(r.Size(c[4], at + " file_offset", &chunk.file_offset));
    idx->chunks.push_back(std::move(chunk));
  }
  for (size_t i = 0; i < pieces->size() && v2; i++) {
    const json& p = (*pieces)[i];
    const std::string at = "/plan/pieces[" + std::to_string(i) + "]";
    SavedPiece piece;
    if (!p.is_array() || p.size() != 5 || !AsInt(p[0], &piece.unit) || !AsInt(p[1], &piece.file))
      return r.Bad(at, "[unit, file, begin, end, file_offset]");
    SHARDGPT_RETURN_IF_ERROR(r.Size(p[2], at + " begin", &piece.begin));
    SHARDGPT_RETURN_IF_ERROR(r.Size(p[3], at + " end", &piece.end));
    SHARDGPT_RETURN_IF_ERROR(r.Size(p[4], at + " file_offset", &piece.file_offset));
    idx->pieces.push_back(piece);
  }
  for (size_t i = 0; i < files->size(); i++) {
    const json& f = (*files)[i];
    const std::string at = "/plan/files[" + std::to_string(i) + "]";
    CheckpointFile file;
    const json* name = Member(f, "name");
    const json* elements = Member(f, "elements");
    const json* bytes = Member(f, "bytes");
    const json* crc = Member(f, "crc32c");
    const json* chunks = Member(f, "chunks");
    const json* chunk_crcs = Member(f, "chunk_crc32c");
    if (!name || !AsString(*name, &file.name, 256) || !elements || !bytes || !crc || !crc->is_array() ||
        crc->size() != 3 || !chunks || !chunks->is_array() || chunks->size() != 3 || !chunk_crcs ||
        !chunk_crcs->is_array() || chunk_crcs->size() != 3)
      return r.Bad(at, "{name, elements, bytes, crc32c: [3], chunks: [3 arrays], chunk_crc32c: [3 arrays]}");
    SHARDGPT_RETURN_IF_ERROR(r.Size(*elements, at + " elements", &file.elements));
    SHARDGPT_RETURN_IF_ERROR(r.Size(*bytes, at + " bytes", &file.bytes));
    uint32_t* crcs[3] = {&file.crc_master, &file.crc_m, &file.crc_v};
    for (int k = 0; k < 3; k++) {
      uint64_t c = 0;
      if (!AsU64((*crc)[k], &c) || c > UINT32_MAX) return r.Bad(at + " crc32c", "32-bit unsigned integers");
      *crcs[k] = static_cast<uint32_t>(c);
      if (!(*chunks)[k].is_array()) return r.Bad(at + " chunks", "arrays of file offsets");
      for (const json& o : (*chunks)[k]) {
        uint64_t off = 0;
        if (!AsU64(o, &off)) return r.Bad(at + " chunks", "arrays of file offsets");
        file.chunk_offsets[k].push_back(off);
      }
      if (!(*chunk_crcs)[k].is_array()) return r.Bad(at + " chunk_crc32c", "arrays of 32-bit unsigned integers");
      for (const json& o : (*chunk_crcs)[k]) {
        uint64_t v = 0;
        if (!AsU64(o, &v) || v > UINT32_MAX) return r.Bad(at + " chunk_crc32c", "arrays of 32-bit unsigned integers");
        file.chunk_crcs[k].push_back(static_cast<uint32_t>(v));
      }
    }
    idx->files.push_back(std::move(file));
  }
  return RunFromJson(root, r, &idx->state);
}

json ToJson(const CheckpointIndex& idx) {
  const GPTConfig& c = idx.config;
  json tensors = json::array(), units = json::array(), pieces = json::array(), files = json::array();
  for (const TensorInfo& t : idx.tensors)
    tensors.push_back(json::array({t.name, t.unit, t.shape, static_cast<int64_t>(t.offset), static_cast<int64_t>(t.numel)}));
  for (const UnitInfo& u : idx.units)
    units.push_back(json::array({u.name, static_cast<int64_t>(u.offset), static_cast<int64_t>(u.numel)}));
  for (const SavedChunk& c : idx.chunks) {
    json off = json::array(), size = json::array();
    for (uint64_t x : c.offsets) off.push_back(static_cast<int64_t>(x));
    for (uint64_t x : c.sizes) size.push_back(static_cast<int64_t>(x));
    pieces.push_back(json::array({c.tensor, c.file, off, size, static_cast<int64_t>(c.file_offset)}));
  }
  for (const CheckpointFile& f : idx.files)
    files.push_back({{"name", f.name},
                     {"elements", static_cast<int64_t>(f.elements)},
                     {"bytes", static_cast<int64_t>(f.bytes)},
                     {"crc32c", json::array({f.crc_master, f.crc_m, f.crc_v})},
                     {"chunks", json::array({f.chunk_offsets[0], f.chunk_offsets[1], f.chunk_offsets[2]})},
                     {"chunk_crc32c", json::array({f.chunk_crcs[0], f.chunk_crcs[1], f.chunk_crcs[2]})}});
  json out = {{"format", kIndexFormat},
          {"format_version", kCheckpointFormatVersion},
          {"checkpoint_id", idx.checkpoint_id},
          {"world_size", idx.world_size},
          {"ranks", idx.ranks > 0 ? idx.ranks : idx.world_size},
          {"shard_group_size", idx.world_size},
          {"zero_stage", idx.zero_stage},
          {"dtype", idx.dtype},
          {"optimizer", idx.optimizer},
          {"shard_layout", idx.shard_layout},
          {"step", idx.state.step},
          {"tokens", idx.state.tokens},
          {"loader_position", idx.state.loader_position},
          {"seed", idx.state.seed},
          {"config",
           {{"n_layer", c.n_layer},
            {"n_head", c.n_head},
            {"n_embd", c.n_embd},
            {"max_seq_len", c.max_seq_len},
            {"vocab_size", c.vocab_size},
            {"padded_vocab_size", c.padded_vocab()}}},
          {"layout", {{"tensors", tensors}, {"units", units}}},
          {"plan", {{"chunks", pieces}, {"files", files}}}};
  if (c.llama())  // a gpt2 index stays as it was: no arch field means gpt2
    out["config"].update({{"arch", "llama"},
                          {"n_kv_head", c.kv_heads()},
                          {"ffn_hidden", c.ffn()},
                          {"rope_theta", static_cast<double>(c.rope_theta)},
                          {"norm_eps", static_cast<double>(c.norm_eps)},
                          {"tie_embeddings", c.tie_embeddings ? 1 : 0}});
  const TrainState& st = idx.state;
  if (st.batch_samples > 0) {  // recorded by training runs (app/train.cc); tests may leave it out
    json data = json::array();
    for (const TrainState::DataFile& d : st.data_files) data.push_back(json::array({d.path, d.tokens}));
    out["run"] = {{"batch_samples", st.batch_samples}, {"seq_len", st.seq_len}, {"shuffle", st.shuffle},
                  {"data_files", data}};
  }
  return out;
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
  const uint64_t json_bytes = std::min<uint64_t>(HeaderJsonBytes(*bytes), bytes->size() - kIndexHeaderBytes);
  // the version the header states, where this build reads it (so older images stay older)
  int version = kCheckpointFormatVersion;
  const size_t magic_len = std::strlen(kHeaderMagic);
  if (bytes->compare(0, magic_len, kHeaderMagic) == 0 && bytes->compare(magic_len, 7, "format ") == 0 &&
      (*bytes)[magic_len + 8] == '\n') {
    const int v = (*bytes)[magic_len + 7] - '0';
    if (v >= kOldestReadFormatVersion && v <= kCheckpointFormatVersion) version = v;
  }
  bytes->replace(0, kIndexHeaderBytes,
                 IndexHeader(version, ImageCrc(version, json_bytes, *bytes), bytes->size(), json_bytes));
}

Status ValidateCheckpointIndex(const CheckpointIndex& idx, const std::string& where) {
  auto bad = [&](const std::string& what) { return Status::Corruption(where + ": " + what); };
  if (idx.format_version < kOldestReadFormatVersion || idx.format_version > kCheckpointFormatVersion)
    return bad("format_version " + std::to_string(idx.format_version) + " (expected " +
               std::to_string(kOldestReadFormatVersion) + " to " + std::to_string(kCheckpointFormatVersion) + ")");
  if (idx.shard_layout != "flat" && idx.shard_layout != "per-param")
    return bad("shard_layout '" + idx.shard_layout + "' (expected flat or per-param)");
  if (idx.checkpoint_id == 0) return bad("checkpoint_id 0 (expected the save's random nonzero id)");
  if (idx.world_size < 1 || idx.world_size > kMaxWorld)
    return bad("world_size " + std::to_string(idx.world_size) + " (expected 1 to 2^24 ranks)");
  if (idx.zero_stage < 0 || idx.zero_stage > 3)
    return bad("zero_stage " + std::to_string(idx.zero_stage) + " (expected 0 to 3)");
  if (idx.ranks != 0 && (idx.ranks < idx.world_size || idx.ranks % idx.world_size != 0))
    return bad("ranks " + std::to_string(idx.ranks) + " (expected a multiple of world_size " +
               std::to_string(idx.world_size) + ")");
  if (idx.shard_group_size != 0 && idx.shard_group_size != idx.world_size)
    return bad("shard_group_size " + std::to_string(idx.shard_group_size) + " (expected world_size " +
               std::to_string(idx.world_size) + ")");
  if (idx.dtype != "f32" && idx.dtype != "bf16") return bad("dtype '" + idx.dtype + "' (expected f32 or bf16)");
  if (idx.optimizer != "adamw" && idx.optimizer != "muon")
    return bad("optimizer '" + idx.optimizer + "' (expected adamw or muon)");
  if (idx.state.step < 0 || idx.state.step > kMaxStep)
    return bad("step " + std::to_string(idx.state.step) + " (expected 0 to 2^31-1)");
  if (idx.state.tokens < 0) return bad("tokens " + std::to_string(idx.state.tokens) + " (expected >= 0)");

  // The config, then the tables it implies. The table sizes are checked before the layout
  // is built, so a config cannot make us build more than the file's tables hold.
  SHARDGPT_RETURN_IF_ERROR(CheckFileConfig(idx.config, where + ": /config"));
  const GPTConfig& c = idx.config;
  uint64_t params = 0;
  if (!FileParamCount(c, &params)) return bad("/config " + c.ToString() + " describes more than 2^50 parameters");
  const uint64_t want_tensors = c.llama() ? 9 * static_cast<uint64_t>(c.n_layer) + 2 + (c.tie_embeddings ? 0 : 1)
                                          : 12 * static_cast<uint64_t>(c.n_layer) + 4;
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
  // Format 3: every chunk a contiguous box of its tensor, as a piece of its unit.
  std::vector<SavedPiece> from_chunks;
  const bool v2 = idx.format_version == 2;
  for (size_t i = 0; i < idx.chunks.size() && !v2; i++) {
    SavedPiece p;
    if (Status st = PieceOfChunk(layout, idx.chunks[i], idx.world_size, &p); !st.ok())
      return bad("/plan/chunks[" + std::to_string(i) + "] " + st.message());
    from_chunks.push_back(p);
  }
  const std::vector<SavedPiece>& pieces = v2 ? idx.pieces : from_chunks;
  if (Status st = CheckPieces(pieces, unit_numel, idx.world_size); !st.ok())
    return bad((v2 ? "/plan/pieces: " : "/plan/chunks: ") + st.message());
  const std::vector<uint64_t> elems = FileElements(pieces, idx.world_size);
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
    // The chunk table: every chunk of every dataset, each (data and checksum) inside the file
    // after its header, no two overlapping. Readers read exactly these byte ranges.
    const uint64_t chunks = ShardChunks(f.elements), chunk_bytes = (ShardChunkElems(f.elements) + 1) * 4;
    std::vector<uint64_t> all;
    for (int k = 0; k < 3; k++) {
      if (f.chunk_offsets[k].size() != chunks || f.chunk_crcs[k].size() != chunks)
        return bad(rec + " " + f.name + ": " + std::to_string(f.chunk_offsets[k].size()) + " chunk offsets and " +
                   std::to_string(f.chunk_crcs[k].size()) + " chunk CRCs for /" + kKinds[k] + ", expected " +
                   std::to_string(chunks) + " for " + std::to_string(f.elements) + " elements");
      for (uint64_t o : f.chunk_offsets[k]) {
        if (o < kShardHeaderBytes || o > f.bytes || chunk_bytes > f.bytes - o)
          return bad(rec + " " + f.name + ": chunk of /" + kKinds[k] + " at byte " + std::to_string(o) +
                     " (expected " + std::to_string(chunk_bytes) + " bytes between the header and the end of the " +
                     std::to_string(f.bytes) + "-byte file)");
        all.push_back(o);
      }
    }
    std::sort(all.begin(), all.end());
    for (size_t c = 1; c < all.size(); c++)
      if (all[c] - all[c - 1] < chunk_bytes)
        return bad(rec + " " + f.name + ": chunks at bytes " + std::to_string(all[c - 1]) + " and " +
                   std::to_string(all[c]) + " overlap (" + std::to_string(chunk_bytes) + " bytes each)");
  }
  return Status::OK();
}

StatusOr<CheckpointIndex> ParseCheckpointIndex(const std::string& bytes, const std::string& path,
                                               const std::string& dir) {
  uint64_t json_bytes = 0;
  int header_version = 0;
  SHARDGPT_RETURN_IF_ERROR(CheckIndexHeader(bytes, path, &json_bytes, &header_version));
  // The JSON after the header; the HDF5 part of the file is for other tools and never parsed.
  const auto begin = bytes.begin() + kIndexHeaderBytes;
  const json root = json::parse(begin, begin + static_cast<std::ptrdiff_t>(json_bytes), nullptr,
                                /*allow_exceptions=*/false);
  if (root.is_discarded()) return Status::Corruption(path + ": the index's JSON content does not parse");
  CheckpointIndex idx;
  idx.dir = dir;
  SHARDGPT_RETURN_IF_ERROR(FromJson(root, path, &idx));
  if (idx.format_version != header_version)
    return Status::Corruption(path + ": format_version " + std::to_string(idx.format_version) +
                              " differs from the header's format " + std::to_string(header_version));
  SHARDGPT_RETURN_IF_ERROR(ValidateCheckpointIndex(idx, path));
  // Both forms of the plan, the same for every version: format 2's pieces become chunks, and
  // the pieces readers use are those of the chunks (one per chunk).
  const ParamLayout layout(idx.config);
  if (idx.format_version == 2) idx.chunks = ChunksFromPieces(layout, idx.pieces);
  idx.pieces.clear();
  for (const SavedChunk& c : idx.chunks) {
    SavedPiece p;
    SHARDGPT_RETURN_IF_ERROR(PieceOfChunk(layout, c, idx.world_size, &p));
    idx.pieces.push_back(p);
  }
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

// The HDF5 content (attributes, /config, the four tables) for h5py and h5dump, written into
// a file that reserves the user block. shardgpt itself never reads it.
Status WriteHdf5(const std::string& path, const CheckpointIndex& idx, uint64_t user_block) {
  Id fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
  if (!fcpl.valid() || H5Pset_userblock(fcpl.get(), user_block) < 0)
    return Status::Internal(path + ": cannot set up the index user block: " + h5::LastError());
  // the user block, the four tables and HDF5's metadata: what a full disk message names
  const uint64_t needed = user_block + idx.tensors.size() * sizeof(TensorRec) + idx.units.size() * sizeof(UnitRec) +
                          idx.chunks.size() * sizeof(ChunkRec) + idx.files.size() * sizeof(FileRec) + 32768;
  Id file(H5Fcreate(path.c_str(), H5F_ACC_EXCL, fcpl.get(), H5P_DEFAULT), H5Fclose);
  if (!file.valid()) return h5::WriteError(path, "cannot create", needed);
  const hid_t f = file.get();
  bool ok = h5::WriteAttrStr(f, "format", kIndexFormat) &&
            h5::WriteAttrI64(f, "format_version", kCheckpointFormatVersion) &&
            h5::WriteAttrU64(f, "checkpoint_id", idx.checkpoint_id) &&
            h5::WriteAttrI64(f, "world_size", idx.world_size) && h5::WriteAttrI64(f, "zero_stage", idx.zero_stage) &&
            h5::WriteAttrI64(f, "ranks", idx.ranks > 0 ? idx.ranks : idx.world_size) &&
            h5::WriteAttrI64(f, "shard_group_size", idx.world_size) &&
            h5::WriteAttrStr(f, "dtype", idx.dtype) && h5::WriteAttrStr(f, "optimizer", idx.optimizer) &&
            h5::WriteAttrStr(f, "shard_layout", idx.shard_layout) &&
            h5::WriteAttrI64(f, "step", idx.state.step) &&
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
       h5::WriteAttrI64(config.get(), "padded_vocab_size", c.padded_vocab()) && h5::WriteLlamaConfig(config.get(), c);
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
  std::vector<ChunkRec> precs;
  for (const SavedChunk& c : idx.chunks) {
    ChunkRec r{};
    if (c.offsets.size() > 4 || c.sizes.size() > 4)
      return Status::Internal(path + ": a chunk of more than 4 dimensions does not fit the index record");
    r.tensor = c.tensor;
    r.file = c.file;
    r.ndim = static_cast<int32_t>(c.offsets.size());
    for (size_t d = 0; d < c.offsets.size(); d++) r.offsets[d] = static_cast<int64_t>(c.offsets[d]);
    for (size_t d = 0; d < c.sizes.size(); d++) r.sizes[d] = static_cast<int64_t>(c.sizes[d]);
    r.file_offset = static_cast<int64_t>(c.file_offset);
    precs.push_back(r);
  }
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
       WriteRecords(plan.get(), "chunks", ChunkType().get(), precs) &&
       WriteRecords(plan.get(), "files", FileType().get(), frecs);
  if (!ok) return h5::WriteError(path, "cannot write the index", needed);
  config.Close();
  layout.Close();
  plan.Close();
  if (!file.Close()) return h5::WriteError(path, "cannot close", needed);
  return Status::OK();
}

}  // namespace

Status WriteCheckpointIndex(const std::string& path, const CheckpointIndex& idx) {
  h5::InitH5();
  const std::string text = ToJson(idx).dump();
  uint64_t user_block = 512;  // HDF5 wants a power of two >= 512
  while (user_block < kIndexHeaderBytes + text.size()) user_block *= 2;
  Status written = WriteHdf5(path, idx, user_block);
  if (!written.ok()) {
    std::remove(path.c_str());  // no partial index: its presence would mark the checkpoint complete
    return written;
  }
  // Seal: header and JSON into the user block, the checksum over every byte after the header.
  std::FILE* f = std::fopen(path.c_str(), "r+b");
  if (f == nullptr) return Status::IOError(path + ": cannot reopen to seal: " + std::strerror(errno));
  std::string bytes;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) bytes.append(buf, n);
  bool ok = !std::ferror(f) && bytes.size() > user_block;
  if (ok) {
    bytes.replace(0, user_block, std::string(user_block, '\0'));
    bytes.replace(kIndexHeaderBytes, text.size(), text);
    bytes.replace(0, kIndexHeaderBytes,
                  IndexHeader(kCheckpointFormatVersion, ImageCrc(kCheckpointFormatVersion, text.size(), bytes),
                              bytes.size(), text.size()));
    ok = std::fseek(f, 0, SEEK_SET) == 0 && std::fwrite(bytes.data(), 1, user_block, f) == user_block &&
         std::fflush(f) == 0 && fsync(fileno(f)) == 0;
  }
  const int err = errno;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::remove(path.c_str());
    return Status::IOError(path + ": cannot write the index header: " + std::strerror(err));
  }
  return Status::OK();
}

}  // namespace shardgpt
