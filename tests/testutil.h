// Shared helpers for tests: where the shared data lives, reading raw files, temp dirs.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace pg::test {

// Root of ../shared (or $PEREGRINE_SHARED). Fails the test (ADD_FAILURE + throw) when it is missing.
std::filesystem::path shared_dir();
// shared_dir()/rel, asserting the file or directory exists.
std::filesystem::path shared_path(const std::string& rel);

std::vector<uint8_t> read_bytes(const std::filesystem::path& p);
std::string read_text(const std::filesystem::path& p);
std::vector<float> read_f32(const std::filesystem::path& p);

// A fresh temporary directory, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Path of the built peregrine executable (for CLI tests).
std::filesystem::path peregrine_exe();

struct CommandResult {
  int exit_code;
  std::string out;
  std::string err;
};
// Runs argv (no shell) with optional stdin; captures stdout/stderr; kills after timeout_s.
CommandResult run_command(const std::vector<std::string>& argv, const std::string& stdin_data = "", int timeout_s = 120);

}  // namespace pg::test
