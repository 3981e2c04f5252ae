#include "ckpt/checkpoint_plan.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

#include "parallel/shard_plan.h"

namespace shardgpt {

std::vector<SavedPiece> PlanSave(const ParamLayout& layout, int world, ShardLayout shard_layout) {
  const ShardPlan plan(layout, world, shard_layout);
  std::vector<SavedPiece> pieces;
  for (int r = 0; r < world; r++) {
    uint64_t off = 0;
    for (int u = 0; u < plan.num_units(); u++)
      for (const OwnedPiece& p : plan.OwnedPieces(u, r)) {
        pieces.push_back(SavedPiece{u, r, p.begin, p.end, off});
        off += p.end - p.begin;
      }
  }
  return pieces;
}

std::vector<SavedChunk> ChunksFromPieces(const ParamLayout& layout, const std::vector<SavedPiece>& pieces) {
  std::vector<SavedChunk> chunks;
  for (const SavedPiece& p : pieces) {
    const UnitInfo& u = layout.units()[p.unit];
    for (int ti = u.first_tensor; ti < u.first_tensor + u.num_tensors; ti++) {
      const TensorInfo& t = layout.tensors()[ti];
      const uint64_t lo = std::max<uint64_t>(p.begin, t.offset), hi = std::min<uint64_t>(p.end, t.offset + t.numel);
      if (lo >= hi) continue;
      uint64_t at = p.file_offset + (lo - p.begin);
      auto add = [&](std::vector<uint64_t> off, std::vector<uint64_t> size) {
        uint64_t n = 1;
        for (uint64_t x : size) n *= x;
        chunks.push_back(SavedChunk{ti, p.file, std::move(off), std::move(size), at});
        at += n;
      };
      const uint64_t a = lo - t.offset, b = hi - t.offset;
      if (t.shape.size() == 1) {
        add({a}, {b - a});
        continue;
      }
      // 2-D [rows, cols]: elements [a, b) as a partial row, whole rows, a partial row
      const uint64_t cols = t.numel / static_cast<uint64_t>(t.shape[0]);
      uint64_t r0 = a / cols, c0 = a % cols;
      const uint64_t r1 = b / cols, c1 = b % cols;
      if (r0 == r1) {
        add({r0, c0}, {1, c1 - c0});
        continue;
      }
      if (c0 > 0) add({r0, c0}, {1, cols - c0}), r0++;
      if (r1 > r0) add({r0, 0}, {r1 - r0, cols});
      if (c1 > 0) add({r1, 0}, {1, c1});
    }
  }
  return chunks;
}

Status PieceOfChunk(const ParamLayout& layout, const SavedChunk& c, int num_files, SavedPiece* piece) {
  const int num_tensors = static_cast<int>(layout.tensors().size());
  if (c.tensor < 0 || c.tensor >= num_tensors)
    return Status::Corruption("tensor " + std::to_string(c.tensor) + " (expected 0 to " +
                              std::to_string(num_tensors - 1) + ")");
  const TensorInfo& t = layout.tensors()[c.tensor];
  if (c.file < 0 || c.file >= num_files)
    return Status::Corruption("'" + t.name + "': file " + std::to_string(c.file) + " (expected 0 to " +
                              std::to_string(num_files - 1) + ")");
  const size_t nd = t.shape.size();
  if (c.offsets.size() != nd || c.sizes.size() != nd)
    return Status::Corruption("'" + t.name + "': " + std::to_string(c.offsets.size()) + " offsets and " +
                              std::to_string(c.sizes.size()) + " sizes for a " + std::to_string(nd) + "-D tensor");
  uint64_t linear = 0, count = 1;
  bool partial_seen = false;  // a dimension before this one had a size other than 1
  for (size_t d = 0; d < nd; d++) {
    const uint64_t dim = static_cast<uint64_t>(t.shape[d]), o = c.offsets[d], n = c.sizes[d];
    if (n == 0 || o > dim || n > dim - o)
      return Status::Corruption("'" + t.name + "': dimension " + std::to_string(d) + " offset " + std::to_string(o) +
                                " size " + std::to_string(n) + " (expected a nonempty range inside 0.." +
                                std::to_string(dim) + ")");
    if (partial_seen && (o != 0 || n != dim))
      return Status::Corruption("'" + t.name + "': the chunk is not contiguous (dimension " + std::to_string(d) +
                                " is partial after a dimension of size > 1)");
    if (n != 1) partial_seen = true;
    linear = linear * dim + o;
    count *= n;
  }
  *piece = SavedPiece{t.unit, c.file, t.offset + linear, t.offset + linear + count, c.file_offset};
  return Status::OK();
}

std::vector<uint64_t> FileElements(const std::vector<SavedPiece>& pieces, int num_files) {
  std::vector<uint64_t> n(num_files, 0);
  for (const SavedPiece& p : pieces)
    if (p.file >= 0 && p.file < num_files) n[p.file] = std::max(n[p.file], p.file_offset + (p.end - p.begin));
  return n;
}

Status CheckPieces(const std::vector<SavedPiece>& pieces, const std::vector<uint64_t>& unit_numel, int num_files) {
  const int num_units = static_cast<int>(unit_numel.size());
  std::vector<std::vector<const SavedPiece*>> by_unit(num_units), by_file(std::max(num_files, 0));
  for (const SavedPiece& p : pieces) {
    if (p.unit < 0 || p.unit >= num_units)
      return Status::Corruption("piece of unit " + std::to_string(p.unit) + ": no such unit (" +
                                std::to_string(num_units) + " units)");
    if (p.file < 0 || p.file >= num_files)
      return Status::Corruption("piece of unit " + std::to_string(p.unit) + " in file " + std::to_string(p.file) +
                                ": no such file (" + std::to_string(num_files) + " files)");
    if (p.begin >= p.end || p.end > unit_numel[p.unit])
      return Status::Corruption("unit " + std::to_string(p.unit) + ": bad piece [" + std::to_string(p.begin) + ", " +
                                std::to_string(p.end) + ") of " + std::to_string(unit_numel[p.unit]) + " elements");
    by_unit[p.unit].push_back(&p);
    by_file[p.file].push_back(&p);
  }
  auto range = [](const SavedPiece* p) {
    return "[" + std::to_string(p->begin) + ", " + std::to_string(p->end) + ")";
  };
  for (int u = 0; u < num_units; u++) {
    auto& v = by_unit[u];
    std::sort(v.begin(), v.end(), [](const SavedPiece* a, const SavedPiece* b) { return a->begin < b->begin; });
    uint64_t at = 0;
    for (const SavedPiece* p : v) {
      if (p->begin < at) return Status::Corruption("unit " + std::to_string(u) + ": elements " + range(p) + " stored twice");
      if (p->begin > at)
        return Status::Corruption("unit " + std::to_string(u) + ": elements [" + std::to_string(at) + ", " +
                                  std::to_string(p->begin) + ") missing");
      at = p->end;
    }
    if (at != unit_numel[u])
      return Status::Corruption("unit " + std::to_string(u) + ": elements [" + std::to_string(at) + ", " +
                                std::to_string(unit_numel[u]) + ") missing");
  }
  for (int f = 0; f < num_files; f++) {
    auto& v = by_file[f];
    std::sort(v.begin(), v.end(),
              [](const SavedPiece* a, const SavedPiece* b) { return a->file_offset < b->file_offset; });
    uint64_t at = 0;
    for (const SavedPiece* p : v) {
      if (p->file_offset != at)
        return Status::Corruption("file " + std::to_string(f) + ": piece of unit " + std::to_string(p->unit) +
                                  " at offset " + std::to_string(p->file_offset) + ", expected " + std::to_string(at));
      at += p->end - p->begin;
    }
  }
  return Status::OK();
}

std::vector<ReadOp> PlanReads(const std::vector<SavedPiece>& pieces, int unit, uint64_t begin, uint64_t end) {
  std::vector<ReadOp> ops;
  for (const SavedPiece& p : pieces) {
    if (p.unit != unit) continue;
    const uint64_t b = std::max(begin, p.begin), e = std::min(end, p.end);
    if (b >= e) continue;
    ops.push_back(ReadOp{p.file, p.file_offset + (b - p.begin), e - b, b - begin});
  }
  std::sort(ops.begin(), ops.end(), [](const ReadOp& a, const ReadOp& b) {
    return a.file != b.file ? a.file < b.file : a.file_offset < b.file_offset;
  });
  // Merge reads that are adjacent both in the file and in the destination (one hyperslab).
  std::vector<ReadOp> merged;
  for (const ReadOp& op : ops) {
    if (!merged.empty()) {
      ReadOp& last = merged.back();
      if (last.file == op.file && last.file_offset + last.count == op.file_offset &&
          last.dest_offset + last.count == op.dest_offset) {
        last.count += op.count;
        continue;
      }
    }
    merged.push_back(op);
  }
  return merged;
}

namespace {

struct Crc32cTable {
  uint32_t t[256];
  Crc32cTable() {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
  }
};

}  // namespace

uint32_t Crc32c(uint32_t crc, const void* data, size_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
#if defined(__SSE4_2__)
  uint64_t c64 = c;
  while (bytes >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = _mm_crc32_u64(c64, w);
    p += 8;
    bytes -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (bytes--) c = _mm_crc32_u8(c, *p++);
#else
  static const Crc32cTable table;
  while (bytes--) c = table.t[(c ^ *p++) & 0xFF] ^ (c >> 8);
#endif
  return ~c;
}

namespace {
// Over GF(2): the product of a 32x32 bit matrix (one column per bit) and a vector.
uint32_t Gf2Times(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (; vec; vec >>= 1, mat++)
    if (vec & 1) sum ^= *mat;
  return sum;
}
void Gf2Square(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; n++) square[n] = Gf2Times(mat, mat[n]);
}
}  // namespace

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t bytes_b) {
  // Appending len zero bytes to a CRC register is a linear map; build it for 1, 2, 4, ...
  // zero bytes by squaring the one-zero-bit operator, apply it to crc_a, add crc_b (zlib).
  if (bytes_b == 0) return crc_a;
  uint32_t even[32], odd[32];
  odd[0] = 0x82F63B78u;  // reflected Castagnoli polynomial: the operator for one zero bit
  for (int n = 1; n < 32; n++) odd[n] = uint32_t{1} << (n - 1);
  Gf2Square(even, odd);  // two zero bits
  Gf2Square(odd, even);  // four zero bits
  do {
    Gf2Square(even, odd);  // first pass: one zero byte
    if (bytes_b & 1) crc_a = Gf2Times(even, crc_a);
    bytes_b >>= 1;
    if (bytes_b == 0) break;
    Gf2Square(odd, even);
    if (bytes_b & 1) crc_a = Gf2Times(odd, crc_a);
    bytes_b >>= 1;
  } while (bytes_b != 0);
  return crc_a ^ crc_b;
}

