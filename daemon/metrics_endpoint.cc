// MetricsEndpoint: prometheus-cpp's Exposer (civetweb), its exceptions turned into a Status, and
// a stop that does not wait out civetweb's accept loop.
#include "daemon/metrics_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <prometheus/exposer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kiln::daemon {
namespace {

// Opens and closes one connection to the listener at `ip`:`port`, which wakes its accept loop.
void Knock(in_addr ip, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr = ip;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  [[maybe_unused]] int ignored = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::close(fd);
}

}  // namespace

MetricsEndpoint::MetricsEndpoint(std::shared_ptr<prometheus::Collectable> metrics,
                                 std::unique_ptr<prometheus::Exposer> exposer, in_addr ip, int port)
    : metrics_(std::move(metrics)), exposer_(std::move(exposer)), ip_(ip), port_(port) {}

MetricsEndpoint::~MetricsEndpoint() {
  // civetweb's accept loop polls with a 2 s timeout and reads its stop flag only between polls:
  // knocking until the server has stopped makes a daemon's shutdown milliseconds, not seconds.
  // A knock that arrives before the flag is read is served as an empty request and closed.
  std::atomic<bool> stopped{false};
  std::thread knocker([this, &stopped] {
    while (!stopped.load()) {
      Knock(ip_, port_);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  exposer_.reset();
  stopped = true;
  knocker.join();
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address, std::shared_ptr<prometheus::Collectable> metrics) {
  in_addr ip{};
  const std::string host = address.substr(0, address.rfind(':'));
  if (::inet_pton(AF_INET, host.c_str(), &ip) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address ", address, " is not IPV4:PORT"));
  }
  // Listening on every interface: knock on loopback.
  if (ip.s_addr == htonl(INADDR_ANY)) ip.s_addr = htonl(INADDR_LOOPBACK);
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // Two threads, so that a scraper that stalls does not hold up the next scrape; a client
    // that sends nothing is dropped after the timeout instead of keeping a thread.
    exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", address, "num_threads", "2", "request_timeout_ms", "10000"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address,
                     " (in use, or not an address of this machine): ", e.what()));
  }
  std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.size() != 1) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address));
  }
  exposer->RegisterCollectable(metrics);
  return std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(std::move(metrics), std::move(exposer), ip, ports[0]));
}

}  // namespace kiln::daemon
