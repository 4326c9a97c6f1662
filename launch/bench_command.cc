// `difftrain bench`: a throughput sweep over micro-batch sizes and parallel layouts. Each
// configuration is a generated job file run in a process of its own (`difftrain train` for
// one rank, `difftrain run` for several on this machine), optionally under a memory limit,
// so that one that runs out of memory or fails is recorded as "OOM" or "error: <reason>"
// and the sweep goes on. A configuration whose ranks' arenas, by the trainer's memory model,
// exceed the memory budget (the limit, else the memory this machine has available) is an OOM
// row without being run, as NeMo's tables mark the micro-batches that do not fit. The figures
// come from the ranks' metrics files (docs/bench.md).
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/bench_table.h"
#include "launch/command.h"
#include "launch/daemon_options.h"
#include "launch/model_options.h"
#include "model/tensor/host_memory.h"
#include "model/train/planner.h"
#include "model/train/trainer.h"

namespace difftrain::launch {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct BenchOptions {
  ModelOptions model;
  std::string device = "cpu";
  std::vector<int> micro_batches = {8};
  std::vector<std::string> layouts = {"dp1"};
  int warmup = 2, steps = 5;
  std::optional<double> memory_limit_gib;
  bool recompute = false, zero1 = false;
  std::string data = "synthetic";
  std::string out = "runs/bench";
  double timeout_seconds = 600;
};

// "tp2-dp2" → tp 2, dp 2, the other sizes 1.
Result<Layout> ParseLayout(const std::string& text) {
  Layout l;
  std::stringstream pieces(text);
  std::string piece;
  while (std::getline(pieces, piece, '-')) {
    const std::string axis = piece.substr(0, 2);
    int* size = axis == "tp"   ? &l.tp
                : axis == "cp" ? &l.cp
                : axis == "pp" ? &l.pp
                : axis == "dp" ? &l.dp
                               : nullptr;
    size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(piece.substr(2), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (size == nullptr || used == 0 || used + 2 != piece.size() || value < 1) {
      return Errorf(
          "--layouts: '{}': expected pieces tpN, cpN, ppN, dpN joined by '-' (e.g. tp2-dp2), "
          "found '{}'",
          text, piece);
    }
    *size = value;
  }
  return l;
}

// The model section of a job file: the family's config, every field explicit (JSON is YAML),
// so named and custom models alike.
std::string ModelYaml(const ModelSpec& model) {
  return "model: " + model.config.dump() + "\n";
}

// One configuration of the sweep: its directory, job file and the command that runs it.
struct Run {
  BenchConfig config;
  Layout layout;
  fs::path dir;
  std::vector<std::string> argv;
};

// The bytes of the arenas of the fullest rank of `layout` (its pipeline stages' rank 0), by
// the trainer's own memory model; 0 when the layout is invalid (the run says why).
double PlannedMemoryBytes(const BenchOptions& o, const ModelSpec& model, const Layout& l) {
  double most = 0;
  for (int stage = 0; stage < l.pp; ++stage) {
    Result<MemoryBytes> m =
        PlanMemory(model, {l.tp, l.cp, l.pp, {}}, stage, l.micro_batch, 1, o.zero1, l.dp * l.cp,
                   ParallelConfig().bucket_elements(), o.recompute);
    if (!m.ok()) return 0;
    most = std::max(most, static_cast<double>(m->total()));
  }
  return most;
}

// The model's name in the table: a named config at another latent size keeps its name
// ("SD1.5 8x8" for --model SD1.5 --input-size 8), any other change is the spec's ("custom").
std::string ModelLabel(const BenchOptions& o, const ModelSpec& model) {
  const SampleSchema x = FamilyOf(model).Samples(model);
  std::string name = model.name();
  const std::string requested = o.model.requested_name();
  if (!requested.empty() && requested != name) {
    ModelRequest named;
    named.name = requested;
    named.input_size = x.height;
    Result<ModelSpec> resized = FamilyOf(model).FromRequest(named);
    if (resized.ok() && *resized == model) name = requested;
  }
  return fmt::format("{} {}x{}", name, x.height, x.width);
}

Run MakeRun(const BenchOptions& o, const ModelSpec& model, const Layout& layout, int index) {
  Run r;
  r.layout = layout;
  const int world = layout.tp * layout.cp * layout.pp * layout.dp;
  r.dir = fs::absolute(fs::path(o.out) / fmt::format("config-{}", index));
  const fs::path job = r.dir / "job.yaml";
  BenchConfig& c = r.config;
  c.device = o.device;
  c.model = ModelLabel(o, model);
  c.precision = "fp32";
  c.data = o.data;
  c.layout = fmt::format("tp {} cp {} pp {} dp {}{}{}", layout.tp, layout.cp, layout.pp, layout.dp,
                         o.recompute ? " recompute" : "", o.zero1 ? " zero1" : "");
  c.devices = world;
  c.nodes = 1;
  c.micro_batch = layout.micro_batch;
  c.global_batch = layout.micro_batch * layout.dp;
  c.flops_per_sample = FamilyOf(model).Cost(model).training_flops_per_sample();
  c.planned_memory_bytes = PlannedMemoryBytes(o, model, layout);
  // Every rank runs on this machine: each gets the limit, or its share of what is available
  // (to this process: its cgroup's limit counts).
  c.memory_budget_bytes = o.memory_limit_gib ? *o.memory_limit_gib * (1 << 30)
                                             : double(ReadHostMemory().headroom()) / world;
  r.argv = world == 1
               ? std::vector<std::string>{SelfBinary(), "train",       "--config",
                                          job.string(), "--log-level", "warn"}
               : std::vector<std::string>{SelfBinary(), "run", job.string(), "--log-level", "warn"};
  c.command = fmt::format(
      "{}difftrain {} {}",
      o.memory_limit_gib
          ? fmt::format("ulimit -v {}; ", static_cast<int64_t>(*o.memory_limit_gib * (1 << 20)))
          : "",
      world == 1 ? "train --config" : "run", job.string());
  return r;
}

Status WriteJob(const BenchOptions& o, const ModelSpec& model, const Run& r) {
  std::error_code error;
  fs::remove_all(r.dir, error);
  fs::create_directories(r.dir, error);
  if (error) return Errorf("cannot create '{}': {}", r.dir.string(), error.message());
  const Layout& l = r.layout;
  std::ofstream job(r.dir / "job.yaml");
  job << ModelYaml(model) << fmt::format("data: {{kind: \"{}\"}}\n", o.data)
      << fmt::format("batch: {{micro: {}, global: {}}}\n", l.micro_batch, l.micro_batch * l.dp)
      << fmt::format(
             "train: {{steps: {}, log_every: 1000, recompute: {}, device: {}, metrics_file: "
             "\"{}\"}}\n",
             o.warmup + o.steps, o.recompute, o.device, (r.dir / "metrics-{rank}.jsonl").string())
      << fmt::format("parallel: {{tp: {}, cp: {}, pp: {}, dp: {}, zero1: {}}}\n", l.tp, l.cp, l.pp,
                     l.dp, o.zero1)
      << fmt::format("cluster: {{nodes: 1, devices_per_node: {}}}\n", l.tp * l.cp * l.pp * l.dp)
      // A failed configuration is a row of the table, not something to restart.
      << "restart: {max_restarts: 0}\n";
  if (!job) return Errorf("cannot write '{}'", (r.dir / "job.yaml").string());
  return Status::Ok();
}

// Starts `argv` in a process group of its own, output to `log`, under the memory limit.
Result<pid_t> Start(const std::vector<std::string>& argv, const fs::path& log,
                    std::optional<double> memory_limit_gib) {
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errorf("cannot open '{}'", log.string());
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The child: only async-signal-safe calls until exec.
    ::setpgid(0, 0);
    if (memory_limit_gib) {
      const rlim_t bytes = static_cast<rlim_t>(*memory_limit_gib * (1 << 30));
      const rlimit limit{bytes, bytes};
      ::setrlimit(RLIMIT_AS, &limit);
    }
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(fd);
  if (pid < 0) return Status::Error("fork failed");
  return pid;
}

std::string ReadText(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The reason a configuration failed, from its exit status and its log: "OOM" when an
// allocation failed, else the last line it printed.
std::string FailureOf(int status, const std::string& log) {
  for (const char* sign :
       {"out of host memory", "std::bad_alloc", "Cannot allocate memory", "unable to allocate"}) {
    if (log.find(sign) != std::string::npos) return "OOM";
  }
  std::string last;
  std::stringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  // spdlog's "[time] [level] " prefix says nothing here.
  if (last.starts_with("[")) {
    const size_t level_end = last.find("] ", last.find("] ") + 2);
    if (level_end != std::string::npos) last = last.substr(level_end + 2);
  }
  constexpr size_t kShown = 200;
  if (last.size() > kShown) last = last.substr(0, kShown) + "…";
  const std::string how = WIFSIGNALED(status) ? fmt::format("killed by signal {}", WTERMSIG(status))
                                              : fmt::format("exit code {}", WEXITSTATUS(status));
  return "error: " + (last.empty() ? how : fmt::format("{} ({})", last, how));
}

// The table row of a configuration whose process exited with `status`.
BenchRow Collect(const Run& r, int status, int warmup) {
  BenchRow row;
  row.config = r.config;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    row.outcome = FailureOf(status, ReadText(r.dir / "log.txt"));
    return row;
  }
  std::vector<nlohmann::json> lines;
  for (const fs::directory_entry& e : fs::directory_iterator(r.dir)) {
    if (!e.path().filename().string().starts_with("metrics-")) continue;
    std::ifstream in(e.path());
    for (std::string line; std::getline(in, line);) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded()) lines.push_back(std::move(j));
    }
  }
  Result<BenchFigures> figures = SummarizeMetrics(lines, warmup, r.config);
  if (!figures.ok()) {
    row.outcome = "error: " + figures.status().message();
    return row;
  }
  row.outcome = "ok";
  row.figures = *figures;
  return row;
}

