#include "common/rank_report.h"

#include <unistd.h>

#include <fstream>

namespace difftrain {
namespace {

template <typename T>
void Read(const nlohmann::json& j, const char* key, T& out) {
  auto it = j.find(key);
  if (it == j.end()) return;
  if constexpr (std::is_same_v<T, std::string>) {
    if (it->is_string()) out = it->get<std::string>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (it->is_number()) out = it->get<T>();
  } else {
    if (it->is_number_integer()) out = it->get<T>();
  }
}

}  // namespace

nlohmann::json RankReport::ToJson() const {
  nlohmann::json j = {{"step", step},
                      {"rank", rank},
                      {"tp", tp},
                      {"cp", cp},
                      {"dp", dp},
                      {"pp", pp},
                      {"device", device},
                      {"peak_flops_per_second", peak_flops_per_second},
                      {"device_memory_allocated_bytes", device_memory_allocated_bytes},
                      {"device_memory_reserved_bytes", device_memory_reserved_bytes},
                      {"host_resident_bytes", host_resident_bytes},
                      {"memory_bytes", memory_bytes},
                      {"checkpoint_seconds", checkpoint_seconds},
                      {"last_checkpoint_step", last_checkpoint_step}};
  if (!event.empty()) {
    j["event"] = event;
    return j;
  }
  j.update({{"loss", loss},
            {"grad_norm", grad_norm},
            {"lr", lr},
            {"epoch", epoch},
            {"step_seconds", step_seconds},
            {"samples_per_second", samples_per_second},
            {"flops_per_second", flops_per_second},
            {"mfu", mfu},
            {"data_wait_seconds", data_wait_seconds},
            {"comm_wait_seconds", comm_wait_seconds},
            {"compute_seconds", compute_seconds},
            {"comm_seconds", comm_seconds}});
  if (sample_height > 0) j["sample_size"] = {sample_height, sample_width};
  return j;
}

RankReport RankReport::FromJson(const nlohmann::json& j) {
  RankReport r;
  if (!j.is_object()) return r;
  Read(j, "event", r.event);
  Read(j, "step", r.step);
  Read(j, "rank", r.rank);
  Read(j, "tp", r.tp);
  Read(j, "cp", r.cp);
  Read(j, "dp", r.dp);
  Read(j, "pp", r.pp);
  Read(j, "device", r.device);
  Read(j, "loss", r.loss);
  Read(j, "grad_norm", r.grad_norm);
  Read(j, "lr", r.lr);
  Read(j, "epoch", r.epoch);
  Read(j, "step_seconds", r.step_seconds);
  Read(j, "samples_per_second", r.samples_per_second);
  Read(j, "flops_per_second", r.flops_per_second);
  Read(j, "peak_flops_per_second", r.peak_flops_per_second);
  Read(j, "mfu", r.mfu);
  if (auto size = j.find("sample_size"); size != j.end() && size->is_array() && size->size() == 2 &&
                                         (*size)[0].is_number_integer() &&
                                         (*size)[1].is_number_integer()) {
    r.sample_height = (*size)[0].get<int>();
    r.sample_width = (*size)[1].get<int>();
  }
  Read(j, "data_wait_seconds", r.data_wait_seconds);
  Read(j, "comm_wait_seconds", r.comm_wait_seconds);
  Read(j, "compute_seconds", r.compute_seconds);
  Read(j, "device_memory_allocated_bytes", r.device_memory_allocated_bytes);
  Read(j, "device_memory_reserved_bytes", r.device_memory_reserved_bytes);
  Read(j, "host_resident_bytes", r.host_resident_bytes);
  Read(j, "checkpoint_seconds", r.checkpoint_seconds);
  Read(j, "last_checkpoint_step", r.last_checkpoint_step);
  if (auto it = j.find("memory_bytes"); it != j.end() && it->is_object()) r.memory_bytes = *it;
  if (auto it = j.find("comm_seconds"); it != j.end() && it->is_object()) {
    for (const auto& [group, ops] : it->items()) {
      if (!ops.is_object()) continue;
      for (const auto& [op, seconds] : ops.items()) {
        if (seconds.is_number()) r.comm_seconds[group][op] = seconds.get<double>();
      }
    }
  }
  return r;
}

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * ::sysconf(_SC_PAGESIZE);
}

}  // namespace difftrain
