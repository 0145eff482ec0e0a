#include "spec/document.hpp"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdlib>
#include <fmt/format.h>
#include <limits>
#include <regex>
#include <set>

#include "core/error.hpp"

namespace qstage::spec {

using nlohmann::json;

namespace {

std::string escape_token(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

json plain_scalar(const std::string& s) {
  static const std::set<std::string> nulls{"", "~", "null", "Null", "NULL"};
  if (nulls.count(s)) return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  static const std::regex integer(R"(^[-+]?(0|[1-9][0-9_]*)$)"), hex(R"(^0x[0-9a-fA-F_]+$)");
  if (std::regex_match(s, integer) || std::regex_match(s, hex)) {
    std::string digits;
    for (char c : s)
      if (c != '_' && c != '+') digits += c;
    errno = 0;
    if (digits[0] == '-') {
      long long v = std::strtoll(digits.c_str(), nullptr, 0);
      if (errno == 0) return v;
    } else {
      unsigned long long v = std::strtoull(digits.c_str(), nullptr, 0);
      if (errno == 0) return v <= static_cast<unsigned long long>(std::numeric_limits<long long>::max())
                                 ? json(static_cast<long long>(v))
                                 : json(v);
    }
    return s;  // out of range: keep the text; the schema will say what was expected
  }
  static const std::regex real(R"(^[-+]?([0-9][0-9_]*)?\.?[0-9_]*([eE][-+]?[0-9]+)?$)");
  if (std::regex_match(s, real) && s.find_first_of("0123456789") != std::string::npos) {
    std::string digits;
    for (char c : s)
      if (c != '_') digits += c;
    char* end = nullptr;
    double v = std::strtod(digits.c_str(), &end);
    if (end && *end == '\0') return v;
  }
  if (s == ".inf" || s == "+.inf") return std::numeric_limits<double>::infinity();
  if (s == "-.inf") return -std::numeric_limits<double>::infinity();
  return s;
}

class Converter {
 public:
  Converter(Document& doc) : doc_(doc) {}

  json convert(const YAML::Node& node, const std::string& pointer) {
    const auto m = node.Mark();
    doc_.marks[pointer] = {m.line + 1, m.column + 1};
    switch (node.Type()) {
      case YAML::NodeType::Null:
      case YAML::NodeType::Undefined: return nullptr;
      case YAML::NodeType::Scalar:
        return node.Tag() == "!" ? json(node.Scalar()) : plain_scalar(node.Scalar());
      case YAML::NodeType::Sequence: {
        json arr = json::array();
        size_t i = 0;
        for (const auto& item : node) arr.push_back(convert(item, pointer + "/" + std::to_string(i++)));
        return arr;
      }
      case YAML::NodeType::Map: {
        json obj = json::object();
        for (const auto& kv : node) {
          if (!kv.first.IsScalar())
            fail(kv.first, "a mapping key must be a plain value");
          const std::string key = kv.first.Scalar();
          if (obj.contains(key)) fail(kv.first, fmt::format("duplicate key '{}'", key));
          obj[key] = convert(kv.second, pointer + "/" + escape_token(key));
        }
        return obj;
      }
    }
    return nullptr;
  }

 private:
  [[noreturn]] void fail(const YAML::Node& node, const std::string& what) {
    throw InputError(fmt::format("{}:{}:{}: {}", doc_.source, node.Mark().line + 1, node.Mark().column + 1, what));
  }
  Document& doc_;
};

}  // namespace

std::string Document::where(const std::string& pointer) const {
  std::string p = pointer;
  while (true) {
    auto it = marks.find(p);
    if (it != marks.end() && it->second.line > 0) return fmt::format("{}:{}:{}", source, it->second.line, it->second.column);
    if (p.empty()) return source;
    p = p.substr(0, p.rfind('/'));
  }
}

Document parse_yaml(std::string_view text, std::string source) {
  Document doc;
  doc.source = std::move(source);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    throw InputError(fmt::format("{}:{}:{}: malformed YAML: {}", doc.source, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  doc.value = Converter(doc).convert(root, "");
  return doc;
}

std::string pointer_to_path(const std::string& pointer) {
  std::string out;
  size_t pos = 0;
  while (pos < pointer.size()) {
    size_t next = pointer.find('/', pos + 1);
    std::string token = pointer.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
    std::string unescaped;
    for (size_t i = 0; i < token.size(); ++i) {
      if (token[i] == '~' && i + 1 < token.size()) {
        unescaped += token[i + 1] == '1' ? '/' : '~';
        ++i;
      } else {
        unescaped += token[i];
      }
    }
    const bool index = !unescaped.empty() && unescaped.find_first_not_of("0123456789") == std::string::npos;
    if (index) out += "[" + unescaped + "]";
    else out += (out.empty() ? "" : ".") + unescaped;
    if (next == std::string::npos) break;
    pos = next;
  }
  return out.empty() ? "(document)" : out;
}

}  // namespace qstage::spec
