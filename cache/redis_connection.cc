// RedisConnection: non-blocking sockets and OpenSSL under poll(), and a RESP2 reply parser.
#include "cache/redis_connection.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kiln::cache {
namespace {

using Clock = RedisConnection::Clock;

constexpr int64_t kMaxBulkBytes = int64_t{1} << 30;  // above Redis's own 512 MiB limit
constexpr int kMaxDepth = 8;                         // GET/SET/PING/AUTH replies are flat

// Debian's abseil has its own string_view, which std::string_view does not convert to.
absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::string SslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown TLS error" : out;
}

absl::Status ErrnoError(std::string_view what) {
  return absl::UnavailableError(absl::StrCat(Absl(what), ": ", std::strerror(errno)));
}

enum class Parse { kOk, kIncomplete, kBad };

// Parses one reply starting at data[*pos]; on kOk, *pos is past it.
Parse ParseReply(std::string_view data, size_t* pos, RedisReply* out, int depth) {
  if (depth > kMaxDepth) return Parse::kBad;
  size_t eol = data.find("\r\n", *pos);
  if (eol == std::string_view::npos) return Parse::kIncomplete;
  if (eol == *pos) return Parse::kBad;
  const char type = data[*pos];
  std::string_view line = data.substr(*pos + 1, eol - *pos - 1);
  size_t next = eol + 2;
  switch (type) {
    case '+':
    case '-':
      out->type = type == '+' ? RedisReply::Type::kStatus : RedisReply::Type::kError;
      out->str = std::string(line);
      break;
    case ':':
      out->type = RedisReply::Type::kInteger;
      if (!absl::SimpleAtoi(Absl(line), &out->integer)) return Parse::kBad;
      break;
    case '$': {
      int64_t length = 0;
      if (!absl::SimpleAtoi(Absl(line), &length) || length < -1 || length > kMaxBulkBytes) {
        return Parse::kBad;
      }
      if (length == -1) {
        out->type = RedisReply::Type::kNil;
        break;
      }
      if (data.size() < next + static_cast<size_t>(length) + 2) return Parse::kIncomplete;
      if (data.substr(next + length, 2) != "\r\n") return Parse::kBad;
      out->type = RedisReply::Type::kString;
      out->str = std::string(data.substr(next, length));
      next += length + 2;
      break;
    }
    case '*': {
      int64_t count = 0;
      if (!absl::SimpleAtoi(Absl(line), &count) || count < -1 || count > (1 << 20))
        return Parse::kBad;
      if (count == -1) {
        out->type = RedisReply::Type::kNil;
        break;
      }
      out->type = RedisReply::Type::kArray;
      out->elements.resize(count);
      for (RedisReply& element : out->elements) {
        Parse p = ParseReply(data, &next, &element, depth + 1);
        if (p != Parse::kOk) return p;
      }
      break;
    }
    default:
      return Parse::kBad;
  }
  *pos = next;
  return Parse::kOk;
}

// A socket connecting (non-blocking) to one address; the connect may still be in progress.
absl::StatusOr<int> StartConnect(const sockaddr* addr, socklen_t len, int family) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoError("socket");
  if (::connect(fd, addr, len) != 0 && errno != EINPROGRESS) {
    absl::Status s = ErrnoError("connect");
    ::close(fd);
    return s;
  }
  if (family != AF_UNIX) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

}  // namespace

std::string RedisEndpoint::Describe() const {
  if (!unix_path.empty()) return absl::StrCat("unix:", unix_path);
  return absl::StrCat(tls ? "tls://" : "", host, ":", port);
}

absl::Status ParseRedisAddress(std::string_view address, RedisEndpoint* endpoint) {
  if (address.rfind("unix:", 0) == 0 && address.size() > 5) {
    endpoint->unix_path = std::string(address.substr(5));
    return absl::OkStatus();
  }
  size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(Absl(address.substr(colon + 1)), &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--redis takes HOST:PORT or unix:PATH, not '", Absl(address), "'"));
  }
  std::string_view host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);  // [::1]:6379
  }
  endpoint->host = std::string(host);
  endpoint->port = port;
  endpoint->unix_path.clear();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RedisTls>> RedisTls::Create(const RedisEndpoint& endpoint) {
  SSL_CTX* context = SSL_CTX_new(TLS_client_method());
  if (context == nullptr) return absl::InternalError(SslErrors());
  std::unique_ptr<RedisTls> tls(new RedisTls(context));
  SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION);
  SSL_CTX_set_verify(context, SSL_VERIFY_PEER, nullptr);
  const bool loaded =
      endpoint.tls_ca_file.empty()
          ? SSL_CTX_set_default_verify_paths(context) == 1
          : SSL_CTX_load_verify_locations(context, endpoint.tls_ca_file.c_str(), nullptr) == 1;
  if (!loaded) {
    return absl::InvalidArgumentError(
        absl::StrCat("--redis-tls-ca ", endpoint.tls_ca_file, ": ", SslErrors()));
  }
  if (!endpoint.tls_cert_file.empty() || !endpoint.tls_key_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(context, endpoint.tls_cert_file.c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(context, endpoint.tls_key_file.c_str(), SSL_FILETYPE_PEM) !=
            1 ||
        SSL_CTX_check_private_key(context) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--redis-tls-cert/--redis-tls-key: ", SslErrors()));
    }
  }
  return tls;
}

