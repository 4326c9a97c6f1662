// A minimal HTTP/1.0 client for tests: GET from a server on loopback (a daemon's /metrics,
// Prometheus' query API), and a free TCP port to start such a server on.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <random>
#include <set>
#include <string>

#include "common/status.h"

namespace difftrain::testing {

// Whether a TCP socket can bind `port` on every address now (no SO_REUSEADDR: a port with a
// connection lingering in TIME_WAIT counts as taken).
inline bool PortIsFree(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return free;
}

// The first of `count` consecutive TCP ports that were free a moment ago, chosen at random
// below the kernel's ephemeral range (net.ipv4.ip_local_port_range): a port in that range can
// become some connection's automatic local port at any time, and a server that binds its
// port again later (a requeued job's daemon) then finds it taken. Never one this process was
// given before: a test that asks for several before starting anything on them (a controller's
// port, then its daemons' metrics ports) must not get one twice.
inline int FreePort(int count = 1) {
  static std::set<int> given;
  int ephemeral = 32768;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d", &ephemeral) != 1) ephemeral = 32768;
    std::fclose(f);
  }
  constexpr int kLowest = 10000;
  std::random_device seed;
  std::mt19937 rng(seed());
  std::uniform_int_distribution<int> pick(kLowest, std::max(kLowest, ephemeral - count));
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int first = pick(rng);
    bool free = true;
    for (int i = 0; i < count && free; ++i)
      free = !given.count(first + i) && PortIsFree(first + i);
    if (free) {
      for (int i = 0; i < count; ++i)
        given.insert(first + i);
      return first;
    }
  }
  return 0;
}

// Percent-encodes `text` for a URL's query string.
inline std::string UrlEncode(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", c);
      out += hex;
    }
  }
  return out;
}

// The body of GET http://127.0.0.1:PORT/TARGET, or why there is none (no server, a
// status other than 200).
inline Result<std::string> HttpGet(int port, const std::string& target) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return Errorf("connecting to 127.0.0.1:{}: refused", port);
  }
  const std::string request = "GET " + target + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)!::write(fd, request.data(), request.size());
  std::string response;
  char buffer[65536];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;)
    response.append(buffer, static_cast<size_t>(n));
  ::close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos) return Errorf("GET {} on port {}: no response", target, port);
  const std::string status = response.substr(0, response.find("\r\n"));
  if (status.find(" 200") == std::string::npos) {
    return Errorf("GET {} on port {}: {}: {}", target, port, status, response.substr(body + 4));
  }
  return response.substr(body + 4);
}

}  // namespace difftrain::testing
