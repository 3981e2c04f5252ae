// Structure-aware mutation for the fuzz targets whose input is a JSON file (config.json,
// tokenizer.json): a value anywhere in the document replaced by a value of another JSON type,
// the mistake a byte mutator almost never makes whole ("tie_word_embeddings": "yes", an id
// that is null, a merge that is an object). Used two ways:
//  - JsonTypeVariants: every such replacement of a document, written as seeds by
//    fuzz_make_seeds, so the replay tests (any compiler) run each type error once;
//  - SHARDGPT_FUZZ_JSON_MUTATOR(): the target's LLVMFuzzerCustomMutator under libFuzzer, half
//    of the mutations one random type replacement of a parsable input, the rest libFuzzer's
//    own byte mutations (an unparsable input always gets those).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardgpt {
namespace fuzz {

// The values a field is replaced by: one of each JSON type, and integers at the edges.
inline std::vector<nlohmann::json> JsonReplacements(const nlohmann::json& original) {
  return {nullptr, true, false, 0, -1, 1.5, 18446744073709551615ull, INT64_MIN, "x", "", nlohmann::json::array(),
          nlohmann::json::object(), nlohmann::json::array({original})};
}

// Pointers to the values of doc, depth first (the root excluded), at most `per_container`
// children of each array or object and `limit` in all.
inline void JsonPointers(const nlohmann::json& v, const nlohmann::json::json_pointer& at, size_t per_container,
                         size_t limit, std::vector<nlohmann::json::json_pointer>* out) {
  size_t k = 0;
  for (auto it = v.begin(); v.is_structured() && it != v.end() && k < per_container && out->size() < limit; ++it, ++k) {
    const nlohmann::json::json_pointer child = v.is_object() ? at / it.key() : at / k;
    out->push_back(child);
    JsonPointers(*it, child, per_container, limit, out);
  }
}

// doc with one value replaced by one of another type, for every value JsonPointers lists and
// every replacement whose type differs from the value's.
inline std::vector<std::string> JsonTypeVariants(const nlohmann::json& doc, size_t per_container, size_t limit) {
  std::vector<nlohmann::json::json_pointer> ptrs;
  JsonPointers(doc, nlohmann::json::json_pointer(), per_container, limit, &ptrs);
  std::vector<std::string> out;
  for (const auto& p : ptrs) {
    const nlohmann::json& v = doc.at(p);
    for (const nlohmann::json& r : JsonReplacements(v)) {
      if (r.type() == v.type() && r == v) continue;
      if (r.type() == v.type() && !v.is_number()) continue;  // numbers: the edge values are kept
      nlohmann::json d = doc;
      d[p] = r;
      out.push_back(d.dump());
    }
  }
  return out;
}

// One random type replacement of the JSON in data (written back, at most max_size bytes);
// 0 when it does not parse or the result does not fit.
inline size_t MutateJsonTypes(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  const nlohmann::json doc = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_structured()) return 0;
  std::vector<nlohmann::json::json_pointer> ptrs;
  JsonPointers(doc, nlohmann::json::json_pointer(), SIZE_MAX, 100000, &ptrs);
  if (ptrs.empty()) return 0;
  std::mt19937 rng(seed);
  nlohmann::json d = doc;
  const auto& p = ptrs[rng() % ptrs.size()];
  const std::vector<nlohmann::json> rs = JsonReplacements(d.at(p));
  d[p] = rs[rng() % rs.size()];
  const std::string text = d.dump();
  if (text.size() > max_size) return 0;
  std::memcpy(data, text.data(), text.size());
  return text.size();
}

}  // namespace fuzz
}  // namespace shardgpt

#ifdef SHARDGPT_LIBFUZZER
#define SHARDGPT_FUZZ_JSON_MUTATOR()                                                                       \
  extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);                        \
  extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) { \
    if (seed % 2 == 0)                                                                                    \
      if (const size_t n = shardgpt::fuzz::MutateJsonTypes(data, size, max_size, seed / 2)) return n;     \
    return LLVMFuzzerMutate(data, size, max_size);                                                        \
  }
#else
#define SHARDGPT_FUZZ_JSON_MUTATOR()  // the replay driver does not mutate
#endif
