#include "worker/local_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>

#include <gtest/gtest.h>

namespace difftrain::worker {
namespace {

TEST(LocalAddressTest, LoopbackAndLocalEndpointsAdvertiseLoopback) {
  EXPECT_EQ(*LocalAddressTowards("ipc:///tmp/controller.sock"), "127.0.0.1");
  EXPECT_EQ(*LocalAddressTowards("tcp://127.0.0.1:29400"), "127.0.0.1");
  EXPECT_EQ(*LocalAddressTowards("tcp://*:29400"), "127.0.0.1");
}

// A controller reached through one of this machine's own non-loopback addresses: the route
// leaves by that interface, so the ranks advertise that address, not loopback.
TEST(LocalAddressTest, AControllerOnAnotherInterfaceIsReachedFromThatInterface) {
  ifaddrs* list = nullptr;
  ASSERT_EQ(::getifaddrs(&list), 0);
  std::string other;
  for (ifaddrs* a = list; a != nullptr && other.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    if (std::string(text) != "127.0.0.1") other = text;
  }
  ::freeifaddrs(list);
  if (other.empty()) GTEST_SKIP() << "this machine has no IPv4 address besides loopback";
  EXPECT_EQ(*LocalAddressTowards("tcp://" + other + ":29400"), other);
}

TEST(LocalAddressTest, BadEndpointsNameWhatIsWrong) {
  Result<std::string> no_port = LocalAddressTowards("tcp://controller");
  ASSERT_FALSE(no_port.ok());
  EXPECT_NE(no_port.status().message().find("tcp://HOST:PORT"), std::string::npos);
  Result<std::string> unknown = LocalAddressTowards("tcp://no-such-host.invalid:29400");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("no-such-host.invalid"), std::string::npos);
}

}  // namespace
}  // namespace difftrain::worker
