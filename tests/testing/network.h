// Network namespaces for partition tests: hosts (`ip netns`) joined by veth pairs to a
// bridge in a hub namespace, each with an address that exists only inside them, and links
// to cut and restore. Everything it makes is removed when it goes; no other address or
// namespace is touched. Commands run without a shell.
#pragma once

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tests/testing/processes.h"

namespace difftrain::testing {

constexpr const char* kIp = "/usr/sbin/ip";

// Namespaces made by this test process, removed when it ends.
class Network {
 public:
  // `log` collects the output of every `ip` command.
  explicit Network(std::filesystem::path log)
      : log_(std::move(log)), prefix_("dt" + std::to_string(::getpid())) {}
  ~Network() {
    for (auto it = made_.rbegin(); it != made_.rend(); ++it)
      (void)Ip({"netns", "del", *it});
  }
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  // Why namespaces cannot be made here; empty when they may be.
  static std::string Unavailable() {
    if (::geteuid() != 0) return "network namespaces need root";
    if (!std::filesystem::exists(kIp)) return std::string("network namespaces need ") + kIp;
    return "";
  }

  // Removes namespaces this class made in test processes that are gone (killed by a
  // timeout, say): "dt<pid><host>" under /run/netns with no process <pid>.
  void RemoveStale() const {
    std::error_code error;
    for (const auto& e : std::filesystem::directory_iterator("/run/netns", error)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("dt", 0) != 0) continue;
      const size_t digits = name.find_first_not_of("0123456789", 2);
      if (digits == 2 || digits == std::string::npos) continue;
      const std::string host = name.substr(digits);
      const bool ours = host == "hub" || host == "c" ||
                        (host[0] == 'n' && host.size() > 1 &&
                         host.find_first_not_of("0123456789", 1) == std::string::npos);
      if (!ours || std::filesystem::exists("/proc/" + name.substr(2, digits - 2))) continue;
      (void)Ip({"netns", "del", name});
    }
  }

  // A bridge in the hub and `hosts` around it: the first at 10.224.0.1 (the controller),
  // the others at 10.224.0.10, .11 ...
  bool MakeStar(const std::vector<std::string>& hosts) {
    RemoveStale();
    if (!AddHub()) return false;
    for (size_t i = 0; i < hosts.size(); ++i) {
      const std::string address = i == 0 ? "10.224.0.1/24" : fmt::format("10.224.0.{}/24", 9 + i);
      if (!Attach(hosts[i], address)) return false;
    }
    return true;
  }
  // Where a controller in the first host of the star listens.
  static std::string Endpoint() { return "tcp://10.224.0.1:29400"; }

  std::string Name(const std::string& host) const { return prefix_ + host; }

  // `ip ARGS`, without a shell; whether it exited 0.
  bool Ip(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {kIp};
    argv.insert(argv.end(), args.begin(), args.end());
    Process ip(argv, log_);
    return ip.Wait(std::chrono::seconds(20)) == 0;
  }

  // A namespace with loopback up.
  bool AddNamespace(const std::string& host) {
    if (!Ip({"netns", "add", Name(host)})) return false;
    made_.push_back(Name(host));
    return Ip({"-n", Name(host), "link", "set", "lo", "up"});
  }

  // The hub: a namespace holding a bridge.
  bool AddHub() {
    return AddNamespace("hub") && Ip({"-n", Name("hub"), "link", "add", "br0", "type", "bridge"}) &&
           Ip({"-n", Name("hub"), "link", "set", "br0", "up"});
  }

  // `host` joins the hub through a veth pair with address `cidr` on its side.
  bool Attach(const std::string& host, const std::string& cidr) {
    const std::string outer = "h" + host, inner = "e" + host;
    return AddNamespace(host) &&
           Ip({"-n", Name("hub"), "link", "add", outer, "type", "veth", "peer", "name", inner,
               "netns", Name(host)}) &&
           Ip({"-n", Name("hub"), "link", "set", outer, "master", "br0"}) &&
           Ip({"-n", Name("hub"), "link", "set", outer, "up"}) &&
           Ip({"-n", Name(host), "addr", "add", cidr, "dev", inner}) &&
           Ip({"-n", Name(host), "link", "set", inner, "up"});
  }

  // Cuts (or restores) `host`'s link at the hub: its packets go nowhere, no error is seen.
  bool SetLink(const std::string& host, bool up) const {
    return Ip({"-n", Name("hub"), "link", "set", "h" + host, up ? "up" : "down"});
  }

  std::vector<std::string> Exec(const std::string& host) const {
    return {kIp, "netns", "exec", Name(host)};
  }

 private:
  std::filesystem::path log_;
  std::string prefix_;
  std::vector<std::string> made_;
};

}  // namespace difftrain::testing
