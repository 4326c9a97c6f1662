// The controller's deadlines: how long a checkpoint-stop may take, how long a running rank
// may go without a step (the progress watchdog), and how long the ranks of a lost node may
// live on. Every wait of the controller ends by one of these or by the rendezvous timeout
// (docs/jobs.md, "Deadlines").
#include <algorithm>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "controller/controller.h"
#include "model/io/checkpoint.h"

namespace difftrain::controller {
namespace {

double SecondsOf(Controller::Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

Controller::Clock::duration FromSeconds(double s) {
  return std::chrono::duration_cast<Controller::Clock::duration>(std::chrono::duration<double>(s));
}

// Beyond a daemon's own deadlines, for its SIGKILL and its report to arrive.
constexpr double kReportMarginSeconds = 2;

}  // namespace

void Controller::FinishStopIfDone(const std::string& why) {
  if (done_ || !AllRanksExited()) return;
  const bool all_clean = std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& x) {
    return x.signal == 0 && x.exit_code == 0;
  });
  if (all_clean) {
    Finish(JobState::kSucceeded,
           fmt::format("every rank finished (attempt {}, {} restarts)", attempt_, restarts_));
  } else {
    Finish(JobState::kCheckpointed, why);
  }
}

void Controller::CheckStopDeadline(Clock::time_point now) {
  // The daemons kill what is left of their ranks stop_grace_seconds after the stop; a
  // daemon that cannot report that is lost after heartbeat_seconds x heartbeat_misses.
  // Past both, waiting longer cannot bring news.
  const RestartPolicy& r = o_.config.cluster.restart;
  const double limit =
      r.stop_grace_seconds + r.heartbeat_seconds * r.heartbeat_misses + kReportMarginSeconds;
  if (SecondsOf(now - stop_since_) <= limit) return;
  std::vector<int> missing;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (!ranks_[i].exited) missing.push_back(static_cast<int>(i));
  }
  Finish(JobState::kCheckpointed,
         fmt::format("the stop did not end within {:.1f} s (restart.stop_grace_seconds {} + the "
                     "node timeout); no exit reported by rank(s) {}",
                     limit, r.stop_grace_seconds, fmt::join(missing, ",")));
}

double HangLimitSeconds(const RestartPolicy& policy, std::vector<double> step_seconds) {
  if (policy.hang_seconds > 0) return policy.hang_seconds;
  std::erase_if(step_seconds, [](double s) { return !(s > 0); });
  if (step_seconds.empty()) return RestartPolicy::kHangFloorSeconds;
  std::nth_element(step_seconds.begin(), step_seconds.begin() + step_seconds.size() / 2,
                   step_seconds.end());
  return std::max(RestartPolicy::kHangFloorSeconds,
                  RestartPolicy::kHangFactor * step_seconds[step_seconds.size() / 2]);
}

void Controller::CheckProgress(Clock::time_point now) {
  if (checkpoint_requested_) return;  // a stop has its own deadline
  std::vector<double> step_seconds;
  for (const Rank& r : ranks_)
    step_seconds.push_back(r.progress.step_seconds);
  const double limit = HangLimitSeconds(o_.config.cluster.restart, std::move(step_seconds));
  const double allowance = o_.config.cluster.restart.stop_grace_seconds;
  const CheckpointConfig& checkpoint = o_.config.checkpoint;
  std::vector<int> hung;
  double longest = 0;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& r = ranks_[i];
    if (r.exited) continue;
    // A step after which the rank writes a checkpoint, and an attempt's first step (caches
    // cold, buffers not yet allocated), may take longer than the steps around them.
    const bool writes_checkpoint = !checkpoint.dir.empty() && checkpoint.every > 0 &&
                                   r.progress.step > 0 && r.progress.step % checkpoint.every == 0;
    const bool slow = r.moves == 0 || writes_checkpoint;
    const double stalled = SecondsOf(now - r.moved_at);
    if (stalled <= limit + (slow ? allowance : 0)) continue;
    hung.push_back(static_cast<int>(i));
    longest = std::max(longest, stalled);
  }
  if (hung.empty()) return;
  for (int i : hung) {
    const Rank& r = ranks_[i];
    ++counters_.hangs;
    ++hangs_by_rank_[{i, r.node}];
    spdlog::warn("controller: rank {} on node {} is hung: its step {} has not moved for {:.1f} s",
                 i, r.node, r.progress.step, SecondsOf(now - r.moved_at));
  }
  Fail(fmt::format("rank(s) {} made no progress for {:.1f} s (restart.hang_seconds: {})",
                   fmt::join(hung, ","), longest,
                   o_.config.cluster.restart.hang_seconds > 0
                       ? fmt::format("{} s", limit)
                       : fmt::format("automatic, {:.1f} s", limit)));
}

void Controller::FenceLostNode(const Node& node) {
  // Its daemon kills its ranks once it has heard nothing for the node timeout, counted from
  // the last message it got from us; until then they may still train and even commit a
  // checkpoint, so no new attempt may start.
  const RestartPolicy& r = o_.config.cluster.restart;
  const Clock::time_point dead_by =
      std::max(node.last_sent, node.last_seen) +
      FromSeconds(r.heartbeat_seconds * r.heartbeat_misses + kReportMarginSeconds);
  if (dead_by > fence_until_) fence_until_ = dead_by;
  const double wait = SecondsOf(fence_until_ - Clock::now());
  if (wait > 0) {
    spdlog::info(
        "controller: no new attempt for {:.1f} s: the ranks of node {} may live until "
        "their daemon notices the silence",
        wait, node.name);
  }
}

std::string Controller::NewestCheckpoint() const {
  const std::string& dir = o_.config.checkpoint.dir;
  if (dir.empty()) return "the start (no checkpoint.dir)";
  // The controller's machine may not see the checkpoint directory (it need not share the
  // ranks' storage), and reading it verifies every shard, which may be slow or, on a hung
  // file system, never end: it is looked at on a thread of its own for a few seconds only.
  auto found = std::make_shared<std::promise<std::optional<int64_t>>>();
  std::future<std::optional<int64_t>> step = found->get_future();
  std::thread([found, dir] {
    Result<std::optional<int64_t>> latest = io::CheckpointStore(dir, 0).LatestComplete();
    found->set_value(latest.ok() ? *latest : std::nullopt);
  }).detach();
  if (step.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    return fmt::format("the newest complete checkpoint in {} (not read within 5 s)", dir);
  }
  const std::optional<int64_t> latest = step.get();
  if (!latest) return fmt::format("the newest complete checkpoint in {}", dir);
  return fmt::format("the newest complete checkpoint, step {} in {}", *latest, dir);
}

}  // namespace difftrain::controller
