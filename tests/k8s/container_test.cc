// container/Dockerfile: its stages and base images, that everything it copies exists and is
// in the build context, and that it builds with the project's own scripts; then the CPU
// image built with Debian's podman (no daemon, no registry) and run: `difftrain run` of a
// tiny job as the image's user, writing checkpoints into a mounted directory.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/memory_job.h"
#include "tests/testing/run_command.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunCommand;
using testing::ShellQuote;

const fs::path kSourceDir = DIFFTRAIN_SOURCE_DIR;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct Instruction {
  std::string keyword;  // upper case
  std::string arguments;
};

// The Dockerfile's instructions: comments dropped, continuation lines joined.
std::vector<Instruction> ParseDockerfile(const fs::path& path) {
  std::vector<Instruction> instructions;
  std::istringstream in(ReadFile(path));
  std::string line, pending;
  while (std::getline(in, line)) {
    if (pending.empty() && (line.empty() || line[0] == '#')) continue;
    if (!line.empty() && line.back() == '\\') {
      pending += line.substr(0, line.size() - 1) + " ";
      continue;
    }
    pending += line;
    std::istringstream words(pending);
    Instruction i;
    words >> i.keyword;
    std::getline(words >> std::ws, i.arguments);
    for (char& c : i.keyword)
      c = static_cast<char>(std::toupper(c));
    instructions.push_back(i);
    pending.clear();
  }
  return instructions;
}

std::vector<std::string> Words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;)
    words.push_back(w);
  return words;
}

class DockerfileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    instructions_ = ParseDockerfile(kSourceDir / "container/Dockerfile");
    ASSERT_FALSE(instructions_.empty());
    std::string stage;
    for (const Instruction& i : instructions_) {
      if (i.keyword == "ARG" && stage.empty()) {
        const auto eq = i.arguments.find('=');
        args_[i.arguments.substr(0, eq)] =
            eq == std::string::npos ? "" : i.arguments.substr(eq + 1);
      }
      if (i.keyword == "FROM") {
        const std::vector<std::string> w = Words(i.arguments);
        ASSERT_EQ(w.size(), 3u) << "FROM IMAGE AS NAME: " << i.arguments;
        stage = w[2];
        stages_[stage] = w[0];
      } else {
        by_stage_[stage].push_back(i);
      }
    }
  }

  std::vector<Instruction> instructions_;
  std::map<std::string, std::string> args_;    // global ARG -> default
  std::map<std::string, std::string> stages_;  // stage -> base image
  std::map<std::string, std::vector<Instruction>> by_stage_;
};

TEST_F(DockerfileTest, CudaBuildAndRuntimeImagesAreOneCudaVersionAndCpuIsBookwormSlim) {
  EXPECT_EQ(stages_["build-cuda"], "nvidia/cuda:${CUDA_VERSION}-cudnn-devel-${CUDA_OS}");
  EXPECT_EQ(stages_["runtime-cuda"], "nvidia/cuda:${CUDA_VERSION}-cudnn-runtime-${CUDA_OS}");
  EXPECT_EQ(stages_["build-cpu"], "debian:bookworm-slim");
  EXPECT_EQ(stages_["runtime-cpu"], "debian:bookworm-slim");
  EXPECT_EQ(stages_["build"], "build-${VARIANT}");
  EXPECT_EQ(stages_["runtime"], "runtime-${VARIANT}");
  EXPECT_EQ(args_["VARIANT"], "cuda");
  EXPECT_EQ(instructions_.back().keyword, "CMD") << "the last stage is the image";
}

// The CUDA the image builds with is the CUDA the project is built with on its machines.
TEST_F(DockerfileTest, CudaVersionIsTheMachinesCuda) {
  const testing::CommandResult nvcc = RunCommand("/usr/local/cuda/bin/nvcc --version");
  std::smatch m;
  if (nvcc.exit_code != 0 ||
      !std::regex_search(nvcc.output, m, std::regex(R"(release (\d+\.\d+))"))) {
    GTEST_SKIP() << "no CUDA on this machine to compare CUDA_VERSION with";
  }
  EXPECT_EQ(args_["CUDA_VERSION"].rfind(m[1].str() + ".", 0), 0u)
      << "CUDA_VERSION " << args_["CUDA_VERSION"] << " vs nvcc's " << m[1];
}

