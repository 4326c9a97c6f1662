// Prometheus metrics of the daemons (docs/metrics.md): what the controller's job metrics
// (controller/job_metrics.h) and the worker's rank metrics (worker/rank_metrics.h) share.
//
// Names start with `difftrain_`, are in base units (seconds, bytes, FLOP/s, ratios 0–1)
// and counters end in `_total`. Every daemon keeps its metrics in one prometheus-cpp
// Registry, updated by its own thread (the metrics are atomic), and serves it at
// http://0.0.0.0:PORT/metrics from a thread of the endpoint.
//
// The endpoint is a small HTTP server of our own, not prometheus-cpp's Exposer: the
// Exposer's civetweb (Debian's) answers on threads with a fixed 100 KiB stack, which the
// static TLS of a process that loads OpenBLAS and CUDA leaves too small: it crashed on the
// first scrape.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/registry.h>

#include "common/status.h"

namespace difftrain {

// The buckets of step-time histograms, in seconds: from a tiny test model's steps to a
// large model's with long accumulation.
const std::vector<double>& StepSecondsBuckets();

// Moves `counter` up to `total` (a count kept elsewhere, e.g. the controller's); counters
// only go up, so a smaller total changes nothing.
void AdvanceCounter(prometheus::Counter& counter, double total);

// The registry in Prometheus' text format, as /metrics serves it.
std::string SerializeMetrics(const prometheus::Registry& registry);

// Serves one registry at GET /metrics on a TCP port of every interface, from one thread:
// requests are answered one at a time (HTTP/1.1 with "Connection: close"); anything else
// gets 404. A client that sends no complete request within 5 s is dropped.
class MetricsEndpoint {
 public:
  // Port 1–65535 (0 means "off" to the callers, who then do not start one). Fails when
  // the port cannot be bound.
  static Result<std::unique_ptr<MetricsEndpoint>> Start(
      int port, std::shared_ptr<prometheus::Registry> registry);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }

 private:
  MetricsEndpoint() = default;
  void Serve();
  void Answer(int connection);

  std::shared_ptr<prometheus::Registry> registry_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};  // a pipe: a byte on it stops the thread
  std::thread thread_;
};

}  // namespace difftrain
