#include "common/cluster_config.h"

namespace difftrain {

std::string ClusterConfig::Where(const std::string& field) const {
  auto it = where.find(field);
  return it == where.end() ? "job" : it->second;
}

void ClusterConfig::Locate(const YamlFields& fields, const std::string& section,
                           std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    if (fields.Has(key)) where[section + "." + key] = fields.Location(key);
  }
}

Status ReadClusterConfig(YamlFields& top, ClusterConfig& c) {
  YamlFields cluster = top.Section("cluster");
  cluster.Int("nodes", c.nodes).Int("devices_per_node", c.devices_per_node);
  DT_RETURN_IF_ERROR(cluster.Finish());
  c.Locate(cluster, "cluster", {"nodes", "devices_per_node"});
  if (c.nodes < 1) return cluster.ErrorAt("nodes", fmt::format("expected >= 1, found {}", c.nodes));
  if (c.devices_per_node < 1) {
    return cluster.ErrorAt("devices_per_node",
                           fmt::format("expected >= 1, found {}", c.devices_per_node));
  }
  if (static_cast<int64_t>(c.nodes) * c.devices_per_node > 1 << 20) {
    return cluster.ErrorAt("nodes", fmt::format("expected nodes x devices_per_node <= 1048576, "
                                                "found {} x {}",
                                                c.nodes, c.devices_per_node));
  }

  RestartPolicy& r = c.restart;
  YamlFields restart = top.Section("restart");
  restart.Int("max_restarts", r.max_restarts)
      .Double("heartbeat_seconds", r.heartbeat_seconds)
      .Int("heartbeat_misses", r.heartbeat_misses)
      .Double("rendezvous_timeout_seconds", r.rendezvous_timeout_seconds)
      .Double("stop_grace_seconds", r.stop_grace_seconds)
      .Double("hang_seconds", r.hang_seconds);
  DT_RETURN_IF_ERROR(restart.Finish());
  if (r.max_restarts < 0) {
    return restart.ErrorAt("max_restarts", fmt::format("expected >= 0, found {}", r.max_restarts));
  }
  if (!(r.heartbeat_seconds >= 0.01 && r.heartbeat_seconds <= 3600)) {
    return restart.ErrorAt("heartbeat_seconds", fmt::format("expected a number of seconds in "
                                                            "[0.01, 3600], found {}",
                                                            r.heartbeat_seconds));
  }
  if (r.heartbeat_misses < 1) {
    return restart.ErrorAt("heartbeat_misses",
                           fmt::format("expected >= 1, found {}", r.heartbeat_misses));
  }
  if (!(r.rendezvous_timeout_seconds > 0 && r.rendezvous_timeout_seconds <= 86400)) {
    return restart.ErrorAt("rendezvous_timeout_seconds",
                           fmt::format("expected a number of seconds in (0, 86400], found {}",
                                       r.rendezvous_timeout_seconds));
  }

  if (!(r.stop_grace_seconds >= 0 && r.stop_grace_seconds <= 86400)) {
    return restart.ErrorAt(
        "stop_grace_seconds",
        fmt::format("expected a number of seconds in [0, 86400], found {}", r.stop_grace_seconds));
  }
  if (!(r.hang_seconds >= 0 && r.hang_seconds <= 86400)) {
    return restart.ErrorAt("hang_seconds", fmt::format("expected a number of seconds in [0, 86400] "
                                                       "(0: automatic), found {}",
                                                       r.hang_seconds));
  }

  YamlFields metrics = top.Section("metrics");
  metrics.Int("port", c.metrics_port);
  metrics.Double("progress_log_seconds", c.progress_log_seconds);
  DT_RETURN_IF_ERROR(metrics.Finish());
  if (c.metrics_port < 0 || c.metrics_port > 65535) {
    return metrics.ErrorAt("port", fmt::format("expected a TCP port in [0, 65535] (0: off), "
                                               "found {}",
                                               c.metrics_port));
  }
  if (!(c.progress_log_seconds >= 0.1 && c.progress_log_seconds <= 86400)) {
    return metrics.ErrorAt("progress_log_seconds",
                           fmt::format("expected a number of seconds in [0.1, 86400], found {}",
                                       c.progress_log_seconds));
  }

  YamlFields security = top.Section("security");
  security.String("keys", c.keys_dir);
  DT_RETURN_IF_ERROR(security.Finish());
  c.Locate(security, "security", {"keys"});
  return Status::Ok();
}

}  // namespace difftrain
