#include "io/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/json_fields.h"

namespace shardgpt {

namespace {

// GPT-2's pre-tokenization regex (tokenizers' ByteLevel, run by Oniguruma there). \s and \S
// are spelled out as Unicode's White_Space set, which is what Oniguruma's \s is; PCRE2 10.42's
// \s under UCP leaves out U+0085.
#define WS "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
const char kPattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS "])|[" WS "]+";
const char kWhiteSpace[] = WS;  // the members of a character class
#undef WS

// Llama 3's Split pattern (Oniguruma syntax, as in its tokenizer.json). Like GPT-2's, none of
// its pre-tokens crosses a '\n' between ASCII non-space bytes (SafeCut's rule).
const char kLlama3Pattern[] =
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

bool IsAlnum(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// An Oniguruma pattern (tokenizers' regex engine, Ruby syntax) as a PCRE2 pattern with the same
// matches under PCRE2_UTF | PCRE2_UCP: \s and \S as Unicode's White_Space set, \d as \p{Nd},
// \uHHHH as \x{HHHH}, '.' as [^\n], {,n} as {0,n}; the rest of the syntax both share is copied.
// Constructs whose meanings differ or that are not listed here (\w, \b, \h, \v, anchors,
// backreferences, options other than i, nested classes, class intersection) give false and
// *why naming the construct.
bool OnigToPcre2(const std::string& in, std::string* out, std::string* why) {
  const std::string ws = kWhiteSpace;
  out->clear();
  bool in_class = false;
  size_t class_start = 0;  // the offset just after "[" or "[^": a ']' there is a literal
  const size_t n = in.size();
  for (size_t i = 0; i < n; i++) {
    const char c = in[i];
    if (c == '\\') {
      if (i + 1 >= n) return *why = "a trailing backslash", false;
      const char e = in[++i];
      if (e == 's') {
        *out += in_class ? ws : "[" + ws + "]";
      } else if (e == 'S') {
        if (in_class) return *why = "\\S inside a character class", false;
        *out += "[^" + ws + "]";
      } else if (e == 'd' || e == 'D') {
        *out += e == 'd' ? "\\p{Nd}" : "\\P{Nd}";
      } else if (e == 'p' || e == 'P') {
        const size_t close = in.find('}', i);
        if (i + 1 >= n || in[i + 1] != '{' || close == std::string::npos)
          return *why = std::string("\\") + e + " without {name}", false;
        std::string name = in.substr(i + 2, close - i - 2);
        const bool negated = !name.empty() && name[0] == '^';
        if (negated) name.erase(0, 1);
        if (name.empty() || !std::all_of(name.begin(), name.end(), [](char x) { return IsAlnum(x) || x == '_'; }))
          return *why = "the property \\" + std::string(1, e) + "{" + in.substr(i + 2, close - i - 2) + "}", false;
        *out += ((e == 'P') != negated ? "\\P{" : "\\p{") + name + "}";
        i = close;
      } else if (e == 'u') {
        if (i + 4 >= n || !std::all_of(in.begin() + i + 1, in.begin() + i + 5, IsHex))
          return *why = "\\u without 4 hex digits", false;
        *out += "\\x{" + in.substr(i + 1, 4) + "}";
        i += 4;
      } else if (e == 'x' || e == 't' || e == 'n' || e == 'r' || e == 'f' || e == 'e' || e == 'a' || !IsAlnum(e)) {
        out->push_back('\\');
        out->push_back(e);  // \xHH and \x{H..} read alike; escaped punctuation is itself
      } else {
        return *why = std::string("the escape \\") + e, false;
      }
      continue;
    }
    if (in_class) {
      if (c == '[') return *why = "a nested character class or POSIX bracket", false;
      if (c == '&' && i + 1 < n && in[i + 1] == '&') return *why = "a class intersection &&", false;
      if (c == ']' && i != class_start) in_class = false;
      out->push_back(c);
      continue;
    }
    if (c == '[') {
      in_class = true;
      out->push_back('[');
      if (i + 1 < n && in[i + 1] == '^') out->push_back('^'), i++;
      class_start = i + 1;
    } else if (c == '.') {
      *out += "[^\\n]";
    } else if (c == '^' || c == '$') {
      return *why = std::string("the anchor ") + c, false;
    } else if (c == '(' && i + 1 < n && in[i + 1] == '?') {
      const std::string rest = in.substr(i + 2, 4);
      static const char* const kGroups[] = {":", "=", "!", ">", "<=", "<!", "i:", "i)", "-i:", "-i)"};
      const bool known = std::any_of(std::begin(kGroups), std::end(kGroups), [&](const char* g) { return rest.rfind(g, 0) == 0; }) ||
                         (rest.size() >= 2 && rest[0] == '<' && IsAlnum(rest[1]));  // (?<name>
      if (!known) return *why = "the group (?" + rest.substr(0, 2), false;
      out->push_back(c);
    } else if (c == '{' && i + 1 < n && in[i + 1] == ',') {
      *out += "{0";
    } else {
      out->push_back(c);
    }
  }
  if (in_class) return *why = "an unclosed character class", false;
  return true;
}

// One split of the pre-tokenizer, before compiling: a PCRE2 pattern (or a literal string).
struct StageSpec {
  std::string pattern;
  bool literal = false;
  bool cut_safe = false;  // SafeCut's rule holds for the pattern
  std::string where;      // its JSON path, for errors
};

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
// for U+0100 onwards, so that every byte is one visible code point in vocab/merges strings.
void ByteToUnicode(uint32_t cp[256]) {
  int n = 0;
  for (int b = 0; b < 256; b++) {
    const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    cp[b] = keep ? static_cast<uint32_t>(b) : 256u + n++;
  }
}

// Decodes one UTF-8 code point at s[*i] (the JSON parser gave valid UTF-8), advancing *i.
uint32_t NextCodePoint(const std::string& s, size_t* i) {
  const unsigned char c = static_cast<unsigned char>(s[*i]);
  int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  if (*i + len > s.size()) len = 1;
  uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
  for (int k = 1; k < len; k++) cp = (cp << 6) | (static_cast<unsigned char>(s[*i + k]) & 0x3F);
  *i += len;
  return cp;
}

// The bytes a vocabulary string stands for: each code point of the byte map is its byte; any
// other code point (added tokens' own text) stands for its UTF-8 bytes, as tokenizers' ByteLevel
// decoder does.
std::string SymbolsToBytes(const std::string& s, const int inverse[512]) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const uint32_t cp = NextCodePoint(s, &i);
    if (cp < 512 && inverse[cp] >= 0) out.push_back(static_cast<char>(inverse[cp]));
    else out.append(s, start, i - start);
  }
  return out;
}

// Byte symbols of the string only (no fallback): false if s holds a code point outside the map.
bool SymbolsToBytesStrict(const std::string& s, const int inverse[512], std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size();) {
    const uint32_t cp = NextCodePoint(s, &i);
    if (cp >= 512 || inverse[cp] < 0) return false;
    out->push_back(static_cast<char>(inverse[cp]));
  }
  return true;
}

