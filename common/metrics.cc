#include "common/metrics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <prometheus/text_serializer.h>

namespace difftrain {
namespace {

constexpr size_t kMaxRequestBytes = 8192;
constexpr int kClientTimeoutMs = 5000;

// Writes all of `data`, or gives up when the client is gone or stalls past the timeout.
void WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      return;
    }
  }
}

std::string Response(const char* status, const std::string& content_type, const std::string& body) {
  return fmt::format(
      "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
      status, content_type, body.size(), body);
}

}  // namespace

const std::vector<double>& StepSecondsBuckets() {
  static const std::vector<double> kBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                               2.5,   5,    10,    30,   60,  120,  300};
  return kBuckets;
}

void AdvanceCounter(prometheus::Counter& counter, double total) {
  const double delta = total - counter.Value();
  if (delta > 0) counter.Increment(delta);
}

std::string SerializeMetrics(const prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

Result<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    int port, std::shared_ptr<prometheus::Registry> registry) {
  if (port < 1 || port > 65535) return Errorf("metrics port {} is not in [1, 65535]", port);
  std::unique_ptr<MetricsEndpoint> e(new MetricsEndpoint());
  e->registry_ = std::move(registry);
  e->port_ = port;
  e->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (e->listen_fd_ < 0) return Errorf("metrics: socket: {}", std::strerror(errno));
  const int on = 1;
  ::setsockopt(e->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(e->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(e->listen_fd_, 16) != 0) {
    return Errorf("serving metrics on port {}: {}", port, std::strerror(errno));
  }
  if (::pipe2(e->wake_fds_, O_CLOEXEC) != 0) {
    return Errorf("metrics: pipe: {}", std::strerror(errno));
  }
  e->thread_ = std::thread([endpoint = e.get()] { endpoint->Serve(); });
  return e;
}

MetricsEndpoint::~MetricsEndpoint() {
  if (thread_.joinable()) {
    (void)!::write(wake_fds_[1], "x", 1);
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_fds_[0], wake_fds_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void MetricsEndpoint::Serve() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fds_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int connection = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;
    Answer(connection);
    ::close(connection);
  }
}

void MetricsEndpoint::Answer(int connection) {
  const timeval timeout{kClientTimeoutMs / 1000, 0};
  ::setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  ::setsockopt(connection, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  std::string request;
  char buffer[2048];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
    const ssize_t n = ::recv(connection, buffer, sizeof buffer, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;  // closed, timed out or failed before a whole request
    }
    request.append(buffer, static_cast<size_t>(n));
  }
  // "GET /metrics HTTP/1.1" (a query string is allowed and ignored).
  const std::string line = request.substr(0, request.find("\r\n"));
  const size_t path_start = line.find(' ');
  const size_t path_end = line.find_first_of(" ?", path_start + 1);
  const std::string method = line.substr(0, path_start);
  const std::string path =
      path_start == std::string::npos ? "" : line.substr(path_start + 1, path_end - path_start - 1);
  if (method == "GET" && path == "/metrics") {
    WriteAll(connection, Response("200 OK", "text/plain; version=0.0.4; charset=utf-8",
                                  SerializeMetrics(*registry_)));
  } else {
    WriteAll(connection, Response("404 Not Found", "text/plain; charset=utf-8",
                                  "difftrain serves GET /metrics only\n"));
  }
}

}  // namespace difftrain