// The sweep's progress on stderr: a bar rewritten in place on a terminal, else a line per
// configuration started and finished.
class Progress {
 public:
  explicit Progress(int total) : total_(total), tty_(::isatty(STDERR_FILENO) == 1) {}

  void Started(int index, const std::string& what) {
    index_ = index;
    what_ = what;
    started_ = Clock::now();
    if (!tty_)
      std::fprintf(stderr, "bench: [%d/%d] %s (%s)\n", index + 1, total_, what.c_str(),
                   Eta(0).c_str());
    Draw();
  }

  // Redraws the bar (a terminal only).
  void Draw() const {
    if (!tty_) return;
    constexpr int kWidth = 24;
    const int filled = kWidth * index_ / total_;
    std::fprintf(stderr, "\r\033[K[%s%s] %d/%d %s  %.0f s, %s", std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, '.').c_str(), index_ + 1, total_, what_.c_str(),
                 Seconds(Clock::now() - started_), Eta(Seconds(Clock::now() - started_)).c_str());
    std::fflush(stderr);
  }

  void Finished(const BenchRow& row) {
    const double took = Seconds(Clock::now() - started_);
    finished_seconds_ += took;
    ++finished_;
    const std::string result =
        row.outcome == "ok"
            ? fmt::format("{:.2f} samples/GPU/s", row.figures.samples_per_second_per_device)
            : row.outcome;
    std::fprintf(stderr, "%sbench: [%d/%d] %s: %s in %.0f s\n", tty_ ? "\r\033[K" : "", index_ + 1,
                 total_, what_.c_str(), result.c_str(), took);
  }

 private:
  static double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

  // The rest of the sweep at the mean time per configuration so far.
  std::string Eta(double current_elapsed) const {
    if (finished_ == 0) return "ETA unknown";
    const double mean = finished_seconds_ / finished_;
    const double left = mean * (total_ - index_) - std::min(current_elapsed, mean);
    return fmt::format("ETA {:.0f} s", std::max(0.0, left));
  }

  int total_;
  bool tty_;
  int index_ = 0, finished_ = 0;
  double finished_seconds_ = 0;
  std::string what_;
  Clock::time_point started_;
};

