// Tokenizer with jinja2's exact whitespace rules for the environment HF uses: trim_blocks,
// lstrip_blocks, "-"/"+" modifiers on tags, newline normalisation, and the dropped trailing newline.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pg::jinja {

enum class Tok : uint8_t {
  kData,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInteger,
  kFloat,
  // operators
  kAdd,
  kSub,
  kDiv,
  kFloorDiv,
  kMul,
  kMod,
  kPow,
  kTilde,
  kLBracket,
  kRBracket,
  kLParen,
  kRParen,
  kLBrace,
  kRBrace,
  kEq,
  kNe,
  kGt,
  kGe,
  kLt,
  kLe,
  kAssign,
  kDot,
  kColon,
  kPipe,
  kComma,
  kSemicolon,
  kEof,
};

struct Token {
  Tok type;
  int line;
  std::string text;  // data, name, or decoded string literal
  int64_t ival = 0;
  double fval = 0;
};

const char* describe(Tok t);
std::string describe(const Token& t);

// Throws pg::jinja::Error (kSyntax) on malformed tags.
std::vector<Token> tokenize(std::string_view source);

}  // namespace pg::jinja
