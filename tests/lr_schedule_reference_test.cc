// Checks `optimizer.lr_schedule: diffusers_NAME` against diffusers' own schedules (0.27.2):
// tests/reference/lr_schedule.py steps a torch AdamW under get_scheduler(NAME) as
// train_text_to_image.py does, and difftrain's LearningRate must give every step the same rate
// (exactly: both compute lr · lambda(step) in double, in the same order of operations).
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/optim/adamw.h"
#include "tests/testing/python_reference.h"

namespace difftrain::testing {
namespace {

using LrScheduleReferenceTest = DiffusersReference;

TEST_F(LrScheduleReferenceTest, DiffusersSchedulesGiveGetSchedulersRates) {
  struct Case {
    std::string name;
    double lr;
    int64_t warmup, steps, cycles;
    double power;
  };
  // Each schedule with a warm-up, and the edges: no warm-up, a warm-up longer than the run
  // (never decays), three restarts, a power of 2.
  const std::vector<Case> cases = {
      {"constant", 1e-4, 10, 40, 1, 1.0},
      {"constant_with_warmup", 1e-4, 10, 40, 1, 1.0},
      {"constant_with_warmup", 1e-4, 0, 5, 1, 1.0},
      {"linear", 3e-4, 7, 50, 1, 1.0},
      {"linear", 3e-4, 60, 50, 1, 1.0},
      {"cosine", 1e-4, 5, 60, 1, 1.0},
      {"cosine", 2e-5, 0, 33, 1, 1.0},
      {"cosine_with_restarts", 1e-4, 5, 64, 3, 1.0},
      {"cosine_with_restarts", 1e-4, 0, 20, 1, 1.0},
      {"polynomial", 5e-4, 8, 45, 1, 1.0},
      {"polynomial", 5e-4, 8, 45, 1, 2.0},
  };
  nlohmann::json request = nlohmann::json::array();
  for (const Case& c : cases) {
    request.push_back({{"name", c.name},
                       {"lr", c.lr},
                       {"warmup", c.warmup},
                       {"steps", c.steps},
                       {"cycles", c.cycles},
                       {"power", c.power}});
  }
  const std::string in_path = (dir_ / "cases.json").string(),
                    out_path = (dir_ / "rates.json").string();
  std::ofstream(in_path) << request.dump();
  const CommandResult r =
      RunScript("lr_schedule.py", ShellQuote(in_path) + " " + ShellQuote(out_path));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(out_path);
  const nlohmann::json reference = nlohmann::json::parse(in);
  ASSERT_EQ(reference.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.name + " warmup " + std::to_string(c.warmup));
    OptimizerConfig config;
    config.lr = c.lr;
    config.warmup_steps = c.warmup;
    config.lr_schedule = "diffusers_" + c.name;
    config.lr_num_cycles = c.cycles;
    config.lr_power = c.power;
    ASSERT_TRUE(config.Validate().ok()) << config.Validate().message();
    ASSERT_EQ(reference[i].size(), static_cast<size_t>(c.steps));
    for (int64_t step = 0; step < c.steps; ++step) {
      ASSERT_EQ(LearningRate(config, step, c.steps), reference[i][step].get<double>())
          << "step " << step;
    }
  }
}

}  // namespace
}  // namespace difftrain::testing