Status WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) return Errorf("cannot write '{}'", path.string());
  return Status::Ok();
}

int RunBench(const BenchOptions& o) {
  if (o.device != "cpu") {
    return ReportBadInput("bench", fmt::format("--device {}: only cpu runs today (the CUDA backend "
                                               "has not run on a GPU yet)",
                                               o.device));
  }
  Result<ModelSpec> model = o.model.Build();
  if (!model.ok()) return ReportBadInput("bench", model.status().message());
  if (o.warmup < 0 || o.steps < 1) {
    return ReportBadInput("bench", fmt::format("--warmup must be >= 0 and --steps >= 1, found {} "
                                               "and {}",
                                               o.warmup, o.steps));
  }
  if (o.memory_limit_gib && !(*o.memory_limit_gib > 0)) {
    return ReportBadInput("bench", "--memory-limit-gib must be positive");
  }
  std::vector<Run> runs;
  for (const std::string& text : o.layouts) {
    Result<Layout> layout = ParseLayout(text);
    if (!layout.ok()) return ReportBadInput("bench", layout.status().message());
    for (int micro : o.micro_batches) {
      if (micro < 1) return ReportBadInput("bench", "--micro-batches must be positive");
      Layout l = *layout;
      l.micro_batch = micro;
      runs.push_back(MakeRun(o, *model, l, static_cast<int>(runs.size())));
    }
  }
  Progress progress(static_cast<int>(runs.size()));
  std::vector<BenchRow> rows;
  for (size_t i = 0; i < runs.size(); ++i) {
    const Run& r = runs[i];
    progress.Started(static_cast<int>(i), fmt::format("{} micro {} {}", r.config.model,
                                                      r.config.micro_batch, r.config.layout));
    if (Status s = WriteJob(o, *model, r); !s.ok()) return ReportBadInput("bench", s.message());
    if (r.config.memory_budget_bytes > 0 &&
        r.config.planned_memory_bytes > r.config.memory_budget_bytes) {
      BenchRow row{r.config, "OOM", {}};
      std::fprintf(stderr, "bench: planned %.2f GiB per rank > budget %.2f GiB: not run\n",
                   r.config.planned_memory_bytes / (1 << 30),
                   r.config.memory_budget_bytes / (1 << 30));
      progress.Finished(row);
      rows.push_back(std::move(row));
      continue;
    }
    Result<pid_t> pid = Start(r.argv, r.dir / "log.txt", o.memory_limit_gib);
    if (!pid.ok()) return ReportBadInput("bench", pid.status().message());
    const Clock::time_point deadline =
        Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.timeout_seconds * 1000));
    int status = 0;
    bool timed_out = false;
    while (::waitpid(*pid, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        ::kill(-*pid, SIGKILL);  // its group; the ranks of `difftrain run` die with it
        ::waitpid(*pid, &status, 0);
        timed_out = true;
        break;
      }
      progress.Draw();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    BenchRow row = Collect(r, status, o.warmup);
    if (timed_out) row.outcome = fmt::format("error: timed out after {} s", o.timeout_seconds);
    progress.Finished(row);
    rows.push_back(std::move(row));
  }
  const std::string table = BenchMarkdown(rows);
  std::printf("%s", table.c_str());
  const fs::path out = o.out;
  for (const auto& [name, text] : {std::pair{"bench.md", table},
                                   {"bench.csv", BenchCsv(rows)},
                                   {"bench.json", BenchJson(rows).dump(2) + "\n"}}) {
    if (Status s = WriteText(out / name, text); !s.ok())
      return ReportBadInput("bench", s.message());
  }
  std::fprintf(stderr, "bench: table written to %s/bench.{md,csv,json}\n", o.out.c_str());
  const bool any_ok =
      std::any_of(rows.begin(), rows.end(), [](const BenchRow& r) { return r.outcome == "ok"; });
  return any_ok ? kExitOk : kExitJobFailed;
}

}  // namespace

