// Checks `optimizer.ema_schedule: diffusers` against diffusers' own EMAModel (0.27.2, the average
// train_text_to_image.py's --use_ema keeps): tests/reference/ema.py steps an EMAModel over a
// parameter that changes every step, and difftrain's EmaDecayAt and EmaUpdate must take the same
// decay at every step (exactly: both compute it in double) and keep the same average (within
// fp32's rounding: diffusers writes s − (1 − d)(s − p), difftrain d·s + (1 − d)·p).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/optim/adamw.h"
#include "tests/testing/python_reference.h"

namespace difftrain::testing {
namespace {

class EmaReferenceTest : public DiffusersReference {
 protected:
  // Steps diffusers' EMAModel (ema.py `args`) and difftrain's EmaDecayAt and EmaUpdate under
  // `config` for `steps` steps; both must take the same decays and keep the same average.
  void ExpectSameAsEmaModel(const OptimizerConfig& config, const std::string& args, int steps);
};

void EmaReferenceTest::ExpectSameAsEmaModel(const OptimizerConfig& config, const std::string& args,
                                            int steps) {
  const std::string out = (dir_ / "ema.json").string();
  const CommandResult r = RunScript(
      "ema.py", fmt::format("{} {} {}{}", config.ema_decay, steps, ShellQuote(out), args));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(out);
  const nlohmann::json reference = nlohmann::json::parse(in);
  std::vector<float> ema(4, 0.0f), params(4);
  for (int k = 1; k <= steps; ++k) {
    for (int i = 0; i < 4; ++i)
      params[i] = static_cast<float>(std::sin(0.1 * k * (i + 1)));
    const double d = EmaDecayAt(config, k);
    ASSERT_EQ(d, reference["decays"][k - 1].get<double>()) << "step " << k;
    EmaUpdate(ema.data(), params.data(), 4, d);
    for (int i = 0; i < 4; ++i) {
      ASSERT_NEAR(ema[i], reference["shadow"][k - 1][i].get<double>(), 2e-6)
          << "step " << k << " value " << i;
    }
  }
}

TEST_F(EmaReferenceTest, DiffusersScheduleTakesEMAModelsDecayAndAverage) {
  // 120 steps: under 0.9999 the ramp (1 + s)/(10 + s) alone, under 0.9 the ramp until step 81
  // and the cap after it; both begin with the first update's 0.
  for (const double decay : {0.9999, 0.9}) {
    SCOPED_TRACE(decay);
    OptimizerConfig config;
    config.ema_decay = decay;
    config.ema_schedule = "diffusers";
    ExpectSameAsEmaModel(config, "", 120);
  }
}

TEST_F(EmaReferenceTest, DiffusersWarmupScheduleTakesEMAModelsPowerRamp) {
  // train_unconditional.py's --use_ema: inv_gamma 1, power 3/4, capped at 0.9999; and a
  // slower ramp (inv_gamma 10, power 2/3) capped at 0.5 from step 20 on.
  struct Case {
    double decay, inv_gamma, power;
  };
  for (const Case c : {Case{0.9999, 1.0, 0.75}, Case{0.5, 10.0, 2.0 / 3.0}}) {
    SCOPED_TRACE(c.inv_gamma);
    OptimizerConfig config;
    config.ema_decay = c.decay;
    config.ema_schedule = "diffusers_warmup";
    config.ema_inv_gamma = c.inv_gamma;
    config.ema_power = c.power;
    ExpectSameAsEmaModel(config, fmt::format(" {:.17g} {:.17g}", c.inv_gamma, c.power), 60);
  }
}

}  // namespace
}  // namespace difftrain::testing
