// Prepare's inputs, read as documents in bounded pieces, so that no input is ever held whole
// in memory.
//
// A text file is one document. A JSON Lines file (a name ending .jsonl, .jsonl.gz or .json.gz)
// is one document per non-blank line: the string field `text_field` of the JSON object on
// that line. Any input whose first two bytes are gzip's magic (1f 8b) is decompressed as it
// is read, whatever its name. Memory: one buffer of the file, plus one line of a JSONL file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace shardgpt {

// Whether prepare reads `path` as JSON Lines (by its name: .jsonl, .jsonl.gz, .json.gz).
bool IsJsonLinesPath(const std::string& path);

class DocumentReader {
 public:
  // Opens `path`; errors name it. `text_field` is the JSONL field holding each document.
  static StatusOr<std::unique_ptr<DocumentReader>> Open(const std::string& path, const std::string& text_field);
  ~DocumentReader();
  DocumentReader(const DocumentReader&) = delete;
  DocumentReader& operator=(const DocumentReader&) = delete;

  // Moves to the next document; *more is false at the end of the input. Every error is one
  // line naming path:line for a JSONL file (bad JSON, not an object, the field missing or not
  // a string, gzip data that is corrupt or ends early) and path for a text file. A JSONL
  // file without any record and a text file without any byte are errors too.
  Status NextDocument(bool* more);
  // Appends at most `max` (>= 1) bytes of the current document to *out; *done is true once
  // the document has been handed out whole.
  Status Read(size_t max, std::string* out, bool* done);
  // Where the current document is, for messages: "path", or "path:line" for a JSONL record.
  std::string where() const;
  // Bytes of the file itself (compressed bytes for gzip) consumed so far: progress.
  uint64_t file_bytes_read() const;
  bool is_jsonl() const { return jsonl_; }
  bool is_gzip() const { return gzip_; }

 private:
  DocumentReader() = default;
  // Refills the buffer; at the end of the input sets eof_, or fails where gzip data ends early.
  Status Fill();
  // The next line into line_ (without its '\n'); *got false at the end of the input.
  Status ReadLine(bool* got);

  std::string path_, field_;
  void* gz_ = nullptr;  // gzFile
  bool jsonl_ = false, gzip_ = false, eof_ = false;
  std::string buf_;
  size_t pos_ = 0, len_ = 0;
  uint64_t line_no_ = 0;     // JSONL: line of the current record
  uint64_t records_ = 0;     // JSONL: records seen; text: 1 once the document started
  std::string line_, doc_;   // JSONL: the current line and its document text
  size_t doc_pos_ = 0;
  bool in_doc_ = false;
};

}  // namespace shardgpt