// o["type"] == type, false for a missing or non-string "type" (json::value would throw there).
bool TypeIs(const nlohmann::json& o, const char* type) {
  return o.is_object() && o.contains("type") && o["type"].is_string() && o["type"].get<std::string>() == type;
}

bool IsNullOrType(const nlohmann::json& j, const char* key, const char* type) {
  if (!j.contains(key) || j[key].is_null()) return true;
  return TypeIs(j[key], type);
}

std::string TypeOf(const nlohmann::json& j) {
  return j.is_object() && j.contains("type") ? JsonBrief(j["type"]) : JsonBrief(j);
}

// The pre-tokenizer p (JSON path `where`, e.g. "pre_tokenizer.") as splits in order: a Sequence's
// members in order (nested ones flattened), a Split's pattern, the ByteLevel's GPT-2 regex
// (use_regex true). ByteLevel must come once, last: it maps the bytes to the symbols the BPE
// model reads. *byte_levels counts the ByteLevels seen, *after_byte_level anything after one.
Status FlattenPreTokenizer(const std::string& what, const nlohmann::json& p, const std::string& where, int depth,
                           std::vector<StageSpec>* stages, int* byte_levels, bool* after_byte_level) {
  const std::string at = where.substr(0, where.size() - 1);  // the path without its final '.'
  const std::string expected = " (expected ByteLevel, or a Sequence of Split pre-tokenizers ending in ByteLevel)";
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
    return Status::InvalidArgument(what + ": " + at + " " + TypeOf(p) + " is not supported" + expected);
  if (*byte_levels > 0) *after_byte_level = true;
  const std::string type = p["type"].get<std::string>();
  if (type == "Sequence") {
    const nlohmann::json* list = JsonMember(p, "pretokenizers");
    if (!list || !list->is_array())
      return Status::InvalidArgument(what + ": " + where + "pretokenizers is " + (list ? JsonBrief(*list) : "missing") +
                                     " (expected an array)");
    if (depth > 8) return Status::InvalidArgument(what + ": " + at + ": Sequences nested deeper than 8 are not supported");
    for (size_t k = 0; k < list->size(); k++)
      SHARDGPT_RETURN_IF_ERROR(FlattenPreTokenizer(what, (*list)[k], where + "pretokenizers[" + std::to_string(k) + "].",
                                                   depth + 1, stages, byte_levels, after_byte_level));
    return Status::OK();
  }
  if (type == "ByteLevel") {
    const StatusOr<bool> add_prefix_space = JsonOptionalBool(what, p, where, "add_prefix_space", false);
    const StatusOr<bool> use_regex = JsonOptionalBool(what, p, where, "use_regex", true);
    const StatusOr<bool> trim_offsets = JsonOptionalBool(what, p, where, "trim_offsets", true);  // offsets only
    if (!add_prefix_space.ok()) return add_prefix_space.status();
    if (!use_regex.ok()) return use_regex.status();
    if (!trim_offsets.ok()) return trim_offsets.status();
    if (add_prefix_space.value())
      return Status::InvalidArgument(what + ": " + where + "add_prefix_space true is not supported (expected false)");
    ++*byte_levels;
    if (use_regex.value()) stages->push_back(StageSpec{kPattern, false, true, at});
    return Status::OK();
  }
  if (type == "Split") {
    StageSpec st;
    st.where = at;
    const StatusOr<bool> invert = JsonOptionalBool(what, p, where, "invert", false);
    const StatusOr<std::string> behavior = JsonOptionalString(what, p, where, "behavior", "");
    if (!invert.ok()) return invert.status();
    if (!behavior.ok()) return behavior.status();
    if (invert.value()) return Status::InvalidArgument(what + ": " + where + "invert true is not supported (expected false)");
    if (behavior.value() != "Isolated")
      return Status::InvalidArgument(what + ": " + where + "behavior " + Quoted(behavior.value()) +
                                     " is not supported (expected \"Isolated\")");
    const nlohmann::json* pat = JsonMember(p, "pattern");
    const nlohmann::json* regex = pat ? JsonMember(*pat, "Regex") : nullptr;
    const nlohmann::json* literal = pat ? JsonMember(*pat, "String") : nullptr;
    if (!pat || !pat->is_object() || pat->size() != 1 || !((regex && regex->is_string()) || (literal && literal->is_string())))
      return Status::InvalidArgument(what + ": " + where + "pattern is " + (pat ? JsonBrief(*pat) : "missing") +
                                     " (expected {\"Regex\": string} or {\"String\": string})");
    if (literal) {
      st.pattern = literal->get<std::string>();
      st.literal = true;
    } else {
      const std::string& onig = regex->get_ref<const std::string&>();
      std::string why;
      if (!OnigToPcre2(onig, &st.pattern, &why))
        return Status::InvalidArgument(what + ": " + where + "pattern.Regex " + JsonBrief(*regex) + ": " + why +
                                       " is not supported (Oniguruma's and PCRE2's meanings differ or it is not implemented)");
      st.cut_safe = onig == kLlama3Pattern;
    }
    stages->push_back(std::move(st));
    return Status::OK();
  }
  return Status::InvalidArgument(what + ": " + at + " type " + Quoted(type) + " is not supported" + expected);
}

