// The chart's pods, simulated on this machine: the controller pod, two worker pods and the
// samples pod of tests/k8s/values/simulation.yaml run with exactly the command, arguments and
// environment the rendered Jobs give their containers (init containers first), the job trains
// to completion and its checkpoints are sampled. What a cluster would provide is provided locally,
// and only that:
//   - each volume is a directory: the ConfigMap's files, the Secret's files (keys from
//     `difftrain keys`), one shared directory for the checkpoint claim, emptyDirs; a mount
//     path in an argument, a variable or the job spec becomes that directory;
//   - the downward API gives the completion index; $(VAR) expands as the kubelet does;
//   - each pod runs in its own mount and UTS namespace with its pod hostname and an
//     /etc/hosts that maps the controller's Service and the workers' headless-Service names
//     to loopback (in the cluster, DNS maps them to the pods).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/k8s/chart.h"

extern char** environ;

namespace difftrain::k8s {
namespace {

namespace fs = std::filesystem;
using testing::RunCommand;
using testing::ShellQuote;

constexpr char kRelease[] = "sim";
constexpr auto kJobTimeout = std::chrono::seconds(180);

// One simulated pod: its hostname, its volumes as local directories, its processes.
struct Pod {
  std::string hostname;
  int completion_index = -1;  // -1: not an Indexed Job's pod
  fs::path root;
  std::map<std::string, fs::path> volumes;  // volume name -> local directory
};

// $(NAME) expands to a variable defined earlier; $$ is a literal $; anything else stays.
std::string Expand(const std::string& text, const std::map<std::string, std::string>& vars) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 2, "$$") == 0) {
      out += '$';
      ++i;
    } else if (text.compare(i, 2, "$(") == 0 && text.find(')', i) != std::string::npos) {
      const size_t end = text.find(')', i);
      const std::string name = text.substr(i + 2, end - i - 2);
      if (auto it = vars.find(name); it != vars.end()) {
        out += it->second;
        i = end;
      } else {
        out += text[i];
      }
    } else {
      out += text[i];
    }
  }
  return out;
}

class SimulationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const testing::CommandResult help = testing::RunDifftrain("controller --help");
    if (help.exit_code != 0) {
      GTEST_SKIP() << "`difftrain controller --help` fails (exit " << help.exit_code
                   << "): the controller and worker daemons (issue 6) are not in this build yet";
    }
    if (std::string error = PrepareTools(); !error.empty()) FAIL() << error;
    root_ = fs::temp_directory_path() / ("k8s_simulation_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }

  void TearDown() override {
    for (pid_t pid : running_) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    if (!HasFailure() && !root_.empty()) fs::remove_all(root_);
  }

  // The local directory of each volume of `job`'s pod template.
  void MakeVolumes(const YAML::Node& job, Pod& pod) {
    for (const YAML::Node& v : job["spec"]["template"]["spec"]["volumes"]) {
      const std::string name = v["name"].as<std::string>();
      fs::path dir = pod.root / "volumes" / name;
      if (v["persistentVolumeClaim"]) {
        // One claim, shared by every pod that mounts it.
        dir = root_ / "claims" / v["persistentVolumeClaim"]["claimName"].as<std::string>();
        fs::create_directories(dir);
      } else if (v["configMap"]) {
        fs::create_directories(dir);  // filled below, when every volume has its directory
      } else if (v["secret"]) {
        // The Secret the user makes from `difftrain keys --out DIR` (keys.existingSecret).
        fs::create_directories(dir.parent_path());
        fs::copy(keys_, dir, fs::copy_options::recursive);
        for (const fs::directory_entry& f : fs::directory_iterator(dir)) {
          fs::permissions(f.path(), static_cast<fs::perms>(v["secret"]["defaultMode"].as<int>()));
        }
      } else {
        ASSERT_TRUE(v["emptyDir"]) << "volume " << name << " of an unsimulated kind";
        fs::create_directories(dir);
      }
      pod.volumes[name] = dir;
    }
    // The ConfigMap's files; a mount path in them (the job spec's checkpoint.dir) is mapped
    // as in arguments.
    const YAML::Node container = Container(job, "difftrain");
    for (const YAML::Node& v : job["spec"]["template"]["spec"]["volumes"]) {
      if (!v["configMap"]) continue;
      const std::string map_name = v["configMap"]["name"].as<std::string>();
      const YAML::Node map = rendered_.Find("ConfigMap", map_name);
      ASSERT_TRUE(map) << "ConfigMap " << map_name << " is not in the chart";
      for (const YAML::Node& item : v["configMap"]["items"]) {
        std::istringstream in(map["data"][item["key"].as<std::string>()].as<std::string>());
        std::ofstream out(pod.volumes.at(v["name"].as<std::string>()) /
                          item["path"].as<std::string>());
        for (std::string line; std::getline(in, line);) {
          const size_t value = line.find(": ");
          if (value != std::string::npos) {
            line = line.substr(0, value + 2) + MapPaths(line.substr(value + 2), container, pod);
          }
          out << line << "\n";
        }
      }
    }
  }

  // The container's mount paths replaced by their local directories in `text`, where a
  // path starts: at the beginning, or after the '=' of an "--option=PATH".
  static std::string MapPaths(std::string text, const YAML::Node& container, const Pod& pod) {
    const size_t equals = text.find('=');
    const size_t start = text.rfind('/', 0) == 0       ? 0
                         : equals == std::string::npos ? text.size()
                                                       : equals + 1;
    for (const YAML::Node& m : container["volumeMounts"]) {
      const std::string mount = m["mountPath"].as<std::string>();
      const size_t after = start + mount.size();
      if (text.compare(start, mount.size(), mount) == 0 &&
          (after == text.size() || text[after] == '/')) {
        text.replace(start, mount.size(), pod.volumes.at(m["name"].as<std::string>()).string());
        break;
      }
    }
    return text;
  }

  // Starts `container` of `pod` as its pod would, without a shell in the pod's path: argv
  // and the environment are the container's, expanded and mapped. Returns the pid.
  pid_t Start(const YAML::Node& container, const Pod& pod, const std::string& log_name) {
    std::map<std::string, std::string> vars;
    std::vector<std::string> env = {
        "PATH=" + fs::path(DIFFTRAIN_BINARY).parent_path().string() + ":/usr/bin:/bin",
        "HOME=" + (pod.root / "home").string(), "HOSTNAME=" + pod.hostname,
        // ctest's setting for every test on this 2-core machine (CMakeLists.txt).
        "OMP_WAIT_POLICY=passive"};
    for (const YAML::Node& e : container["env"]) {
      std::string value;
      if (e["valueFrom"]) {
        const std::string field = e["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>();
        EXPECT_EQ(field, "metadata.annotations['batch.kubernetes.io/job-completion-index']");
        value = std::to_string(pod.completion_index);
      } else {
        value = MapPaths(Expand(e["value"].as<std::string>(), vars), container, pod);
      }
      vars[e["name"].as<std::string>()] = value;
      env.push_back(e["name"].as<std::string>() + "=" + value);
    }
    std::vector<std::string> argv;
    for (const char* part : {"command", "args"}) {
      for (const std::string& arg : Strings(container[part])) {
        argv.push_back(MapPaths(Expand(arg, vars), container, pod));
      }
    }
    log_ << log_name << ":";
    for (const std::string& a : argv)
      log_ << " " << a;
    log_ << "\n";

    // The pod's namespaces: its hostname, and /etc/hosts with the cluster's names.
    const std::string script =
        "mount --bind \"$HOSTS\" /etc/hosts && hostname \"$POD_HOSTNAME\" && exec \"$@\"";
    std::vector<std::string> wrapper = {"unshare", "--mount", "--uts", "--",
                                        "/bin/sh", "-c",      script,  "pod"};
    wrapper.insert(wrapper.end(), argv.begin(), argv.end());
    std::vector<std::string> wrapper_env = env;
    wrapper_env.push_back("HOSTS=" + (root_ / "hosts").string());
    wrapper_env.push_back("POD_HOSTNAME=" + pod.hostname);

    std::vector<char*> c_argv, c_env;
    for (std::string& s : wrapper)
      c_argv.push_back(s.data());
    c_argv.push_back(nullptr);
    for (std::string& s : wrapper_env)
      c_env.push_back(s.data());
    c_env.push_back(nullptr);
    fs::create_directories(pod.root / "home");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    const std::string log = (root_ / (log_name + ".log")).string();
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    posix_spawn_file_actions_addchdir_np(&actions, (pod.root / "home").c_str());
    pid_t pid = -1;
    const int error = posix_spawnp(&pid, "unshare", &actions, nullptr, c_argv.data(), c_env.data());
    posix_spawn_file_actions_destroy(&actions);
    EXPECT_EQ(error, 0) << "posix_spawnp: " << std::strerror(error);
    if (error == 0) running_.push_back(pid);
    return pid;
  }

  // Waits for `pid` until the deadline; returns its exit code, or -1 on timeout/signal.
  int Wait(pid_t pid, std::chrono::steady_clock::time_point deadline) {
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        std::erase(running_, pid);
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1;
  }

  // Runs the pod's init containers to completion, then starts its main container.
  pid_t StartPod(const YAML::Node& job, Pod& pod) {
    pod.root = root_ / pod.hostname;
    MakeVolumes(job, pod);
    for (const YAML::Node& init : job["spec"]["template"]["spec"]["initContainers"]) {
      const std::string name = pod.hostname + "-" + init["name"].as<std::string>();
      const int code =
          Wait(Start(init, pod, name), std::chrono::steady_clock::now() + std::chrono::seconds(30));
      EXPECT_EQ(code, 0) << "init container " << name << ": " << Log(name);
    }
    return Start(Container(job, "difftrain"), pod, pod.hostname);
  }

  std::string Log(const std::string& name) {
    std::ifstream in(root_ / (name + ".log"));
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  fs::path root_, keys_;
  Rendered rendered_;
  std::vector<pid_t> running_;
  std::ostringstream log_;
};

TEST_F(SimulationTest, ControllerAndTwoWorkerPodsTrainTheJobToCompletion) {
  rendered_ = RenderChart({"-f", "simulation.yaml"}, kRelease);
  ASSERT_EQ(rendered_.exit_code, 0) << rendered_.text;
  const YAML::Node controller_job = rendered_.Find("Job", "sim-difftrain-controller");
  const YAML::Node worker_job = rendered_.Find("Job", "sim-difftrain-worker");
  const YAML::Node samples_job = rendered_.Find("Job", "sim-difftrain-samples");
  ASSERT_TRUE(controller_job && worker_job && samples_job) << rendered_.text;
  const std::string subdomain =
      worker_job["spec"]["template"]["spec"]["subdomain"].as<std::string>();
  const int nodes = worker_job["spec"]["completions"].as<int>();
  ASSERT_EQ(nodes, 2);

  // The user's step before `helm install`: the job's keys (then a Secret).
  keys_ = root_ / "keys";
  const testing::CommandResult keys =
      testing::RunDifftrain("keys --out " + ShellQuote(keys_.string()));
  ASSERT_EQ(keys.exit_code, 0) << keys.output;

  // What the cluster's DNS answers: the controller's Service and each worker's
  // <hostname>.<subdomain> (and the short hostname, as the pod's own /etc/hosts has it).
  std::ofstream hosts(root_ / "hosts");
  hosts << "127.0.0.1 localhost\n127.0.0.1 sim-difftrain-controller\n";
  std::vector<Pod> workers(nodes);
  for (int i = 0; i < nodes; ++i) {
    workers[i].hostname = "sim-difftrain-worker-" + std::to_string(i);  // the Job's pod names
    workers[i].completion_index = i;
    hosts << "127.0.0.1 " << workers[i].hostname << "." << subdomain << " " << workers[i].hostname
          << "\n";
  }
  hosts.close();

  Pod controller;
  controller.hostname = "sim-difftrain-controller-pod";
  const pid_t controller_pid = StartPod(controller_job, controller);
  std::vector<pid_t> worker_pids;
  for (Pod& w : workers)
    worker_pids.push_back(StartPod(worker_job, w));
  Pod sampler;
  sampler.hostname = "sim-difftrain-samples-pod";
  const pid_t sampler_pid = StartPod(samples_job, sampler);
  ASSERT_FALSE(HasFailure()) << log_.str();

  const auto deadline = std::chrono::steady_clock::now() + kJobTimeout;
  const int controller_code = Wait(controller_pid, deadline);
  EXPECT_EQ(controller_code, 0) << log_.str() << "controller:\n" << Log(controller.hostname);
  for (size_t i = 0; i < workers.size(); ++i) {
    EXPECT_EQ(Wait(worker_pids[i], deadline), 0) << workers[i].hostname << ":\n"
                                                 << Log(workers[i].hostname);
  }
  EXPECT_THAT(Log(controller.hostname), ::testing::HasSubstr("-> SUCCEEDED"));
  // The final checkpoint is on the claim, where the chart pointed the job's checkpoint.dir.
  const fs::path checkpoints = root_ / "claims/sim-difftrain-checkpoints" / kRelease;
  std::vector<std::string> written;
  if (fs::exists(checkpoints)) {
    for (const fs::directory_entry& e : fs::directory_iterator(checkpoints)) {
      written.push_back(e.path().filename().string());
    }
  }
  EXPECT_THAT(written, ::testing::Contains(::testing::MatchesRegex("step-0*4")))
      << checkpoints << "\n"
      << Log(controller.hostname);

  // The samples pod sampled both kept checkpoints (checkpoint.keep 2: steps 2 and 4) and
  // ended; rank 0 wrote the run's TensorBoard events and the sampler its grids beside them.
  EXPECT_EQ(Wait(sampler_pid, deadline), 0) << Log(sampler.hostname);
  const fs::path claim = root_ / "claims/sim-difftrain-checkpoints";
  for (const char* step : {"00000002", "00000004"}) {
    EXPECT_TRUE(fs::exists(claim / "sim-samples" / (std::string("grid-step-") + step + ".png")))
        << step << "\n"
        << Log(sampler.hostname);
  }
  for (const fs::path& dir : {claim / "sim-tensorboard", claim / "sim-tensorboard/samples"}) {
    bool events = false;
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
      events |= e.path().filename().string().starts_with("events.out.tfevents.");
    EXPECT_TRUE(events) << dir;
  }
}

}  // namespace
}  // namespace difftrain::k8s