RedisTls::~RedisTls() { SSL_CTX_free(context_); }

absl::StatusOr<std::unique_ptr<RedisConnection>> RedisConnection::Connect(
    const RedisEndpoint& endpoint, const RedisTls* tls, std::chrono::milliseconds io_timeout,
    Clock::time_point deadline) {
  if (endpoint.tls && tls == nullptr) {
    return absl::InvalidArgumentError("TLS endpoint without TLS settings");
  }
  absl::StatusOr<int> fd = absl::UnavailableError("no address");
  if (!endpoint.unix_path.empty()) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (endpoint.unix_path.size() >= sizeof(addr.sun_path)) {
      return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", endpoint.unix_path));
    }
    std::memcpy(addr.sun_path, endpoint.unix_path.data(), endpoint.unix_path.size());
    fd = StartConnect(reinterpret_cast<sockaddr*>(&addr), sizeof(addr), AF_UNIX);
  } else {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(endpoint.port);
    if (int rc = ::getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot resolve ", endpoint.host, ": ", gai_strerror(rc)));
    }
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      fd = StartConnect(a->ai_addr, a->ai_addrlen, a->ai_family);
      if (fd.ok()) break;
    }
    ::freeaddrinfo(found);
  }
  if (!fd.ok()) {
    return absl::UnavailableError(
        absl::StrCat("redis ", endpoint.Describe(), ": ", fd.status().message()));
  }
  std::unique_ptr<RedisConnection> connection(new RedisConnection(*fd, io_timeout));
  auto fail = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("redis ", endpoint.Describe(), ": ", s.message()));
  };
  if (absl::Status s = connection->Wait(/*write=*/true, deadline); !s.ok()) return fail(s);
  int error = 0;
  socklen_t len = sizeof(error);
  ::getsockopt(*fd, SOL_SOCKET, SO_ERROR, &error, &len);
  if (error != 0) {
    return fail(absl::UnavailableError(absl::StrCat("connect: ", std::strerror(error))));
  }
  if (endpoint.tls) {
    const std::string& name =
        endpoint.tls_server_name.empty() ? endpoint.host : endpoint.tls_server_name;
    if (absl::Status s = connection->Handshake(*tls, name, deadline); !s.ok()) return fail(s);
  }
  if (!endpoint.password.empty()) {
    std::vector<std::string_view> auth = {"AUTH"};
    if (!endpoint.user.empty()) auth.push_back(endpoint.user);
    auth.push_back(endpoint.password);
    absl::StatusOr<RedisReply> reply = connection->Command(auth, deadline);
    if (!reply.ok()) return fail(reply.status());
    if (reply->type != RedisReply::Type::kStatus) {
      return fail(absl::PermissionDeniedError(absl::StrCat("AUTH refused: ", reply->str)));
    }
  }
  return connection;
}

RedisConnection::~RedisConnection() {
  if (ssl_ != nullptr) SSL_free(ssl_);  // no close_notify: the peer may be the reason we leave
  ::close(fd_);
}