// The ids special token `name` of a TemplateProcessing stands for (its special_tokens entry).
Status TemplateSpecialIds(const std::string& what, const nlohmann::json& p, const std::string& where,
                          const nlohmann::json& name, int vocab_size, std::vector<int32_t>* out) {
  const nlohmann::json* table = JsonMember(p, "special_tokens");
  const nlohmann::json* entry = table && name.is_string() ? JsonMember(*table, name.get_ref<const std::string&>().c_str()) : nullptr;
  const nlohmann::json* ids = entry ? JsonMember(*entry, "ids") : nullptr;
  if (!ids || !ids->is_array())
    return Status::InvalidArgument(what + ": " + where + "special_tokens has no ids for " + JsonBrief(name));
  for (const nlohmann::json& id : *ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size)
      return Status::InvalidArgument(what + ": " + where + "special_tokens " + JsonBrief(name) + " has id " + JsonBrief(id) +
                                     " (expected an id of the vocabulary)");
    out->push_back(id.get<int32_t>());
  }
  return Status::OK();
}

// The post-processor p (JSON path `where`): null, ByteLevel (offsets only), TemplateProcessing
// (its "single" template: special tokens, then $A, then special tokens, into *prefix and
// *suffix; "pair" is for pairs of texts, which are never encoded here), or a Sequence of those.
Status ParsePostProcessor(const std::string& what, const nlohmann::json& p, const std::string& where, int depth,
                          int vocab_size, std::vector<int32_t>* prefix, std::vector<int32_t>* suffix, int* templates) {
  if (p.is_null()) return Status::OK();
  const std::string at = where.substr(0, where.size() - 1);  // the path without its final '.'
  const std::string expected = " (expected null, ByteLevel, TemplateProcessing or a Sequence of those)";
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
    return Status::InvalidArgument(what + ": " + at + " " + TypeOf(p) + " is not supported" + expected);
  const std::string type = p["type"].get<std::string>();
  if (type == "ByteLevel") return Status::OK();
  if (type == "Sequence") {
    const nlohmann::json* list = JsonMember(p, "processors");
    if (!list || !list->is_array())
      return Status::InvalidArgument(what + ": " + where + "processors is " + (list ? JsonBrief(*list) : "missing") +
                                     " (expected an array)");
    if (depth > 8) return Status::InvalidArgument(what + ": " + at + ": Sequences nested deeper than 8 are not supported");
    for (size_t k = 0; k < list->size(); k++)
      SHARDGPT_RETURN_IF_ERROR(ParsePostProcessor(what, (*list)[k], where + "processors[" + std::to_string(k) + "].",
                                                  depth + 1, vocab_size, prefix, suffix, templates));
    return Status::OK();
  }
  if (type != "TemplateProcessing")
    return Status::InvalidArgument(what + ": " + at + " type " + Quoted(type) + " is not supported" + expected);
  if (++*templates > 1) return Status::InvalidArgument(what + ": " + at + ": a second TemplateProcessing is not supported");
  const nlohmann::json* single = JsonMember(p, "single");
  if (!single || !single->is_array())
    return Status::InvalidArgument(what + ": " + where + "single is " + (single ? JsonBrief(*single) : "missing") +
                                   " (expected an array)");
  int texts = 0;
  for (size_t k = 0; k < single->size(); k++) {
    const nlohmann::json& piece = (*single)[k];
    const std::string here = where + "single[" + std::to_string(k) + "]";
    const nlohmann::json* special = JsonMember(piece, "SpecialToken");
    const nlohmann::json* seq = JsonMember(piece, "Sequence");
    if (special && special->is_object() && JsonMember(*special, "id")) {
      SHARDGPT_RETURN_IF_ERROR(TemplateSpecialIds(what, p, where, (*special)["id"], vocab_size, texts ? suffix : prefix));
    } else if (seq && seq->is_object() && JsonMember(*seq, "id") && (*seq)["id"] == "A" && texts == 0) {
      texts++;
    } else {
      return Status::InvalidArgument(what + ": " + here + " " + JsonBrief(piece) +
                                     " is not supported (expected {\"SpecialToken\": ...} or one {\"Sequence\": {\"id\": \"A\"}})");
    }
  }
  if (texts != 1) return Status::InvalidArgument(what + ": " + where + "single has no {\"Sequence\": {\"id\": \"A\"}} (expected one)");
  return Status::OK();
}