TEST_F(DockerfileTest, BuildStageRunsTheProjectsInstallScriptAndMakefile) {
  std::vector<std::string> runs;
  for (const Instruction& i : by_stage_["build"]) {
    if (i.keyword == "RUN") runs.push_back(i.arguments);
  }
  // The packages first (a layer that changes only with the package list), then the build.
  EXPECT_EQ(runs, (std::vector<std::string>{
                      "DIFFTRAIN_DEPS=build /tmp/install-deps.sh && rm /tmp/install-deps.sh",
                      "container/build.sh /build"}));

  // build.sh: the dependency script and the Makefile's configure step, as `make build`.
  std::vector<std::string> commands;
  std::istringstream script(ReadFile(kSourceDir / "container/build.sh"));
  for (std::string line; std::getline(script, line);) {
    if (!line.empty() && line[0] != '#' && line.rfind("set ", 0) != 0) commands.push_back(line);
  }
  EXPECT_THAT(commands, ::testing::Contains("scripts/install-deps.sh"));
  EXPECT_THAT(commands, ::testing::Contains(HasSubstr("make configure BUILD=\"$build_dir\"")));
  EXPECT_THAT(ReadFile(kSourceDir / "Makefile"), HasSubstr("configure: deps"));
  EXPECT_THAT(ReadFile(kSourceDir / "scripts/install-deps.sh"), HasSubstr("DIFFTRAIN_DEPS"));
}

// Every COPY source exists, is inside the build context (the repository) and is not
// excluded by container/Dockerfile.dockerignore; every --from names an earlier stage.
TEST_F(DockerfileTest, EveryCopySourceIsInTheBuildContext) {
  std::vector<std::string> ignored;
  std::istringstream ignore(ReadFile(kSourceDir / "container/Dockerfile.dockerignore"));
  for (std::string line; std::getline(ignore, line);) {
    if (!line.empty() && line[0] != '#') ignored.push_back(line);
  }
  int copies = 0;
  for (const Instruction& i : instructions_) {
    if (i.keyword != "COPY" && i.keyword != "ADD") continue;
    EXPECT_EQ(i.keyword, "COPY") << "ADD fetches URLs and unpacks archives: use COPY";
    std::vector<std::string> w = Words(i.arguments);
    ASSERT_GE(w.size(), 2u) << i.arguments;
    std::string from;
    if (w[0].rfind("--from=", 0) == 0) {
      from = w[0].substr(7);
      w.erase(w.begin());
    }
    w.pop_back();  // the destination
    for (const std::string& source : w) {
      ++copies;
      if (!from.empty()) {
        EXPECT_TRUE(stages_.count(from)) << "COPY --from=" << from << ": no such stage";
        continue;
      }
      const fs::path path = fs::weakly_canonical(kSourceDir / source);
      EXPECT_TRUE(fs::exists(path)) << "COPY " << source << ": not in the repository";
      EXPECT_EQ(path.string().rfind(fs::weakly_canonical(kSourceDir).string(), 0), 0u)
          << "COPY " << source << ": outside the build context";
      for (const std::string& pattern : ignored) {
        EXPECT_NE(source, pattern) << "COPY " << source << " is excluded by the .dockerignore";
      }
    }
  }
  EXPECT_GE(copies, 3);
  // What the build needs is in the context: the .dockerignore drops no source directory.
  for (const char* needed : {"CMakeLists.txt", "Makefile", "scripts", "container", "common",
                             "model", "controller", "worker", "launch", "tests", "bench"}) {
    for (const std::string& pattern : ignored)
      EXPECT_NE(pattern, needed);
  }
}

TEST(RuntimePackagesTest, NamesThePackagesOwningABinarysLibraries) {
  const testing::CommandResult r = RunCommand(
      ShellQuote((kSourceDir / "container/runtime-packages.sh").string()) + " /usr/bin/ninja");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("libc6\n"));
  EXPECT_THAT(r.output, HasSubstr("libstdc++6\n"));
  EXPECT_THAT(r.output, Not(HasSubstr(":")));
}

// The CPU image, built and run for real with Debian's podman (container/build-image.sh: a
// private vfs store on a debian:bookworm-slim made by mmdebstrap, layers and ccache kept in
// ~/.cache/difftrain between runs), as the non-root user the image declares.
class ContainerImageTest : public ::testing::Test {
 protected:
  static constexpr char kTag[] = "difftrain:test-cpu";

  void SetUp() override {
    // Only a machine that cannot make containers at all skips: a container needs new mount,
    // PID and UTS namespaces (as root) or a user namespace besides.
    const std::string probe = ::geteuid() == 0 ? "unshare --mount --pid --uts --fork true"
                                               : "unshare --user --map-root-user --mount true";
    const testing::CommandResult namespaces = RunCommand(probe);
    if (namespaces.exit_code != 0) {
      GTEST_SKIP() << "this machine cannot run containers: `" << probe
                   << "` fails: " << namespaces.output;
    }
  }