absl::Status RedisConnection::Wait(bool write, Clock::time_point deadline) {
  for (;;) {
    const auto now = Clock::now();
    if (now >= deadline) return absl::DeadlineExceededError("deadline passed");
    const auto wait = std::min<Clock::duration>(io_timeout_, deadline - now);
    pollfd p{fd_, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    const int ms = static_cast<int>(
        std::max<int64_t>(1, std::chrono::ceil<std::chrono::milliseconds>(wait).count()));
    int rc = ::poll(&p, 1, ms);
    if (rc > 0) return absl::OkStatus();  // errors and hang-ups show in the next read or write
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return ErrnoError("poll");
    if (Clock::now() >= deadline) return absl::DeadlineExceededError("deadline passed");
    return absl::DeadlineExceededError(
        absl::StrCat("no answer within ", io_timeout_.count(), " ms"));
  }
}

absl::Status RedisConnection::Handshake(const RedisTls& tls, const std::string& server_name,
                                        Clock::time_point deadline) {
  ssl_ = SSL_new(tls.context());
  if (ssl_ == nullptr) return absl::InternalError(SslErrors());
  SSL_set_fd(ssl_, fd_);
  in6_addr ip6;
  in_addr ip4;
  const bool is_ip = ::inet_pton(AF_INET, server_name.c_str(), &ip4) == 1 ||
                     ::inet_pton(AF_INET6, server_name.c_str(), &ip6) == 1;
  if (is_ip) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), server_name.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl_, server_name.c_str());
    SSL_set1_host(ssl_, server_name.c_str());
  }
  for (;;) {
    ERR_clear_error();
    int rc = SSL_connect(ssl_);
    if (rc == 1) return absl::OkStatus();
    int error = SSL_get_error(ssl_, rc);
    if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
      if (absl::Status s = Wait(error == SSL_ERROR_WANT_WRITE, deadline); !s.ok()) return s;
      continue;
    }
    const long verify = SSL_get_verify_result(ssl_);
    return absl::UnavailableError(absl::StrCat(
        "TLS handshake failed: ", SslErrors(),
        verify != X509_V_OK
            ? absl::StrCat(" (certificate: ", X509_verify_cert_error_string(verify), ")")
            : ""));
  }
}

absl::Status RedisConnection::WriteAll(std::string_view data, Clock::time_point deadline) {
  while (!data.empty()) {
    if (ssl_ != nullptr) {
      ERR_clear_error();
      const int chunk = static_cast<int>(std::min<size_t>(data.size(), 1 << 20));
      int n = SSL_write(ssl_, data.data(), chunk);
      if (n > 0) {
        data.remove_prefix(n);
        continue;
      }
      int error = SSL_get_error(ssl_, n);
      if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) {
        return absl::UnavailableError(absl::StrCat("TLS write: ", SslErrors()));
      }
      if (absl::Status s = Wait(error == SSL_ERROR_WANT_WRITE, deadline); !s.ok()) return s;
      continue;
    }
    ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (absl::Status s = Wait(/*write=*/true, deadline); !s.ok()) return s;
      continue;
    }
    return ErrnoError("send");
  }
  return absl::OkStatus();
}

absl::Status RedisConnection::ReadSome(Clock::time_point deadline) {
  char buf[64 << 10];
  for (;;) {
    if (ssl_ != nullptr) {
      ERR_clear_error();
      int n = SSL_read(ssl_, buf, sizeof(buf));
      if (n > 0) {
        buffer_.append(buf, n);
        return absl::OkStatus();
      }
      int error = SSL_get_error(ssl_, n);
      if (error == SSL_ERROR_ZERO_RETURN) {
        return absl::UnavailableError("redis closed the connection");
      }
      if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) {
        return absl::UnavailableError(absl::StrCat("TLS read: ", SslErrors()));
      }
      if (absl::Status s = Wait(error == SSL_ERROR_WANT_WRITE, deadline); !s.ok()) return s;
      continue;
    }
    ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n > 0) {
      buffer_.append(buf, n);
      return absl::OkStatus();
    }
    if (n == 0) return absl::UnavailableError("redis closed the connection");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return ErrnoError("recv");
    if (absl::Status s = Wait(/*write=*/false, deadline); !s.ok()) return s;
  }
}

absl::StatusOr<RedisReply> RedisConnection::Command(const std::vector<std::string_view>& args,
                                                    Clock::time_point deadline) {
  std::string request = absl::StrCat("*", args.size(), "\r\n");
  for (std::string_view arg : args) {
    absl::StrAppend(&request, "$", arg.size(), "\r\n", Absl(arg), "\r\n");
  }
  if (absl::Status s = WriteAll(request, deadline); !s.ok()) return s;
  for (;;) {
    size_t pos = 0;
    RedisReply reply;
    switch (ParseReply(buffer_, &pos, &reply, 0)) {
      case Parse::kOk:
        buffer_.erase(0, pos);
        return reply;
      case Parse::kBad:
        return absl::UnavailableError("malformed reply from redis");
      case Parse::kIncomplete:
        break;
    }
    if (absl::Status s = ReadSome(deadline); !s.ok()) return s;
  }
}

}  // namespace kiln::cache