// The offset of the first byte that is not part of valid UTF-8 (overlong forms, surrogates and
// code points above U+10FFFF included), or n.
size_t FirstInvalidUtf8(const unsigned char* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) { i++; continue; }
    int len;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return i;
    if (i + len > n) return i;
    for (int k = 1; k < len; k++) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return n;
}

bool IsAsciiSpace(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

}  // namespace

StatusOr<std::shared_ptr<const BpeTokenizer>> BpeTokenizer::Load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::NotFound(path + ": cannot open (expected a Hugging Face tokenizer.json)");
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return Status::IOError(path + ": read failed (expected a Hugging Face tokenizer.json)");
  return Parse(path, ss.str());
}

BpeTokenizer::~BpeTokenizer() {
  for (const Stage& st : stages_) pcre2_code_free(static_cast<pcre2_code*>(st.code));
}

StatusOr<std::shared_ptr<const BpeTokenizer>> BpeTokenizer::Parse(const std::string& what, const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument(what + ": not a JSON object (expected a tokenizer.json)");
  if (!j.contains("model") || !j["model"].is_object())
    return Status::InvalidArgument(what + ": no \"model\" object (expected a tokenizer.json)");
  const nlohmann::json& m = j["model"];
  if (m.contains("type") && !m["type"].is_string())
    return Status::InvalidArgument(what + ": model.type " + JsonBrief(m["type"]) + " is not a string");
  const std::string type = m.contains("type") ? m["type"].get<std::string>() : (m.contains("merges") ? "BPE" : "");
  if (type != "BPE")
    return Status::InvalidArgument(what + ": unsupported model type " + Quoted(type) + " (expected \"BPE\", byte-level)");
  for (const char* k : {"truncation", "padding"})  // tokenizers' encode would cut or pad the ids
    if (j.contains(k) && !j[k].is_null())
      return Status::InvalidArgument(what + ": " + k + " " + TypeOf(j[k]) + " is not supported (expected null)");
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    return Status::InvalidArgument(what + ": normalizer " + TypeOf(j["normalizer"]) + " is not supported (expected null)");
  if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null())
    return Status::InvalidArgument(what + ": pre_tokenizer missing is not supported (expected ByteLevel, or a Sequence of "
                                   "Split pre-tokenizers ending in ByteLevel)");
  std::vector<StageSpec> stage_specs;
  int byte_levels = 0;
  bool after_byte_level = false;
  SHARDGPT_RETURN_IF_ERROR(
      FlattenPreTokenizer(what, j["pre_tokenizer"], "pre_tokenizer.", 0, &stage_specs, &byte_levels, &after_byte_level));
  if (byte_levels != 1 || after_byte_level)
    return Status::InvalidArgument(what + ": pre_tokenizer with " + std::to_string(byte_levels) + " ByteLevel" +
                                   (after_byte_level ? " and pre-tokenizers after it" : "") +
                                   " is not supported (expected exactly one ByteLevel, last)");
  if (!IsNullOrType(j, "decoder", "ByteLevel"))
    return Status::InvalidArgument(what + ": decoder " + TypeOf(j["decoder"]) + " is not supported (expected ByteLevel)");
  if (m.contains("dropout") && !m["dropout"].is_null())
    return Status::InvalidArgument(what + ": model.dropout " + JsonBrief(m["dropout"]) + " is not supported (expected null)");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && !m[k].is_null() && m[k] != "")
      return Status::InvalidArgument(what + ": model." + k + " " + JsonBrief(m[k]) + " is not supported (expected null)");
  const StatusOr<bool> byte_fallback = JsonOptionalBool(what, m, "model.", "byte_fallback", false);
  const StatusOr<bool> ignore_merges = JsonOptionalBool(what, m, "model.", "ignore_merges", false);
  if (!byte_fallback.ok()) return byte_fallback.status();
  if (!ignore_merges.ok()) return ignore_merges.status();
  if (byte_fallback.value())
    return Status::InvalidArgument(what + ": model.byte_fallback true is not supported (expected false)");
  if (!m.contains("vocab") || !m["vocab"].is_object()) return Status::InvalidArgument(what + ": model.vocab is not an object");
  if (!m.contains("merges") || !m["merges"].is_array()) return Status::InvalidArgument(what + ": model.merges is not an array");

  std::shared_ptr<BpeTokenizer> t(new BpeTokenizer());
  t->ignore_merges_ = ignore_merges.value();
  uint32_t cp[256];
  ByteToUnicode(cp);
  int inverse[512];
  std::fill(inverse, inverse + 512, -1);
  for (int b = 0; b < 256; b++) inverse[cp[b]] = b;

  // ids: the vocabulary, then the added tokens (which may repeat vocabulary entries)
  std::unordered_map<std::string, int32_t> vocab;
  int64_t max_id = -1;
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() >= (int64_t{1} << 24))
      return Status::InvalidArgument(what + ": vocab entry " + Quoted(it.key()) + " has id " + JsonBrief(it.value()) +
                                     " (expected an integer in [0, 2^24))");
    vocab[it.key()] = it.value().get<int32_t>();
    max_id = std::max<int64_t>(max_id, it.value().get<int64_t>());
  }
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    if (!j["added_tokens"].is_array()) return Status::InvalidArgument(what + ": added_tokens is not an array");
    size_t k = 0;
    for (const auto& a : j["added_tokens"]) {
      const std::string at = "added_tokens[" + std::to_string(k++) + "]";
      if (!a.is_object()) return Status::InvalidArgument(what + ": " + at + " is " + JsonBrief(a) + " (expected an object)");
      const nlohmann::json* id = JsonMember(a, "id");
      const nlohmann::json* content = JsonMember(a, "content");
      if (!id || !id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() >= (int64_t{1} << 24))
        return Status::InvalidArgument(what + ": " + at + ".id is " + (id ? JsonBrief(*id) : "missing") +
                                       " (expected an integer in [0, 2^24))");
      if (!content || !content->is_string() || content->get_ref<const std::string&>().empty())
        return Status::InvalidArgument(what + ": " + at + ".content is " + (content ? JsonBrief(*content) : "missing") +
                                       " (expected a non-empty string)");
      const std::string where = at + " " + Quoted(content->get<std::string>()) + " ";
      for (const char* key : {"lstrip", "rstrip", "single_word"}) {
        const StatusOr<bool> flag = JsonOptionalBool(what, a, where, key, false);
        if (!flag.ok()) return flag.status();
        if (flag.value()) return Status::InvalidArgument(what + ": " + where + key + " true is not supported (expected false)");
      }
      // tokenizers' AddedToken default: special tokens are matched before normalization
      const StatusOr<bool> special = JsonOptionalBool(what, a, where, "special", false);
      if (!special.ok()) return special.status();
      const StatusOr<bool> normalized = JsonOptionalBool(what, a, where, "normalized", !special.value());
      if (!normalized.ok()) return normalized.status();
      t->added_[normalized.value() ? 1 : 0].push_back(Added{content->get<std::string>(), id->get<int32_t>()});
      max_id = std::max<int64_t>(max_id, id->get<int64_t>());
    }
  }
  if (max_id < 0) return Status::InvalidArgument(what + ": empty vocabulary");
  for (std::vector<Added>& list : t->added_)
    std::stable_sort(list.begin(), list.end(), [](const Added& a, const Added& b) { return a.content.size() > b.content.size(); });
  for (int b = 0; b < 256; b++) {
    std::string sym;
    const uint32_t c = cp[b];
    if (c < 0x80) sym.push_back(static_cast<char>(c));
    else sym.push_back(static_cast<char>(0xC0 | (c >> 6))), sym.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    auto it = vocab.find(sym);
    if (it == vocab.end()) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02x", b);
      return Status::InvalidArgument(what + ": the vocabulary has no symbol for byte " + hex + " (\"" + sym +
                                     "\"; expected all 256 byte-level symbols)");
    }
    t->byte_id_[b] = it->second;
  }
  // ids are dense in real tokenizers; a lone huge id would only make us allocate its table
  const int64_t entries = static_cast<int64_t>(vocab.size() + t->added_[0].size() + t->added_[1].size());
  if (max_id >= entries)
    return Status::InvalidArgument(what + ": id " + std::to_string(max_id) + " lies beyond the " + std::to_string(entries) +
                                   " vocabulary entries and added tokens (expected ids 0.." + std::to_string(entries - 1) + ")");
  t->vocab_size_ = static_cast<int>(max_id + 1);
  t->pieces_.assign(t->vocab_size_, Tokenizer::kUnknown);
  for (const auto& [s, id] : vocab) t->pieces_[id] = SymbolsToBytes(s, inverse);
  for (const std::vector<Added>& list : t->added_)
    for (const Added& a : list) {
      t->pieces_[a.id] = a.content;
      if (a.content == "<|endoftext|>") t->eot_ = a.id;
      if (a.content.find('\n') != std::string::npos) t->added_have_newline_ = true;
    }
  uint64_t rank = 0;
  for (const auto& e : m["merges"]) {
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ', 1);
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        return Status::InvalidArgument(what + ": merge " + std::to_string(rank) + " " + Quoted(s) + " (expected \"left right\")");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>(), b = e[1].get<std::string>();
    } else {
      return Status::InvalidArgument(what + ": merge " + std::to_string(rank) + " is " + JsonBrief(e) +
                                     " (expected \"left right\" or [left, right])");
    }
    auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
    if (ia == vocab.end() || ib == vocab.end() || iab == vocab.end())
      return Status::InvalidArgument(what + ": merge " + std::to_string(rank) + " \"" + a + " " + b +
                                     "\" uses a symbol not in the vocabulary");
    const uint64_t key = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
    t->merges_[key] = (rank << 32) | static_cast<uint32_t>(iab->second);  // listed twice: the last rank (tokenizers')
    rank++;
  }
  if (t->ignore_merges_) {
    std::string bytes;
    for (const auto& [s, id] : vocab)
      if (SymbolsToBytesStrict(s, inverse, &bytes)) t->word_ids_[bytes] = id;
  }
  if (j.contains("post_processor")) {
    int templates = 0;
    SHARDGPT_RETURN_IF_ERROR(ParsePostProcessor(what, j["post_processor"], "post_processor.", 0, t->vocab_size_,
                                                &t->text_prefix_, &t->text_suffix_, &templates));
  }
  t->cuts_safe_ = !stage_specs.empty();
  for (const StageSpec& spec : stage_specs) {
    int err = 0;
    PCRE2_SIZE erroff = 0;
    const uint32_t options = PCRE2_UTF | (spec.literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(spec.pattern.data()), spec.pattern.size(), options,
                                     &err, &erroff, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[120];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return Status::InvalidArgument(what + ": " + spec.where + " pattern " + Quoted(spec.pattern) + " does not compile: " +
                                     reinterpret_cast<char*>(msg));
    }
    t->stages_.push_back(Stage{code});  // freed by ~BpeTokenizer from here on
    uint32_t min_length = 0;
    if (pcre2_pattern_info(code, PCRE2_INFO_MINLENGTH, &min_length) != 0 || min_length == 0)
      return Status::InvalidArgument(what + ": " + spec.where + " pattern " + Quoted(spec.pattern) +
                                     " may match the empty string, which is not supported");
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without JIT (unsupported CPU) the interpreter runs it
    t->cuts_safe_ = t->cuts_safe_ && spec.cut_safe;
  }
  return std::shared_ptr<const BpeTokenizer>(t);
}

