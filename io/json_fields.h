// Typed reads of the fields of a JSON file from outside (HF config.json, tokenizer.json): a
// missing field, or one of another JSON type or out of range, is an error value naming the file
// and the field, never a thrown nlohmann::json::type_error. JsonBrief shows a value in such an
// error without recursing into it (a crafted file may nest arrays a million deep).
//
// Thread contract: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace shardgpt {

// A short, one-line rendering of v for an error: numbers, booleans and null as JSON, strings
// quoted (cut to 40 bytes), "an array of N" / "an object of N" for containers.
std::string JsonBrief(const nlohmann::json& v);

// The name of v's JSON type, as a user reads it: "a string", "null", "an integer", ...
std::string JsonTypeName(const nlohmann::json& v);

// o[key] when o is an object holding key, else nullptr.
const nlohmann::json* JsonMember(const nlohmann::json& o, const char* key);

// Optional fields: absent (or, where null_is_absent, null) gives `fallback`; any other type is
// an error "<what>: <where><key> is <value> (expected ...)".
StatusOr<bool> JsonOptionalBool(const std::string& what, const nlohmann::json& o, const std::string& where,
                                const char* key, bool fallback, bool null_is_absent = false);
StatusOr<std::string> JsonOptionalString(const std::string& what, const nlohmann::json& o, const std::string& where,
                                         const char* key, const std::string& fallback, bool null_is_absent = false);

// A required positive integer field (at most 2^30): absent, another type or out of range is an
// error "<what>: ..."; with fallback > 0 the field is optional and null or absent gives fallback.
Status JsonPositiveInt(const std::string& what, const nlohmann::json& o, const char* key, int* out, int fallback = 0);

// The whole text of a file (a config.json, an index), or NotFound / IOError naming the path and
// what it was expected to hold.
StatusOr<std::string> ReadTextFile(const std::string& path, const std::string& expected);
// Replaces path with `text` atomically (path.tmp.PID, then a rename); the temporary is removed on
// error.
Status WriteTextFileAtomic(const std::string& path, const std::string& text);

}  // namespace shardgpt
