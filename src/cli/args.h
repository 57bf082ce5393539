// A small declarative flag parser shared by every subcommand, so each prints the same style of
// --help and the same one-line errors for unknown flags and bad values.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace pg::cli {

class Args {
 public:
  Args(std::string command, std::string summary);

  // Declare flags. names: "-m,--model". A flag without a value is a switch.
  Args& opt(const std::string& names, std::string* out, const std::string& help, const std::string& meta = "TEXT");
  Args& opt(const std::string& names, int* out, const std::string& help);
  Args& opt(const std::string& names, int64_t* out, const std::string& help);
  Args& opt(const std::string& names, double* out, const std::string& help);
  Args& opt(const std::string& names, float* out, const std::string& help);
  Args& opt(const std::string& names, std::optional<std::string>* out, const std::string& help, const std::string& meta = "TEXT");
  Args& opt(const std::string& names, std::vector<std::string>* out, const std::string& help, const std::string& meta = "TEXT");
  Args& flag(const std::string& names, bool* out, const std::string& help);
  // Positional arguments, in order.
  Args& positional(const std::string& name, std::string* out, const std::string& help, bool required = true);
  Args& footer(const std::string& text);

  // Parses argv[first..]. Returns false when --help was printed (caller exits 0).
  // Throws pg::Error on unknown flags, missing values, bad numbers, missing required positionals.
  bool parse(int argc, char** argv, int first = 1);
  // Flags the user actually gave (long name without dashes).
  bool given(const std::string& long_name) const;
  std::string help() const;

 private:
  struct Opt {
    std::vector<std::string> names;
    std::string meta, help;
    bool takes_value;
    std::function<void(const std::string&)> set;
    std::string default_text;
  };
  struct Pos {
    std::string name, help;
    std::string* out;
    bool required;
  };
  Args& add(const std::string& names, bool takes_value, const std::string& meta, const std::string& help,
            std::function<void(const std::string&)> set, std::string default_text);
  std::string command_, summary_, footer_;
  std::vector<Opt> opts_;
  std::vector<Pos> pos_;
  std::vector<std::string> given_;
};

// Parses "1,2,3" into ints; throws pg::Error naming the bad item.
std::vector<int32_t> parse_id_list(const std::string& s);

}  // namespace pg::cli
