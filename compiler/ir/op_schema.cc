// ParseOpSchema: a small reader of torch's schema grammar, enough to find each slot's type and
// alias annotation. Defaults are skipped, not read: brackets and quotes only matter so that a
// comma inside "int[2] stride=[1, 1]" or 'str padding="a,b"' does not split an argument.
#include "compiler/ir/op_schema.h"

#include <cctype>

namespace kiln::compiler {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits `s` at commas outside brackets and quotes; nullopt when they do not balance. The pieces
// are trimmed; an empty `s` has no piece.
std::optional<std::vector<std::string_view>> SplitTopLevel(std::string_view s) {
  std::vector<std::string_view> pieces;
  int depth = 0;
  char quote = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote != 0) {
      if (c == '\\') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
      continue;
    }
    if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '(' || c == '[') {
      ++depth;
    } else if (c == ')' || c == ']') {
      if (--depth < 0) return std::nullopt;
    } else if (c == ',' && depth == 0) {
      pieces.push_back(Trim(s.substr(start, i - start)));
      start = i + 1;
    }
  }
  if (depth != 0 || quote != 0) return std::nullopt;
  std::string_view last = Trim(s.substr(start));
  if (!last.empty() || !pieces.empty()) pieces.push_back(last);
  return pieces;
}

// The index of the ')' closing the '(' at `open`, or npos.
size_t Closing(std::string_view s, size_t open) {
  int depth = 0;
  char quote = 0;
  for (size_t i = open; i < s.size(); ++i) {
    const char c = s[i];
    if (quote != 0) {
      if (c == '\\') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
      continue;
    }
    if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '(' || c == '[') {
      ++depth;
    } else if (c == ')' || c == ']') {
      if (--depth == 0) return c == ')' ? i : std::string_view::npos;
    }
  }
  return std::string_view::npos;
}

// "Tensor(a!)[] self=None" -> type "Tensor[]", aliased and written, name "self".
std::optional<SchemaSlot> ParseSlot(std::string_view piece) {
  size_t end = 0;
  int depth = 0;
  for (; end < piece.size(); ++end) {
    const char c = piece[end];
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (depth == 0 && std::isspace(static_cast<unsigned char>(c))) break;
  }
  std::string_view raw = piece.substr(0, end);
  SchemaSlot slot;
  const size_t annotation = raw.find('(');
  if (annotation != std::string_view::npos) {
    const size_t close = raw.find(')', annotation);
    if (close == std::string_view::npos) return std::nullopt;
    slot.aliased = true;
    slot.written = raw.substr(annotation, close - annotation).find('!') != std::string_view::npos;
    slot.type = std::string(raw.substr(0, annotation)) + std::string(raw.substr(close + 1));
  } else {
    slot.type = std::string(raw);
  }
  if (slot.type.empty()) return std::nullopt;
  std::string_view rest = Trim(piece.substr(end));
  slot.name = std::string(Trim(rest.substr(0, rest.find('='))));
  return slot;
}

}  // namespace

std::optional<OpSchemaText> ParseOpSchema(std::string_view text) {
  text = Trim(text);
  const size_t open = text.find('(');
  if (open == std::string_view::npos || open == 0) return std::nullopt;
  const size_t close = Closing(text, open);
  if (close == std::string_view::npos) return std::nullopt;
  std::string_view after = Trim(text.substr(close + 1));
  if (after.substr(0, 2) != "->") return std::nullopt;
  OpSchemaText schema;
  schema.name = std::string(Trim(text.substr(0, open)));

  auto arguments = SplitTopLevel(text.substr(open + 1, close - open - 1));
  if (!arguments) return std::nullopt;
  bool keyword_only = false;
  for (std::string_view piece : *arguments) {
    if (piece == "*") {
      keyword_only = true;
      continue;
    }
    auto slot = ParseSlot(piece);
    if (!slot || slot->name.empty()) return std::nullopt;
    slot->keyword_only = keyword_only;
    schema.arguments.push_back(std::move(*slot));
  }

  std::string_view returns = Trim(after.substr(2));
  if (returns.empty()) return std::nullopt;
  std::vector<std::string_view> pieces{returns};
  if (returns.front() == '(') {  // a tuple, "()" included; "Tensor(a)" starts with its type
    if (Closing(returns, 0) != returns.size() - 1) return std::nullopt;
    auto split = SplitTopLevel(returns.substr(1, returns.size() - 2));
    if (!split) return std::nullopt;
    pieces = std::move(*split);
  }
  for (std::string_view piece : pieces) {
    auto slot = ParseSlot(piece);
    if (!slot) return std::nullopt;
    schema.returns.push_back(std::move(*slot));
  }
  return schema;
}

ResultKind ClassifyResult(std::string_view type) {
  if (type == "Tensor" || type == "Tensor?") return ResultKind::kTensor;
  if (type == "Tensor[]") return ResultKind::kTensorList;
  for (std::string_view number : {"int", "SymInt", "float", "SymFloat", "bool", "SymBool"}) {
    if (type == number) return ResultKind::kNumber;
  }
  return ResultKind::kOther;
}

}  // namespace kiln::compiler