Tokenizer BpeTokenizer::DecodeTable() const { return Tokenizer::FromPieces(pieces_, eot_); }

size_t BpeTokenizer::SafeCut(const char* s, size_t lo, size_t hi) const {
  if (added_have_newline_ || !cuts_safe_) return 0;
  // a cut at p: s[p-1] == '\n', s[p-2] and s[p] ASCII non-space (s[p] inside [.., hi))
  for (size_t p = hi - 1; p > lo && p >= 2 && p < hi; p--) {
    if (s[p - 1] != '\n') continue;
    const unsigned char before = static_cast<unsigned char>(s[p - 2]), after = static_cast<unsigned char>(s[p]);
    if (before < 0x80 && !IsAsciiSpace(before) && after < 0x80 && !IsAsciiSpace(after)) return p;
  }
  return 0;
}

BpeTokenizer::Session::Session(const BpeTokenizer& tok) : tok_(tok) {
  for (const Stage& st : tok.stages_)
    match_data_.push_back(pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(st.code), nullptr));
  // whitespace runs backtrack in [ws]+(?![^ws]): give the JIT more than its 32 KiB default
  jit_stack_ = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
  match_ctx_ = pcre2_match_context_create(nullptr);
  pcre2_jit_stack_assign(static_cast<pcre2_match_context*>(match_ctx_), nullptr, static_cast<pcre2_jit_stack*>(jit_stack_));
}

