// GBNF parsing: accepted syntax (checked through the matcher on bytes) and clear errors.
#include <gtest/gtest.h>

#include "core/error.h"
#include "grammar/grammar.h"

using namespace pg::grammar;

namespace {

std::shared_ptr<const Vocab> byte_vocab() {
  std::vector<std::string> p;
  for (int b = 0; b < 256; ++b) p.push_back(std::string(1, static_cast<char>(b)));
  p.push_back("");  // an EOG token
  std::vector<bool> eog(p.size(), false);
  eog.back() = true;
  return Vocab::build(p, eog);
}

// Whole-string membership: all bytes accepted and the grammar may end.
bool matches(const std::string& gbnf, const std::string& s) {
  Matcher m(Grammar::parse(gbnf), byte_vocab());
  return m.accept_bytes(s) && m.can_end();
}

std::string parse_error(const std::string& gbnf) {
  try {
    Grammar::parse(gbnf);
  } catch (const pg::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Gbnf, LiteralsAlternationGroups) {
  const std::string g = "root ::= \"ab\" | \"c\" ( \"d\" | \"e\" ) # comment\n";
  EXPECT_TRUE(matches(g, "ab"));
  EXPECT_TRUE(matches(g, "cd"));
  EXPECT_TRUE(matches(g, "ce"));
  EXPECT_FALSE(matches(g, "c"));
  EXPECT_FALSE(matches(g, "abx"));
  EXPECT_FALSE(matches(g, ""));
}

TEST(Gbnf, Repetitions) {
  const std::string g = "root ::= \"a\"* \"b\"+ \"c\"? [x]{2} [y]{1,3} [z]{2,}\n";
  EXPECT_TRUE(matches(g, "bxxyzz"));
  EXPECT_TRUE(matches(g, "aaabbbcxxyyyzzzz"));
  EXPECT_FALSE(matches(g, "xxyzz"));      // b+ needs one
  EXPECT_FALSE(matches(g, "bxyzz"));      // {2}
  EXPECT_FALSE(matches(g, "bxxyyyyzz"));  // {1,3}
  EXPECT_FALSE(matches(g, "bxxyz"));      // {2,}
  // An operator after a multi-character literal repeats the whole literal.
  EXPECT_TRUE(matches("root ::= \"ab\"{2}\n", "abab"));
  EXPECT_FALSE(matches("root ::= \"ab\"{2}\n", "abb"));
  EXPECT_TRUE(matches("root ::= \"ab\" *\n", ""));
}

TEST(Gbnf, CharClassesAndEscapes) {
  EXPECT_TRUE(matches("root ::= [a-cx]+\n", "abxc"));
  EXPECT_FALSE(matches("root ::= [a-cx]+\n", "abd"));
  EXPECT_TRUE(matches("root ::= [^a]\n", "b"));
  EXPECT_FALSE(matches("root ::= [^a]\n", "a"));
  EXPECT_TRUE(matches("root ::= [^a]\n", "\xC3\xA9"));   // é: negation covers all of Unicode
  EXPECT_FALSE(matches("root ::= [^a]\n", "\xC3"));      // half a character
  EXPECT_TRUE(matches("root ::= [\\u00e0-\\u00ff]\n", "\xC3\xA9"));
  EXPECT_FALSE(matches("root ::= [\\u00e0-\\u00ff]\n", "\xC3\x9F"));  // ß U+00DF
  EXPECT_TRUE(matches("root ::= \"\\x41\\n\\t\\\"\\\\\"\n", "A\n\t\"\\"));
  EXPECT_TRUE(matches("root ::= [\\]\\-]+\n", "]-]"));
  EXPECT_TRUE(matches("root ::= .\n", "\xF0\x9F\x98\x80"));  // 4-byte UTF-8
  EXPECT_TRUE(matches("root ::= \"\\U0001F600\"\n", "\xF0\x9F\x98\x80"));
  EXPECT_TRUE(matches("root ::= [ä-ü]\n", "ö"));  // raw UTF-8 in the grammar
}

TEST(Gbnf, RulesRecursionAndLayout) {
  const std::string g =
      "root ::= list\n"
      "list ::= \"[\" ( item ( \",\" item )* )? \"]\"\n"
      "item ::= [0-9]+ | list\n";
  EXPECT_TRUE(matches(g, "[]"));
  EXPECT_TRUE(matches(g, "[1,[2,[]],33]"));
  EXPECT_FALSE(matches(g, "[1,]"));
  EXPECT_FALSE(matches(g, "[[1]"));
  // Multi-line rules: inside parentheses and when the next line starts with '|'.
  const std::string g2 = "root ::= (\n  \"a\"\n  | \"b\"\n)\n  | \"c\"\nother-rule_2 ::= \"x\"\n";
  EXPECT_TRUE(matches(g2, "a"));
  EXPECT_TRUE(matches(g2, "c"));
  EXPECT_FALSE(matches(g2, "x"));
  // Start rule choice.
  Matcher m(Grammar::parse(g2, {}, "other-rule_2"), byte_vocab());
  EXPECT_TRUE(m.accept_bytes("x") && m.can_end());
}

TEST(Gbnf, DeepRightRecursionRunsInConstantStack) {
  Matcher m(Grammar::parse("root ::= \"a\" root | \"\"\n"), byte_vocab());
  ASSERT_TRUE(m.accept_bytes(std::string(100000, 'a')));
  EXPECT_TRUE(m.can_end());
  EXPECT_EQ(m.n_stacks(), 2u);
}

TEST(Gbnf, ErrorsHavePositions) {
  EXPECT_EQ(parse_error("root ::= \"a\nb\"\n"), "grammar: newline in string literal at line 1 col 12");
  EXPECT_EQ(parse_error("root ::= foo\n"), "grammar: undefined rule 'foo' at line 1 col 10");
  EXPECT_EQ(parse_error("rot ::= \"a\"\n"), "grammar: no rule 'root'");
  EXPECT_EQ(parse_error("root = \"a\"\n"), "grammar: expected '::=' at line 1 col 6");
  EXPECT_EQ(parse_error("root ::= [a-\n"), "grammar: unterminated character class at line 1 col 10");
  EXPECT_EQ(parse_error("root ::= ( \"a\"\n"), "grammar: expected ')' at line 2 col 1");
  EXPECT_EQ(parse_error("root ::= * \"a\"\n"), "grammar: '*' with nothing to repeat at line 1 col 10");
  EXPECT_EQ(parse_error("root ::= \"a\"{3,2}\n"), "grammar: repetition {m,n} with n < m at line 1 col 13");
  EXPECT_EQ(parse_error("root ::= [z-a]\n"), "grammar: character range is reversed at line 1 col 14");
  EXPECT_EQ(parse_error("root ::= \"\\q\"\n"), "grammar: unknown escape '\\q' at line 1 col 11");
  EXPECT_EQ(parse_error("root ::= \"\\uD800\"\n"), "grammar: escape is not a Unicode scalar value at line 1 col 17");
  EXPECT_EQ(parse_error("root ::= \"a\"\nroot ::= \"b\"\n"), "grammar: rule 'root' defined twice at line 2 col 1");
  EXPECT_EQ(parse_error("root ::= root \"a\" | \"b\"\n"), "grammar: left recursion in rule 'root'");
  EXPECT_EQ(parse_error("root ::= x root\nx ::= \"\" | \"a\"\n"), "grammar: left recursion in rule 'root'");
  EXPECT_EQ(parse_error("root ::= \"a\"{99999}\n"), "grammar: repetition count over 10000 at line 1 col 14");
  EXPECT_EQ(parse_error("root ::= [^\\x00-\\U0010FFFF]\n"), "grammar: empty character class in rule 'root'");
  EXPECT_NE(parse_error("root ::= " + std::string(100, '(') + "\"a\"" + std::string(100, ')') + "\n").find("nested too deeply"), std::string::npos);
  Limits small;
  small.max_elements = 1000;
  try {
    Grammar::parse("root ::= [a-z]{0,5000}\n", small);
    ADD_FAILURE() << "expected an element-limit error";
  } catch (const pg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("over 1000 elements"), std::string::npos) << e.what();
  }
}

TEST(Gbnf, AmbiguityIsBounded) {
  // (a|a|a...)* style blow-up: the stack count is capped with a clear error.
  Limits lim;
  lim.max_stacks = 64;
  std::string g = "root ::= x*\nx ::= ";
  for (int i = 0; i < 100; ++i) g += std::string(i ? " | " : "") + "\"a\" [a-z]{" + std::to_string(i % 7) + "}";
  g += "\n";
  auto gr = Grammar::parse(g, lim);
  EXPECT_THROW(
      {
        Matcher m(gr, byte_vocab());
        m.accept_bytes("aaaa");
      },
      pg::Error);
}

TEST(Gbnf, LongRunsOfNullableRulesDoNotRecurse) {
  // 200 000 nullable references in one sequence: expansion walks them all before the first byte.
  std::string refs = "root ::=";
  for (int i = 0; i < 200000; ++i) refs += " n";
  refs += " \"z\"\n";
  Matcher m(Grammar::parse(refs + "n ::= \"\"\n"), byte_vocab());
  EXPECT_TRUE(m.accept_bytes("z"));
  EXPECT_TRUE(m.can_end());
  // With n ::= "a"? every position is a parse of its own: the stack bound answers, clearly.
  auto g = Grammar::parse(refs + "n ::= \"a\"?\n");
  try {
    Matcher m2(g, byte_vocab());
    ADD_FAILURE() << "expected the parallel-parse bound";
  } catch (const pg::Error& e) {
    EXPECT_EQ(std::string(e.what()), "grammar: too many parallel parses (over 4096); the grammar is too ambiguous");
  }
}
