#include "testutil.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <random>
#include <cstring>
#include <stdexcept>

namespace pg::test {

std::filesystem::path shared_dir() {
  const char* env = std::getenv("PEREGRINE_SHARED");
  std::filesystem::path p = env && *env ? std::filesystem::path(env) : std::filesystem::path(PEREGRINE_SHARED_DIR);
  if (!std::filesystem::is_directory(p / "golden")) {
    ADD_FAILURE() << "shared test data not found at " << p << " (set PEREGRINE_SHARED); refusing to skip";
    throw std::runtime_error("shared test data missing");
  }
  return p;
}

std::filesystem::path shared_path(const std::string& rel) {
  auto p = shared_dir() / rel;
  if (!std::filesystem::exists(p)) {
    ADD_FAILURE() << "missing shared test file " << p;
    throw std::runtime_error("missing shared file " + p.string());
  }
  return p;
}

std::vector<uint8_t> read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + p.string());
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::string read_text(const std::filesystem::path& p) {
  auto b = read_bytes(p);
  return std::string(b.begin(), b.end());
}

std::vector<float> read_f32(const std::filesystem::path& p) {
  auto b = read_bytes(p);
  if (b.size() % 4) throw std::runtime_error(p.string() + " is not a float32 file");
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

TempDir::TempDir() {
  std::random_device rd;
  auto base = std::filesystem::temp_directory_path();
  for (;;) {
    path_ = base / ("peregrine-test-" + std::to_string(rd()));
    if (std::filesystem::create_directory(path_)) break;
  }
}
TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::filesystem::path peregrine_exe() {
  auto p = std::filesystem::path(PEREGRINE_BINARY_DIR) / "src" / "cli" / "peregrine";
  if (!std::filesystem::exists(p)) {
    ADD_FAILURE() << "peregrine executable not built at " << p;
    throw std::runtime_error("no peregrine executable");
  }
  return p;
}

CommandResult run_command(const std::vector<std::string>& argv, const std::string& stdin_data, int timeout_s) {
  int in_pipe[2], out_pipe[2], err_pipe[2];
  if (pipe(in_pipe) || pipe(out_pipe) || pipe(err_pipe)) throw std::runtime_error("pipe failed");
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    dup2(in_pipe[0], 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    close(in_pipe[1]);
    close(out_pipe[0]);
    close(err_pipe[0]);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(in_pipe[0]);
  close(out_pipe[1]);
  close(err_pipe[1]);
  signal(SIGPIPE, SIG_IGN);
  size_t written = 0;
  if (stdin_data.empty()) close(in_pipe[1]);
  CommandResult r{-1, "", ""};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  bool out_open = true, err_open = true, in_open = !stdin_data.empty();
  while (out_open || err_open) {
    std::vector<pollfd> fds;
    if (out_open) fds.push_back({out_pipe[0], POLLIN, 0});
    if (err_open) fds.push_back({err_pipe[0], POLLIN, 0});
    if (in_open) fds.push_back({in_pipe[1], POLLOUT, 0});
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    if (left <= 0) {
      kill(pid, SIGKILL);
      r.err += "\n[test harness: killed after timeout]";
      break;
    }
    poll(fds.data(), fds.size(), left);
    for (auto& f : fds) {
      if (!f.revents) continue;
      if (f.fd == in_pipe[1]) {
        ssize_t n = write(in_pipe[1], stdin_data.data() + written, stdin_data.size() - written);
        if (n > 0) written += static_cast<size_t>(n);
        if (n <= 0 || written == stdin_data.size()) {
          close(in_pipe[1]);
          in_open = false;
        }
        continue;
      }
      char buf[65536];
      ssize_t n = read(f.fd, buf, sizeof buf);
      if (n <= 0) {
        (f.fd == out_pipe[0] ? out_open : err_open) = false;
      } else {
        (f.fd == out_pipe[0] ? r.out : r.err).append(buf, static_cast<size_t>(n));
      }
    }
  }
  if (in_open) close(in_pipe[1]);
  close(out_pipe[0]);
  close(err_pipe[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace pg::test