BpeTokenizer::Session::~Session() {
  for (void* md : match_data_) pcre2_match_data_free(static_cast<pcre2_match_data*>(md));
  pcre2_match_context_free(static_cast<pcre2_match_context*>(match_ctx_));
  pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack_));
}

Status BpeTokenizer::Session::Encode(const std::string& what, const char* text, size_t n, uint64_t base_offset,
                                     std::vector<int32_t>* out) {
  return EncodeAdded(0, what, text, n, base_offset, out);
}

Status BpeTokenizer::Session::EncodeAdded(int list, const std::string& what, const char* text, size_t n,
                                          uint64_t base_offset, std::vector<int32_t>* out) {
  if (list == 2) return EncodeOrdinary(what, text, n, base_offset, out);
  // tokenizers' AddedVocabulary: the tokens of this list leftmost-longest; the text between
  // them goes on to the next list
  const std::vector<Added>& added = tok_.added_[list];
  size_t at = 0;
  const std::string_view s(text, n);
  std::vector<size_t> next(added.size());
  for (size_t k = 0; k < next.size(); k++) next[k] = s.find(added[k].content);
  while (at < n) {
    size_t best = n, best_k = 0;
    for (size_t k = 0; k < next.size(); k++) {
      if (next[k] != std::string_view::npos && next[k] < at) next[k] = s.find(added[k].content, at);
      if (next[k] < best) best = next[k], best_k = k;  // sorted longest first: ties keep the longest
    }
    SHARDGPT_RETURN_IF_ERROR(EncodeAdded(list + 1, what, text + at, best - at, base_offset + at, out));
    if (best == n) break;
    out->push_back(added[best_k].id);
    at = best + added[best_k].content.size();
  }
  return Status::OK();
}

