#include "io/json_fields.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace shardgpt {

std::string JsonBrief(const nlohmann::json& v) {
  if (v.is_array()) return "an array of " + std::to_string(v.size());
  if (v.is_object()) return "an object of " + std::to_string(v.size());
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    return s.size() > 40 ? Quoted(s.substr(0, 40)) + "..." : Quoted(s);
  }
  if (v.is_discarded()) return "nothing";
  return v.dump();  // a scalar: number, boolean or null
}

std::string JsonTypeName(const nlohmann::json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "nothing";
}

const nlohmann::json* JsonMember(const nlohmann::json& o, const char* key) {
  if (!o.is_object()) return nullptr;
  auto it = o.find(key);
  return it == o.end() ? nullptr : &*it;
}

StatusOr<bool> JsonOptionalBool(const std::string& what, const nlohmann::json& o, const std::string& where,
                                const char* key, bool fallback, bool null_is_absent) {
  const nlohmann::json* v = JsonMember(o, key);
  if (!v || (null_is_absent && v->is_null())) return fallback;
  if (!v->is_boolean())
    return Status::InvalidArgument(what + ": " + where + key + " is " + JsonBrief(*v) + " (expected true or false)");
  return v->get<bool>();
}

StatusOr<std::string> JsonOptionalString(const std::string& what, const nlohmann::json& o, const std::string& where,
                                         const char* key, const std::string& fallback, bool null_is_absent) {
  const nlohmann::json* v = JsonMember(o, key);
  if (!v || (null_is_absent && v->is_null())) return fallback;
  if (!v->is_string())
    return Status::InvalidArgument(what + ": " + where + key + " is " + JsonBrief(*v) + " (expected a string)");
  return v->get<std::string>();
}

Status JsonPositiveInt(const std::string& what, const nlohmann::json& o, const char* key, int* out, int fallback) {
  const nlohmann::json* v = JsonMember(o, key);
  if (fallback > 0 && (!v || v->is_null())) {
    *out = fallback;
    return Status::OK();
  }
  if (!v) return Status::InvalidArgument(what + ": missing \"" + key + "\" (expected a positive integer)");
  if (!v->is_number_integer() || v->get<int64_t>() < 1 || v->get<int64_t>() > (1 << 30) ||
      (v->is_number_unsigned() && v->get<uint64_t>() > (1u << 30)))
    return Status::InvalidArgument(what + ": " + key + " is " + JsonBrief(*v) + " (expected a positive integer)");
  *out = v->get<int>();
  return Status::OK();
}

StatusOr<std::string> ReadTextFile(const std::string& path, const std::string& expected) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::NotFound(path + ": cannot open (expected " + expected + ")");
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return Status::IOError(path + ": read failed (expected " + expected + ")");
  return ss.str();
}

Status WriteTextFileAtomic(const std::string& path, const std::string& text) {
  // a temporary of this process's own: two processes may write the same path at once
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      return Status::IOError(tmp + ": write failed: " + std::strerror(errno));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return Status::IOError(path + ": cannot rename into place: " + std::strerror(errno));
  }
  return Status::OK();
}

}  // namespace shardgpt
