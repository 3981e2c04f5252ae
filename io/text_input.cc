#include "io/text_input.h"

#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

namespace shardgpt {
namespace {

constexpr size_t kBufferBytes = 1 << 20;

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const char* JsonTypeName(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
    case nlohmann::json::value_t::number_float: return "a number";
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::string: return "a string";
    default: return "not a JSON value";
  }
}

}  // namespace

bool IsJsonLinesPath(const std::string& path) {
  return EndsWith(path, ".jsonl") || EndsWith(path, ".jsonl.gz") || EndsWith(path, ".json.gz");
}

StatusOr<std::unique_ptr<DocumentReader>> DocumentReader::Open(const std::string& path, const std::string& text_field) {
  std::unique_ptr<DocumentReader> r(new DocumentReader());
  r->path_ = path;
  r->field_ = text_field;
  r->jsonl_ = IsJsonLinesPath(path);
  {  // gzip by its magic bytes, not by the name
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) {
      return Status::NotFound(path + ": cannot open (" + std::strerror(errno) + "); expected a readable text file");
    }
    unsigned char magic[2] = {0, 0};
    const size_t n = std::fread(magic, 1, 2, f);
    std::fclose(f);
    r->gzip_ = n == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  }
  // zlib reads a file without the gzip magic as it is ("transparent"), so one reader serves both.
  gzFile gz = gzopen(path.c_str(), "rb");
  if (gz == nullptr) {
    return Status::NotFound(path + ": cannot open (" + std::strerror(errno) + "); expected a readable text file");
  }
  gzbuffer(gz, 1 << 17);
  r->gz_ = gz;
  r->buf_.resize(kBufferBytes);
  return r;
}

DocumentReader::~DocumentReader() {
  if (gz_ != nullptr) gzclose_r(static_cast<gzFile>(gz_));
}

std::string DocumentReader::where() const {
  return jsonl_ ? path_ + ":" + std::to_string(line_no_) : path_;
}

uint64_t DocumentReader::file_bytes_read() const {
  const z_off_t off = gzoffset(static_cast<gzFile>(gz_));
  return off > 0 ? static_cast<uint64_t>(off) : 0;
}

Status DocumentReader::Fill() {
  pos_ = len_ = 0;
  if (eof_) return Status::OK();
  gzFile gz = static_cast<gzFile>(gz_);
  const int n = gzread(gz, buf_.data(), static_cast<unsigned>(buf_.size()));
  if (n > 0) {  // data before a problem is handed out first; the next call reports the problem
    len_ = static_cast<size_t>(n);
    return Status::OK();
  }
  int err = Z_OK;
  const char* m = gzerror(gz, &err);
  std::string msg = m ? m : "";
  if (msg.rfind(path_ + ": ", 0) == 0) msg.erase(0, path_.size() + 2);  // zlib prefixes the path
  // where the problem is: the JSONL line being read, or the text file
  const std::string at = jsonl_ ? path_ + ":" + std::to_string(line_no_ + 1) : path_;
  if (err == Z_ERRNO) return Status::IOError(at + ": read failed (" + std::strerror(errno) + "); expected a readable file");
  if (err == Z_BUF_ERROR) {  // the input ended inside a gzip stream
    return Status::Corruption(at + ": gzip data ends early (" + (msg.empty() ? "unexpected end of file" : msg) +
                              "; the file is truncated) (expected a complete gzip file)");
  }
  if (n < 0 || err != Z_OK) {
    return Status::Corruption(at + ": gzip data is corrupt (" + msg + "); expected a valid gzip file");
  }
  eof_ = true;
  return Status::OK();
}

Status DocumentReader::ReadLine(bool* got) {
  line_.clear();
  for (;;) {
    if (pos_ == len_) {
      SHARDGPT_RETURN_IF_ERROR(Fill());
      if (len_ == 0) {  // end of the input: a last line without '\n' still counts
        *got = !line_.empty();
        if (*got) ++line_no_;
        return Status::OK();
      }
    }
    const char* start = buf_.data() + pos_;
    const void* nl = std::memchr(start, '\n', len_ - pos_);
    if (nl != nullptr) {
      const size_t k = static_cast<size_t>(static_cast<const char*>(nl) - start);
      line_.append(start, k);
      pos_ += k + 1;
      ++line_no_;
      *got = true;
      return Status::OK();
    }
    line_.append(start, len_ - pos_);
    pos_ = len_;
  }
}

Status DocumentReader::NextDocument(bool* more) {
  *more = false;
  if (!jsonl_) {
    if (records_ > 0) return Status::OK();  // a text file is one document
    records_ = 1;
    // a document only if the file holds text (a gzip'd empty file has none)
    if (pos_ == len_) SHARDGPT_RETURN_IF_ERROR(Fill());
    if (len_ == 0) return Status::InvalidArgument(path_ + ": file is empty (expected text to tokenize)");
    in_doc_ = true;
    *more = true;
    return Status::OK();
  }
  const std::string expected = "expected a JSON object with a string field \"" + field_ + "\" on each line";
  for (;;) {
    bool got = false;
    SHARDGPT_RETURN_IF_ERROR(ReadLine(&got));
    if (!got) {
      if (records_ == 0) return Status::InvalidArgument(path_ + ": no records (" + expected + ")");
      return Status::OK();
    }
    if (line_.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines are skipped
    const std::string at = path_ + ":" + std::to_string(line_no_);
    const nlohmann::json j = nlohmann::json::parse(line_, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return Status::InvalidArgument(at + ": not valid JSON (" + expected + ")");
    if (!j.is_object()) return Status::InvalidArgument(at + ": " + JsonTypeName(j) + ", not an object (" + expected + ")");
    const auto it = j.find(field_);
    if (it == j.end()) {
      return Status::InvalidArgument(at + ": no field \"" + field_ + "\" (" + expected + "; --text-field names it)");
    }
    if (!it->is_string()) {
      return Status::InvalidArgument(at + ": field \"" + field_ + "\" is " + JsonTypeName(*it) + " (expected a string)");
    }
    doc_ = it->get<std::string>();
    doc_pos_ = 0;
    ++records_;
    in_doc_ = true;
    *more = true;
    return Status::OK();
  }
}

Status DocumentReader::Read(size_t max, std::string* out, bool* done) {
  *done = false;
  if (!in_doc_) {
    *done = true;
    return Status::OK();
  }
  if (jsonl_) {
    const size_t k = std::min(max, doc_.size() - doc_pos_);
    out->append(doc_, doc_pos_, k);
    doc_pos_ += k;
    if (doc_pos_ == doc_.size()) {
      in_doc_ = false;
      *done = true;
      std::string().swap(doc_);
    }
    return Status::OK();
  }
  size_t left = max;
  while (left > 0) {
    if (pos_ == len_) {
      SHARDGPT_RETURN_IF_ERROR(Fill());
      if (len_ == 0) {
        in_doc_ = false;
        *done = true;
        return Status::OK();
      }
    }
    const size_t k = std::min(left, len_ - pos_);
    out->append(buf_.data() + pos_, k);
    pos_ += k;
    left -= k;
  }
  return Status::OK();
}

}  // namespace shardgpt
