// Python string semantics over UTF-8 text. Chat templates are rendered by Python's jinja2, so
// every string operation a template can reach (len, slicing, case mapping, split/strip, repr,
// float formatting, json.dumps) has to give the bytes CPython 3.11 gives. Indices and lengths
// are in code points, like Python's str; storage stays UTF-8.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pg::jinja::py {

// --- UTF-8 ------------------------------------------------------------------------------------
bool utf8_valid(std::string_view s);
void utf8_append(std::string& out, char32_t cp);
// Decodes valid UTF-8 (invalid bytes become U+FFFD; callers validate input at the boundary).
std::u32string decode(std::string_view s);
// Decodes the code point at byte i and advances i past it, exactly as decode() does (one U+FFFD per invalid byte).
char32_t decode_at(std::string_view s, size_t& i);
std::string encode(std::u32string_view s);
bool is_ascii(std::string_view s);
size_t cp_len(std::string_view s);
// Byte offset of code point index i (i <= cp_len(s)).
size_t cp_to_byte(std::string_view s, size_t i);

// --- substring search ----------------------------------------------------------------------------
// Like std::string_view::find(needle, from) / rfind(needle, last_start), but linear in the text even for adversarial
// needles ("aaa...ab" in "aaa...a" made std::string_view::find run for seconds on a 1 MB string).
size_t find_bytes(std::string_view hay, std::string_view needle, size_t from = 0);
size_t rfind_bytes(std::string_view hay, std::string_view needle, size_t last_start);

// --- character classes (CPython's unicodedata 14.0) ---------------------------------------------
bool is_space(char32_t c);
bool is_printable(char32_t c);
bool is_word(char32_t c);  // regex \w
bool is_alpha(char32_t c);
bool is_decimal(char32_t c);
bool is_digit(char32_t c);
bool is_numeric(char32_t c);
bool is_upper(char32_t c);
bool is_lower(char32_t c);
bool is_cased(char32_t c);

// --- str methods ------------------------------------------------------------------------------
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);       // str.title()
std::string capitalize(std::string_view s);  // str.capitalize()
std::string swapcase(std::string_view s);
std::string upper_first_lower_rest(std::string_view s);  // item[0].upper() + item[1:].lower()
bool str_isupper(std::string_view s);
bool str_islower(std::string_view s);
bool str_istitle(std::string_view s);
// Applies a per-character predicate the way str.isalpha() & co do (false for "").
bool str_all(std::string_view s, bool (*pred)(char32_t));
bool str_isspace(std::string_view s);
bool str_isalnum(std::string_view s);

enum class StripSide { kBoth, kLeft, kRight };
// chars == nullopt strips whitespace (str.isspace), otherwise any code point of chars.
std::string strip(std::string_view s, const std::optional<std::string_view>& chars, StripSide side);
// str.split / str.rsplit. sep == nullopt splits on whitespace runs. maxsplit < 0: no limit.
// Throws pg::jinja errors for an empty separator (Python: ValueError).
std::vector<std::string> split(std::string_view s, const std::optional<std::string_view>& sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string_view>& sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);
// str.find/rfind/count on code point indices [start, end) after Python's slice normalisation.
int64_t find(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end, bool reverse);
int64_t count(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end);
std::string pad(std::string_view s, int64_t width, char32_t fill, char align);  // align: '<' '>' '^'
std::string zfill(std::string_view s, int64_t width);
std::string escape_html(std::string_view s);  // markupsafe.escape

// --- repr / numbers -----------------------------------------------------------------------------
std::string repr(std::string_view s);        // repr(str), quotes chosen like CPython
std::string ascii_repr(std::string_view s);  // ascii(str)
std::string float_repr(double v);            // repr(float): shortest round-trip, CPython layout
std::string int_repr(int64_t v);
// float.__format__ / '%' formatting of one number with a printf conversion ('e','f','g','E','F','G').
std::string format_float(double v, char conv, int precision, bool alt);
// Python's round(x, ndigits) for floats (correctly rounded, half to even on the exact value).
double round_float(double v, int64_t ndigits);
// Parses like int(str, base) / float(str); nullopt where Python raises ValueError.
std::optional<int64_t> parse_int(std::string_view s, int base);
std::optional<double> parse_float(std::string_view s);

// json.dumps string escaping (the quotes included).
void json_quote(std::string& out, std::string_view s, bool ensure_ascii);

}  // namespace pg::jinja::py