Status BpeTokenizer::Session::EncodeOrdinary(const std::string& what, const char* text, size_t n, uint64_t base_offset,
                                             std::vector<int32_t>* out) {
  if (n == 0) return Status::OK();
  const size_t bad = FirstInvalidUtf8(reinterpret_cast<const unsigned char*>(text), n);
  if (bad < n)
    return Status::InvalidArgument(what + ": invalid UTF-8 at byte " + std::to_string(base_offset + bad) +
                                   " (expected UTF-8 text)");
  return PreTokenize(0, what, text, n, base_offset, out);
}

Status BpeTokenizer::Session::PreTokenize(size_t stage, const std::string& what, const char* text, size_t n,
                                          uint64_t base_offset, std::vector<int32_t>* out) {
  if (n == 0) return Status::OK();  // tokenizers drops empty pieces
  if (stage == tok_.stages_.size()) {
    Bpe(text, n, out);
    return Status::OK();
  }
  auto* code = static_cast<pcre2_code*>(tok_.stages_[stage].code);
  auto* md = static_cast<pcre2_match_data*>(match_data_[stage]);
  auto* ctx = static_cast<pcre2_match_context*>(match_ctx_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text);
  size_t at = 0;
  while (at < n) {
    const int rc = pcre2_match(code, subject, n, at, PCRE2_NO_UTF_CHECK, md, ctx);
    if (rc < 0) {
      if (rc == PCRE2_ERROR_NOMATCH) break;
      PCRE2_UCHAR msg[120];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      return Status::Internal(what + ": pre-tokenization failed at byte " + std::to_string(base_offset + at) + ": " +
                              reinterpret_cast<char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[1] == ov[0]) break;  // patterns that may match empty are refused; guard against a loop anyway
    // bytes no alternative took: tokenizers keeps them as a piece of their own
    SHARDGPT_RETURN_IF_ERROR(PreTokenize(stage + 1, what, text + at, ov[0] - at, base_offset + at, out));
    SHARDGPT_RETURN_IF_ERROR(PreTokenize(stage + 1, what, text + ov[0], ov[1] - ov[0], base_offset + ov[0], out));
    at = ov[1];
  }
  return PreTokenize(stage + 1, what, text + at, n - at, base_offset + at, out);
}

bool BpeTokenizer::FindMerge(int32_t a, int32_t b, uint32_t* rank, int32_t* id) const {
  auto it = merges_.find((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b));
  if (it == merges_.end()) return false;
  *rank = static_cast<uint32_t>(it->second >> 32);
  *id = static_cast<int32_t>(it->second & 0xffffffffu);
  return true;
}

// tokenizers' Word::merge_all: a min-heap of (rank, position) over the symbols' linked list.
// The top candidate is merged unless it went stale (its left symbol was merged away, or the
// pair there no longer merges into the same id); the merged symbol's new pairs with its
// neighbours go onto the heap. The same order as rescanning for the lowest rank, leftmost
// among equals, after every merge, in O(n log n).
void BpeTokenizer::Session::MergeWord() {
  std::vector<int32_t>& word = word_;
  const int32_t n = static_cast<int32_t>(word.size());
  syms_.resize(word.size());
  heap_.clear();
  auto later = [](const Candidate& x, const Candidate& y) { return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos; };
  auto push = [&](int32_t pos) {
    Candidate c{0, static_cast<uint32_t>(pos), 0};
    if (!tok_.FindMerge(syms_[pos].id, syms_[syms_[pos].next].id, &c.rank, &c.new_id)) return;
    heap_.push_back(c);
    std::push_heap(heap_.begin(), heap_.end(), later);
  };
  for (int32_t i = 0; i < n; i++) syms_[i] = Symbol{word[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  for (int32_t i = 0; i + 1 < n; i++) push(i);
  while (!heap_.empty()) {
    std::pop_heap(heap_.begin(), heap_.end(), later);
    const Candidate top = heap_.back();
    heap_.pop_back();
    Symbol& left = syms_[top.pos];
    if (!left.alive || left.next < 0) continue;
    uint32_t rank;
    int32_t id;
    if (!tok_.FindMerge(left.id, syms_[left.next].id, &rank, &id) || id != top.new_id) continue;
    Symbol& right = syms_[left.next];
    left.id = id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) syms_[right.next].prev = static_cast<int32_t>(top.pos);
    if (left.prev >= 0) push(left.prev);
    if (left.next >= 0) push(static_cast<int32_t>(top.pos));
  }
  word.clear();
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = syms_[i].next) word.push_back(syms_[i].id);  // symbol 0 stays alive
}

void BpeTokenizer::Session::Bpe(const char* w, size_t n, std::vector<int32_t>* out) {
  std::string key(w, n);
  auto hit = cache_.find(key);
  if (hit != cache_.end()) {
    out->insert(out->end(), hit->second.begin(), hit->second.end());
    return;
  }
  std::vector<int32_t>& word = word_;
  word.clear();
  auto whole = tok_.ignore_merges_ ? tok_.word_ids_.find(key) : tok_.word_ids_.end();
  if (whole != tok_.word_ids_.end()) {
    word.push_back(whole->second);
  } else {
    for (size_t i = 0; i < n; i++) word.push_back(tok_.byte_id_[static_cast<unsigned char>(w[i])]);
    MergeWord();
  }
  out->insert(out->end(), word.begin(), word.end());
  if (cache_.size() > (1u << 20)) cache_.clear();  // bounded memory on endless new words
  cache_.emplace(std::move(key), word);
}

}  // namespace shardgpt
