// Quoted, the message helper; Status itself is header-only.
#include "base/status.h"

#include <cstdio>

namespace shardgpt {

std::string Quoted(const std::string& s) {
  std::string q = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') q += '\\', q += static_cast<char>(c);
    else if (c == '\n') q += "\\n";
    else if (c == '\t') q += "\\t";
    else if (c == '\r') q += "\\r";
    else if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      q += hex;
    } else {
      q += static_cast<char>(c);
    }
  }
  return q + "\"";
}

}  // namespace shardgpt
