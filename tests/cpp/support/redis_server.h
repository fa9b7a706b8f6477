// A real redis-server on a free loopback port, started for one test and stopped after it.
#pragma once

#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/cpp/support/wait_for.h"

namespace kiln::testing {

// The path of redis-server, or "" when it is not installed.
inline std::string FindRedisServer() {
  for (const char* path : {"/usr/bin/redis-server", "/usr/local/bin/redis-server"}) {
    if (::access(path, X_OK) == 0) return path;
  }
  return "";
}

// A port nothing listens on now (the kernel's choice for an ephemeral bind).
inline int FreeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// TLS files for a server that also listens with TLS (on tls_port()).
struct RedisTlsFiles {
  std::string cert;
  std::string key;
};

class RedisServer {
 public:
  // Starts redis-server with no persistence in `dir` on `port` (0: a free one), with
  // `extra_args` (--requirepass, ...), and a TLS port too when `tls` is given; ok() tells
  // whether it answers on its plain port.
  explicit RedisServer(const std::string& dir, int port = 0,
                       std::vector<std::string> extra_args = {},
                       const RedisTlsFiles* tls = nullptr) {
    std::string binary = FindRedisServer();
    if (binary.empty()) return;
    for (int attempt = 0; attempt < 3 && !ok_; ++attempt) {
      port_ = port != 0 ? port : FreeLoopbackPort();
      std::vector<std::string> args = {binary,
                                       "--port",
                                       std::to_string(port_),
                                       "--bind",
                                       "127.0.0.1",
                                       "--save",
                                       "",
                                       "--appendonly",
                                       "no",
                                       "--dir",
                                       dir,
                                       "--loglevel",
                                       "warning"};
      if (tls != nullptr) {
        tls_port_ = FreeLoopbackPort();
        for (std::string a :
             {std::string("--tls-port"), std::to_string(tls_port_), std::string("--tls-cert-file"),
              tls->cert, std::string("--tls-key-file"), tls->key, std::string("--tls-ca-cert-file"),
              tls->cert, std::string("--tls-auth-clients"), std::string("no")}) {
          args.push_back(a);
        }
      }
      args.insert(args.end(), extra_args.begin(), extra_args.end());
      pid_ = ::fork();
      if (pid_ == 0) {
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        ::execv(binary.c_str(), argv.data());
        ::_exit(127);
      }
      ok_ = WaitFor([this] { return Ping() || Exited(); }, std::chrono::seconds(10)) && Ping();
      if (!ok_) Stop();
    }
  }
  ~RedisServer() { Stop(); }

  bool ok() const { return ok_; }
  int port() const { return port_; }
  int tls_port() const { return tls_port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // SIGSTOP / SIGCONT: a server that hangs and comes back.
  void Signal(int signal) const {
    if (pid_ > 0) ::kill(pid_, signal);
  }

  // Runs one command with binary-safe arguments ("%b"); returns the reply (caller frees).
  redisContext* Connect() const {
    timeval tv{2, 0};
    return redisConnectWithTimeout("127.0.0.1", port_, tv);
  }

 private:
  // Up when it answers at all (a server with a password answers NOAUTH).
  bool Ping() const {
    redisContext* c = Connect();
    bool up = false;
    if (c != nullptr && c->err == 0) {
      auto* reply = static_cast<redisReply*>(redisCommand(c, "PING"));
      up = reply != nullptr &&
           (reply->type == REDIS_REPLY_STATUS || reply->type == REDIS_REPLY_ERROR);
      if (reply != nullptr) freeReplyObject(reply);
    }
    if (c != nullptr) redisFree(c);
    return up;
  }
  bool Exited() {
    int status = 0;
    if (pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return true;
    }
    return false;
  }
  void Stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    ok_ = false;
  }

  pid_t pid_ = -1;
  int port_ = 0;
  int tls_port_ = 0;
  bool ok_ = false;
};

}  // namespace kiln::testing