  // `podman run` of the image with the options this machine needs (docs/kubernetes.md):
  // the host's network, runc (crun refuses hybrid cgroups) and explicit ulimits.
  static testing::CommandResult Run(const std::string& options, const std::string& command) {
    return RunCommand(ShellQuote((kSourceDir / "container/podman.sh").string()) +
                      " run --rm --network host --ulimit nofile=1024:1024 --ulimit "
                      "nproc=1024:1024 " +
                      options + " " + kTag + " " + command);
  }
  static std::string Inspect(const std::string& format) {
    testing::CommandResult r =
        RunCommand(ShellQuote((kSourceDir / "container/podman.sh").string()) +
                   " image inspect --format " + ShellQuote(format) + " " + kTag);
    while (!r.output.empty() && r.output.back() == '\n')
      r.output.pop_back();
    return r.exit_code == 0 ? r.output : "inspect failed: " + r.output;
  }
};

TEST_F(ContainerImageTest, CpuImageBuildsAndTrainsAsItsUser) {
  const auto start = std::chrono::steady_clock::now();
  const testing::CommandResult build =
      RunCommand(ShellQuote((kSourceDir / "container/build-image.sh").string()) + " " + kTag);
  ASSERT_EQ(build.exit_code, 0) << build.output;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double size_mb = std::stod(Inspect("{{.Size}}")) / 1e6;
  std::cout << "image " << kTag << ": built in " << seconds << " s, " << size_mb << " MB\n";
  // The runtime stage holds the binary and its libraries, not the build's toolchain.
  EXPECT_LT(size_mb, 600) << build.output;
  EXPECT_EQ(Inspect("{{.Config.User}}"), "1000");

  const testing::CommandResult version = Run("", "difftrain --version");
  EXPECT_EQ(version.exit_code, 0) << version.output;
  EXPECT_EQ(version.output, "difftrain 0.1.0\n");
  const testing::CommandResult help = Run("", "difftrain --help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_THAT(help.output, HasSubstr("Run a job on this machine"));
  const testing::CommandResult user = Run("", "id -u");
  EXPECT_EQ(user.output, "1000\n");

  // A tiny job in a mounted directory owned by uid 1000, as the chart's checkpoint volume
  // is: `difftrain run` (controller, worker daemon, two ranks over Gloo) writes its
  // checkpoints there.
  const fs::path dir = fs::temp_directory_path() / ("container_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "tiny.yaml")
      << "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: 32, depth: 2, "
         "num_heads: 4, num_classes: 10}\n"
      << "batch: {micro: 2, global: 4}\n"
      << "optimizer: {lr: 0.001, warmup_steps: 1}\n"
      << "train: {steps: 6, log_every: 1}\n"
      << "parallel: {tp: 2, timeout_seconds: 30}\n"
      << "checkpoint: {dir: /job/ckpt, every: 3, keep: 5}\n"
      << "cluster: {nodes: 1, devices_per_node: 2}\n";
  ASSERT_EQ(::chown(dir.c_str(), 1000, 1000), 0) << std::strerror(errno);
  const testing::CommandResult run =
      Run("-v " + ShellQuote(dir.string() + ":/job"), "difftrain run /job/tiny.yaml");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("final state SUCCEEDED"));
  std::vector<std::string> written;
  for (const auto& e : fs::directory_iterator(dir / "ckpt")) {
    written.push_back(e.path().filename().string());
    struct stat st {};
    ASSERT_EQ(::stat(e.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 1000u) << e.path() << " is not the image user's";
  }
  EXPECT_THAT(written, ::testing::Contains(::testing::MatchesRegex("step-0*6"))) << run.output;
  EXPECT_THAT(written, ::testing::Contains(::testing::MatchesRegex("step-0*3"))) << run.output;

  // Under the container's memory limit (a pod's limits.memory, `podman run --memory`), a job
  // whose arenas need more (1.2 GiB of activations at micro 128) stops with an error naming
  // the limit, not an OOM kill (exit 137). The container's cgroup is its mount's root
  // (model/tensor/host_memory.h).
  std::ofstream(dir / "big.yaml") << testing::MemoryJobYaml(128, 128, 1, "/job/big-ckpt");
  const testing::CommandResult limited =
      Run("--memory 512m --memory-swap 512m -v " + ShellQuote(dir.string() + ":/job"),
          "difftrain train --config /job/big.yaml");
  EXPECT_EQ(limited.exit_code, 2) << limited.output;
  EXPECT_THAT(limited.output, HasSubstr("out of host memory creating the trainer"));
  EXPECT_THAT(limited.output,
              HasSubstr("GiB left of the 0.50 GiB memory limit of this process's cgroup"));
  if (!HasFailure()) fs::remove_all(dir);
}

}  // namespace
}  // namespace difftrain
