// container/Dockerfile, checked as far as a machine without a container engine allows:
// its stages and base images, that everything it copies exists and is in the build
// context, and that it builds with the project's own scripts. Where a Docker daemon
// answers, the CPU image is built and run.
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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
  EXPECT_EQ(runs, std::vector<std::string>{"container/build.sh /build"});

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

// Where a Docker daemon answers, the CPU image builds and its difftrain runs.
TEST(ContainerImageTest, CpuImageBuildsAndRuns) {
  if (RunCommand("docker info").exit_code != 0) {
    GTEST_SKIP() << "no Docker daemon answers here (`docker info` fails; nor can the base "
                    "images be pulled: only Debian's and PyPI's registries are reachable)";
  }
  const std::string tag = "difftrain-test:cpu";
  const testing::CommandResult build =
      RunCommand("docker build -f " + ShellQuote((kSourceDir / "container/Dockerfile").string()) +
                 " --build-arg VARIANT=cpu -t " + tag + " " + ShellQuote(kSourceDir.string()));
  ASSERT_EQ(build.exit_code, 0) << build.output;
  const testing::CommandResult run = RunCommand("docker run --rm " + tag + " difftrain --help");
  EXPECT_EQ(run.exit_code, 0) << run.output;
}

}  // namespace
}  // namespace difftrain