DIFFTRAIN_COMMAND(
    kBench,
    {"bench", "Throughput sweep over micro-batches and layouts, one process per configuration",
     [](CLI::App& app) {
       auto o = std::make_shared<BenchOptions>();
       o->model.AddTo(app);
       app.add_option("--device", o->device, "cpu (GPUs once the CUDA backend runs)")
           ->capture_default_str();
       app.add_option("--micro-batches", o->micro_batches, "micro-batch sizes, e.g. 8,16,32")
           ->delimiter(',')
           ->capture_default_str();
       app.add_option("--layouts", o->layouts,
                      "layouts, e.g. dp1,dp2,tp2 (pieces tpN cpN ppN dpN joined by '-')")
           ->delimiter(',')
           ->capture_default_str();
       app.add_option("--warmup", o->warmup, "steps not measured")->capture_default_str();
       app.add_option("--steps", o->steps, "measured steps")->capture_default_str();
       app.add_option("--memory-limit-gib", o->memory_limit_gib,
                      "address-space limit of every configuration's processes (RLIMIT_AS)");
       app.add_flag("--recompute", o->recompute, "train with activation recomputation");
       app.add_flag("--zero1", o->zero1, "shard AdamW moments over the data-parallel group");
       app.add_option("--data", o->data, "data.kind of the runs")->capture_default_str();
       app.add_option("--out", o->out, "directory of the job files, logs and tables")
           ->capture_default_str();
       app.add_option("--timeout-seconds", o->timeout_seconds, "per configuration")
           ->capture_default_str();
       return [o] { return RunBench(*o); };
     }});

}  // namespace difftrain::launch
