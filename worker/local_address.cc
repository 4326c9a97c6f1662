#include "worker/local_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace difftrain::worker {

Result<std::string> LocalAddressTowards(const std::string& controller_endpoint) {
  const std::string tcp = "tcp://";
  if (!controller_endpoint.starts_with(tcp)) return std::string("127.0.0.1");
  const std::string address = controller_endpoint.substr(tcp.size());
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return Errorf("controller address '{}' is not tcp://HOST:PORT", controller_endpoint);
  }
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  if (host == "*") return std::string("127.0.0.1");

  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int e = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); e != 0) {
    return Errorf("cannot resolve the controller host '{}': {}", host, ::gai_strerror(e));
  }
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  std::string error;
  sockaddr_in local{};
  socklen_t length = sizeof local;
  if (fd < 0) {
    error = std::strerror(errno);
  } else if (::connect(fd, found->ai_addr, found->ai_addrlen) != 0 ||
             ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0) {
    error = std::strerror(errno);
  }
  ::freeaddrinfo(found);
  if (fd >= 0) ::close(fd);
  if (!error.empty()) {
    return Errorf("cannot find the local address towards the controller '{}': {}", host, error);
  }
  char text[INET_ADDRSTRLEN];
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
  return std::string(text);
}

}  // namespace difftrain::worker
