#include "python_fork_server.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace trainyard::testing {

namespace fs = std::filesystem;

PythonForkServer::PythonForkServer(fs::path python, fs::path script)
    : python_(std::move(python)), script_(std::move(script)) {}

PythonForkServer::~PythonForkServer() { stop(false); }

void PythonForkServer::start() {
  int to_server[2], from_server[2];
  if (::pipe(to_server) != 0 || ::pipe(from_server) != 0) throw std::runtime_error("pipe failed");
  const std::string server = (source_dir() / "tools" / "parity" / "fork_server.py").string();
  const std::string log = (scratch_.path() / "server.err").string();
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(to_server[0], 0);
    ::dup2(from_server[1], 1);
    int err = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err >= 0) ::dup2(err, 2);
    ::close(to_server[1]);
    ::close(from_server[0]);
    const std::string python = python_.string();
    const std::string script = script_.string();
    char* args[] = {const_cast<char*>(python.c_str()), const_cast<char*>(server.c_str()),
                    const_cast<char*>(script.c_str()), nullptr};
    ::execv(args[0], args);
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  ::close(to_server[0]);
  ::close(from_server[1]);
  // A server that died must not take the test down with SIGPIPE on the next request.
  ::signal(SIGPIPE, SIG_IGN);
  pid_ = pid;
  requests_ = to_server[1];
  replies_ = from_server[0];
  pending_.clear();
}

void PythonForkServer::stop(bool kill) {
  if (pid_ < 0) return;
  ::close(requests_);  // end of stdin: the server's loop ends
  if (kill) ::kill(-pid_, SIGKILL);
  ::close(replies_);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = requests_ = replies_ = -1;
}

CommandResult PythonForkServer::run(const std::vector<std::string>& args, int timeout_s) {
  if (pid_ < 0) start();
  const std::string stem = "call" + std::to_string(calls_++);
  const fs::path out = scratch_ / (stem + ".out");
  const fs::path err = scratch_ / (stem + ".err");
  const std::string request =
      nlohmann::json{{"args", args}, {"out", out.string()}, {"err", err.string()}}.dump() + "\n";
  CommandResult result;
  const auto server_failed = [&](const std::string& what) {
    stop(true);
    result.exit_code = -1;
    result.err = "fork server: " + what + "\n" + read_text(scratch_ / "server.err");
    return result;
  };
  if (::write(requests_, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    return server_failed("could not send the request");
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  std::size_t end_of_line;
  while ((end_of_line = pending_.find('\n')) == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      stop(true);
      result.timed_out = true;
      result.out = fs::exists(out) ? read_text(out) : "";
      result.err = fs::exists(err) ? read_text(err) : "";
      return result;
    }
    pollfd ready = {replies_, POLLIN, 0};
    if (::poll(&ready, 1, static_cast<int>(std::min<long long>(left, 1000))) < 0) {
      return server_failed("poll failed");
    }
    if (!(ready.revents & (POLLIN | POLLHUP | POLLERR))) continue;
    char buffer[4096];
    const ssize_t got = ::read(replies_, buffer, sizeof buffer);
    if (got <= 0) return server_failed("the server ended");
    pending_.append(buffer, static_cast<std::size_t>(got));
  }
  const auto reply = nlohmann::json::parse(pending_.substr(0, end_of_line));
  pending_.erase(0, end_of_line + 1);
  const int status = reply.at("exit").get<int>();
  result.exit_code = status >= 0 ? status : -1;
  result.out = read_text(out);
  result.err = read_text(err);
  fs::remove(out);
  fs::remove(err);
  return result;
}

}  // namespace trainyard::testing