uint32_t Fletcher32(const void* data, size_t bytes) {
  const uint8_t* d = static_cast<const uint8_t*>(data);
  size_t len = bytes / 2;
  uint32_t sum1 = 0, sum2 = 0;
  while (len) {
    const uint32_t tlen = static_cast<uint32_t>(len > 360 ? 360 : len);
    len -= tlen;
    // HDF5 adds words one by one: sum1 += w_i; sum2 += sum1. Over the block that is
    // sum2 += tlen * sum1_before + sum_i (tlen - i) w_i; 360 words keep it below 2^32.
    uint32_t s = 0, t = 0;
    for (uint32_t i = 0; i < tlen; i++) {
      const uint32_t w = (static_cast<uint32_t>(d[2 * i]) << 8) | d[2 * i + 1];
      s += w;
      t += (tlen - i) * w;
    }
    d += 2 * tlen;
    sum2 += tlen * sum1 + t;
    sum1 += s;
    sum1 = (sum1 & 0xffff) + (sum1 >> 16);
    sum2 = (sum2 & 0xffff) + (sum2 >> 16);
  }
  if (bytes % 2) {
    sum1 += static_cast<uint32_t>(*d) << 8;
    sum2 += sum1;
    sum1 = (sum1 & 0xffff) + (sum1 >> 16);
    sum2 = (sum2 & 0xffff) + (sum2 >> 16);
  }
  sum1 = (sum1 & 0xffff) + (sum1 >> 16);
  sum2 = (sum2 & 0xffff) + (sum2 >> 16);
  return (sum2 << 16) | sum1;
}

std::string StepDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

int64_t ParseStepDirName(const std::string& name) {
  if (name.size() < 6 || name.compare(0, 5, "step_") != 0) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); i++) {
    if (name[i] < '0' || name[i] > '9' || v > (int64_t{1} << 56)) return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

}  // namespace shardgpt
