// The samplers that follow diffusers' schedulers beyond DDPM and DDIM: PNDM; Euler, Euler
// ancestral, Heun and LMS on Euler's steps; DPM-Solver++ (and its SDE), multistep and
// singlestep; DPM-Solver SDE; DEIS; UniPC (sampler.h; their steps in timestep_spacing.h,
// dpm_solver.h, deis.h and unipc.h).
#include <algorithm>
#include <cmath>
#include <deque>
#include <utility>
#include <vector>

#include "model/diffusion/guided_model.h"
#include "model/diffusion/sampler.h"
#include "model/tensor/rng.h"

namespace difftrain {
namespace {

// The x0's the guided model implies at `at` (x in Euler's scale, √(σ² + 1) times the model's
// input; N samples of n) and σ: the model runs on x = at/√(σ² + 1), its output read as ε or v.
void EulerX0(GuidedModel& guided, bool v_prediction, const std::vector<double>& at, double sigma,
             float timestep, int N, size_t n, float* x, std::vector<double>& x0) {
  const double scale = std::sqrt(sigma * sigma + 1);
  for (size_t e = 0; e < at.size(); ++e)
    x[e] = static_cast<float>(at[e] / scale);
  guided.Run(x, timestep);
  for (int b = 0; b < N; ++b) {
    for (size_t j = 0; j < n; ++j) {
      const size_t e = b * n + j;
      const double out = guided.Output(b, j), v = at[e];
      x0[e] = v_prediction ? out * (-sigma / scale) + v / (scale * scale) : v - sigma * out;
    }
  }
}

// x_T [count] in Euler's scale, √(σ² + 1) times the model's input: times the initial σ.
std::vector<double> InEulerScale(const float* x, size_t count, double initial) {
  std::vector<double> state(x, x + count);
  for (double& v : state)
    v *= initial;
  return state;
}

}  // namespace

void Sampler::DenoisePlms(const Denoiser& model, const int32_t* y, int N, float* x,
                          ImageKeeper& keeper) const {
  const size_t n = size_t(shape_.frames) * shape_.channels * shape_.height * shape_.width;
  GuidedModel guided(model, shape_, options_, y, N);
  // The model's (guided) outputs of the calls so far, the newest last, at most 4 kept; and x
  // where the first call started, which the second call's step starts from again.
  std::vector<std::vector<double>> history;
  std::vector<float> first_x(x, x + N * n);
  for (size_t k = 0; k < plms_calls_.size(); ++k) {
    const PlmsCall& call = plms_calls_[k];
    // The second call's timestep is its step's end (it redoes the first step).
    keeper.Keep(x, AtAlphaCumprod(k == 1 ? call.alpha_cumprod_prev : call.alpha_cumprod));
    guided.Run(x, static_cast<float>(call.timestep));
    std::vector<double> out(N * n);
    for (int b = 0; b < N; ++b) {
      for (size_t j = 0; j < n; ++j)
        out[b * n + j] = guided.Output(b, j);
    }
    if (k == 1) {
      // The second call corrects the first step: again from its x, with the mean of the two
      // outputs (a second-order step).
      for (size_t e = 0; e < out.size(); ++e)
        out[e] = (out[e] + history.back()[e]) / 2;
      std::copy(first_x.begin(), first_x.end(), x);
    } else {
      if (history.size() == 4) history.erase(history.begin());
      history.push_back(out);
      // Adams–Bashforth of the outputs so far, to fourth order.
      const auto& h = history;
      const size_t m = h.size();
      for (size_t e = 0; e < out.size(); ++e) {
        if (m == 2) {
          out[e] = (3 * h[1][e] - h[0][e]) / 2;
        } else if (m == 3) {
          out[e] = (23 * h[2][e] - 16 * h[1][e] + 5 * h[0][e]) / 12;
        } else if (m == 4) {
          out[e] = (55 * h[3][e] - 59 * h[2][e] + 37 * h[1][e] - 9 * h[0][e]) / 24;
        }
      }
    }
    // PNDM's transfer from ᾱ_t to ᾱ_prev with ε (v-prediction: ε of v at the step's x).
    const double a = call.alpha_cumprod, a_prev = call.alpha_cumprod_prev;
    const double sample_coeff = std::sqrt(a_prev / a);
    const double denominator = a * std::sqrt(1 - a_prev) + std::sqrt(a * (1 - a) * a_prev);
    for (size_t e = 0; e < out.size(); ++e) {
      const double eps = v_prediction_ ? std::sqrt(a) * out[e] + std::sqrt(1 - a) * x[e] : out[e];
      x[e] = static_cast<float>(sample_coeff * x[e] - (a_prev - a) * eps / denominator);
    }
  }
  keeper.Finish(x);
}

void Sampler::DenoiseEuler(const Denoiser& model, const int32_t* y, int N, int64_t first_index,
                           float* x, ImageKeeper& keeper) const {
  const size_t frame = size_t(shape_.channels) * shape_.height * shape_.width;
  const size_t n = shape_.frames * frame;
  GuidedModel guided(model, shape_, options_, y, N);
  std::vector<double> state = InEulerScale(x, N * n, InitialScale());
  // The slope (x − x0)/σ of the ODE at σ, from the model called on `at` (in Euler's scale).
  std::vector<double> slope(N * n), predicted(N * n), x0(N * n);
  const auto slopes = [&](const std::vector<double>& at, double sigma, float timestep,
                          bool average) {
    EulerX0(guided, v_prediction_, at, sigma, timestep, N, n, x, x0);
    for (size_t e = 0; e < at.size(); ++e) {
      const double d = (at[e] - x0[e]) / sigma;
      slope[e] = average ? (slope[e] + d) / 2 : d;
    }
  };
  const bool heun = options_.kind == SamplerKind::kHeun;
  const bool ancestral = options_.kind == SamplerKind::kEulerAncestral ||
                         options_.kind == SamplerKind::kKdpm2Ancestral;
  // LMS: the slopes of the steps so far, the newest first, the last 4 kept.
  constexpr int kLmsOrder = 4;
  std::deque<std::vector<double>> lms_slopes;
  std::vector<Rng> rngs = StepNoiseStreams(options_.seed, first_index, ancestral ? N : 0);
  std::vector<double> noise(ancestral ? n : 0);
  for (size_t k = begin_; k < RunEnd(euler_steps_.size()); ++k) {
    const EulerStep& step = euler_steps_[k];
    double dt = step.sigma_next - step.sigma, up = 0;
    if (ancestral) {
      // To σ_down deterministically, then up to σ' with fresh noise of σ_up.
      const AncestralSigmas split = SplitAncestralStep(step.sigma, step.sigma_next);
      up = split.up;
      dt = split.down - step.sigma;
    }
    keeper.Keep(state.data(), AtEulerSigma(step.sigma));
    slopes(state, step.sigma, step.timestep, /*average=*/false);
    if (step.sigma_mid > 0) {
      // KDPM2: an Euler half step to the midpoint, and the step taken with the slope there. (An
      // inpainting image is noised to the step's end for the midpoint, as diffusers' add_noise
      // reads its σ's there.)
      for (size_t e = 0; e < state.size(); ++e)
        predicted[e] = state[e] + slope[e] * (step.sigma_mid - step.sigma);
      keeper.Keep(predicted.data(), AtEulerSigma(step.sigma_next));
      slopes(predicted, step.sigma_mid, step.timestep_mid, /*average=*/false);
    }
    if (heun && step.sigma_next > 0) {
      // Heun's correction: the slope again at the Euler step's end (at the next step's
      // timestep), and the step taken with the mean of the two.
      for (size_t e = 0; e < state.size(); ++e)
        predicted[e] = state[e] + slope[e] * dt;
      keeper.Keep(predicted.data(), AtEulerSigma(step.sigma_next));
      slopes(predicted, step.sigma_next, euler_steps_[k + 1].timestep, /*average=*/true);
    }
    if (options_.kind == SamplerKind::kLms) {
      lms_slopes.push_front(slope);
      if (static_cast<int>(lms_slopes.size()) > kLmsOrder) lms_slopes.pop_back();
      // The coefficients of the order the step's index allows, as many of them as there are
      // slopes: from a later first step (image to image) the leading ones alone, as
      // diffusers' zip of its coefficients and derivatives takes them.
      const int order = std::min(static_cast<int>(k) + 1, kLmsOrder);
      for (int j = 0; j < std::min(order, static_cast<int>(lms_slopes.size())); ++j) {
        const double c = LmsCoefficient(euler_steps_, static_cast<int>(k), order, j);
        for (size_t e = 0; e < state.size(); ++e)
          state[e] += c * lms_slopes[j][e];
      }
      continue;
    }
    for (size_t e = 0; e < state.size(); ++e)
      state[e] += slope[e] * dt;
    for (int b = 0; up > 0 && b < N; ++b) {
      DrawFrameNoise(rngs[b], noise_correlation_, shape_.frames, frame, noise.data());
      for (size_t j = 0; j < n; ++j)
        state[b * n + j] += up * noise[j];
    }
  }
  keeper.Finish(state.data());
  for (size_t e = 0; e < state.size(); ++e)
    x[e] = static_cast<float>(state[e]);
}

void Sampler::DenoiseDpmSde(const Denoiser& model, const int32_t* y, int N, int64_t first_index,
                            float* x, ImageKeeper& keeper) const {
  const size_t frame = size_t(shape_.channels) * shape_.height * shape_.width;
  const size_t n = shape_.frames * frame;
  GuidedModel guided(model, shape_, options_, y, N);
  std::vector<double> state = InEulerScale(x, N * n, InitialScale());
  std::vector<double> x0(N * n), mid(N * n);
  // Each step's two draws: the Brownian increments over [σ_mid, σ] and [σ', σ_mid], each over
  // the root of its length.
  std::vector<Rng> rngs = StepNoiseStreams(options_.seed, first_index, N);
  std::vector<double> z1(N * n), z2(N * n);
  for (size_t k = begin_; k < euler_steps_.size(); ++k) {
    const EulerStep& step = euler_steps_[k];
    const double sigma = step.sigma;
    keeper.Keep(state.data(), AtEulerSigma(sigma));
    EulerX0(guided, v_prediction_, state, sigma, step.timestep, N, n, x, x0);
    if (step.sigma_next == 0) {
      state = x0;  // Euler's last step, to σ = 0
      continue;
    }
    for (int b = 0; b < N; ++b) {
      DrawFrameNoise(rngs[b], noise_correlation_, shape_.frames, frame, z1.data() + b * n);
      DrawFrameNoise(rngs[b], noise_correlation_, shape_.frames, frame, z2.data() + b * n);
    }
    // An ancestral step from x at σ to σ_to, with x0 and the noise `z` of σ_up: deterministic
    // to σ_down, (σ_down/σ) x + (1 − σ_down/σ) x0, then σ_up z.
    const auto ancestral = [&](double to, const std::vector<double>& z, std::vector<double>& into) {
      const AncestralSigmas split = SplitAncestralStep(sigma, to);
      const double keep = split.down / sigma;
      for (size_t e = 0; e < state.size(); ++e)
        into[e] = keep * state[e] + (1 - keep) * x0[e] + split.up * z[e];
    };
    ancestral(step.sigma_mid, z1, mid);
    keeper.Keep(mid.data(), AtEulerSigma(step.sigma_next));  // diffusers' σ there, as KDPM2's
    EulerX0(guided, v_prediction_, mid, step.sigma_mid, step.timestep_mid, N, n, x, x0);
    // The increment over [σ', σ] is the sum of the two, the first shared with the midpoint's
    // (diffusers draws both from one Brownian tree).
    const double first = std::sqrt(sigma - step.sigma_mid);
    const double second = std::sqrt(step.sigma_mid - step.sigma_next);
    const double whole = std::sqrt(sigma - step.sigma_next);
    for (size_t e = 0; e < z2.size(); ++e)
      z2[e] = (first * z1[e] + second * z2[e]) / whole;
    ancestral(step.sigma_next, z2, state);
  }
  keeper.Finish(state.data());
  for (size_t e = 0; e < state.size(); ++e)
    x[e] = static_cast<float>(state[e]);
}

void Sampler::DenoiseDpm(const Denoiser& model, const int32_t* y, int N, int64_t first_index,
                         float* x, ImageKeeper& keeper) const {
  const size_t n = size_t(shape_.frames) * shape_.channels * shape_.height * shape_.width;
  GuidedModel guided(model, shape_, options_, y, N);
  const size_t frame = n / shape_.frames;
  // x, and the last two steps' x0's.
  std::vector<double> state(x, x + N * n), previous(N * n), previous2(N * n);
  // The SDE's noise, from the samples' step noise streams.
  std::vector<Rng> rngs = StepNoiseStreams(options_.seed, first_index, options_.dpm.sde ? N : 0);
  std::vector<double> noise(options_.dpm.sde ? N * n : 0);
  // α = 1/√(σ² + 1), σ_t = σ·α and λ = log α − log σ_t of a step's σ.
  struct Scale {
    double alpha, sigma_t, lambda;
  };
  const auto scale = [](double sigma) {
    const double alpha = 1 / std::sqrt(sigma * sigma + 1);
    return Scale{alpha, sigma * alpha, std::log(alpha) - std::log(sigma * alpha)};
  };
  for (size_t k = begin_; k < RunEnd(dpm_steps_.size()); ++k) {
    const DpmStep& step = dpm_steps_[k];
    if (keeper.Keep(state.data(), AtSigma(step.sigma))) keeper.Blend(x, AtSigma(step.sigma));
    guided.Run(x, static_cast<float>(step.timestep));
    const Scale s = scale(step.sigma);
    const bool to_data = step.sigma_next == 0;
    const Scale t = to_data ? Scale{1, 0, 0} : scale(step.sigma_next);
    const double h = t.lambda - s.lambda, expm = std::exp(-h) - 1;
    const double lambda_prev = step.order >= 2 ? scale(step.sigma_prev).lambda : 0;
    const double r0 = step.order >= 2 ? (s.lambda - lambda_prev) / h : 1;
    const double r1 = step.order == 3 ? (lambda_prev - scale(step.sigma_prev2).lambda) / h : 1;
    // The SDE's factors: e^{−h}, 1 − e^{−2h}.
    const double decay = std::exp(-h), spread = -std::expm1(-2 * h);
    const bool noisy = options_.dpm.sde && !to_data;
    for (int b = 0; noisy && b < N; ++b)
      DrawFrameNoise(rngs[b], noise_correlation_, shape_.frames, frame, noise.data() + b * n);
    for (int b = 0; b < N; ++b) {
      for (size_t j = 0; j < n; ++j) {
        const size_t e = b * n + j;
        const double out = guided.Output(b, j), v = state[e];
        const double m =
            v_prediction_ ? s.alpha * v - s.sigma_t * out : (v - s.sigma_t * out) / s.alpha;
        const double d1 = step.order >= 2 ? (m - previous[e]) / r0 : 0;
        double next = m;  // to σ = 0: the data prediction itself
        if (noisy) {
          next = t.sigma_t / s.sigma_t * decay * v + t.alpha * spread * m +
                 t.sigma_t * std::sqrt(spread) * noise[e];
          if (step.order == 2) {
            next += options_.dpm.heun ? t.alpha * (spread / (-2 * h) + 1) * d1
                                      : 0.5 * t.alpha * spread * d1;
          }
        } else if (!to_data) {
          next = t.sigma_t / s.sigma_t * v - t.alpha * expm * m;
          if (step.order == 2) {
            next += options_.dpm.heun ? t.alpha * (expm / h + 1) * d1 : -0.5 * t.alpha * expm * d1;
          } else if (step.order == 3) {
            const double d1_1 = (previous[e] - previous2[e]) / r1;
            const double D1 = d1 + r0 / (r0 + r1) * (d1 - d1_1), D2 = (d1 - d1_1) / (r0 + r1);
            next += t.alpha * (expm / h + 1) * D1 - t.alpha * ((expm + h) / (h * h) - 0.5) * D2;
          }
        }
        state[e] = next;
        previous2[e] = previous[e];
        previous[e] = m;
      }
    }
    for (size_t e = 0; e < state.size(); ++e)
      x[e] = static_cast<float>(state[e]);
  }
  keeper.Finish(x);
}

void Sampler::DenoiseLinear(const Denoiser& model, const int32_t* y, int N, float* x,
                            ImageKeeper& keeper) const {
  const size_t n = size_t(shape_.frames) * shape_.channels * shape_.height * shape_.width;
  GuidedModel guided(model, shape_, options_, y, N);
  // DEIS integrates ε's, DPM-Solver++ x0's.
  const bool to_eps = options_.kind == SamplerKind::kDeis;
  // x where the steps restarted last, and the outputs so far, the newest first.
  std::vector<double> state(x, x + N * n), from(N * n);
  std::vector<double> outputs[3] = {std::vector<double>(N * n), std::vector<double>(N * n),
                                    std::vector<double>(N * n)};
  for (size_t k = begin_; k < RunEnd(linear_steps_.size()); ++k) {
    const LinearStep& step = linear_steps_[k];
    if (keeper.Keep(state.data(), AtSigma(step.sigma))) keeper.Blend(x, AtSigma(step.sigma));
    guided.Run(x, static_cast<float>(step.timestep));
    const double a = 1 / std::sqrt(step.sigma * step.sigma + 1), s = step.sigma * a;
    std::swap(outputs[2], outputs[1]);
    std::swap(outputs[1], outputs[0]);
    if (step.restart) from = state;
    for (int b = 0; b < N; ++b) {
      for (size_t j = 0; j < n; ++j) {
        const size_t e = b * n + j;
        const double out = guided.Output(b, j), v = state[e];
        double& o = outputs[0][e];
        if (to_eps) {
          o = v_prediction_ ? a * out + s * v : out;
        } else {
          o = v_prediction_ ? a * v - s * out : (v - s * out) / a;
        }
        state[e] = step.from_x * from[e] + step.outputs[0] * o + step.outputs[1] * outputs[1][e] +
                   step.outputs[2] * outputs[2][e];
      }
    }
    for (size_t e = 0; e < state.size(); ++e)
      x[e] = static_cast<float>(state[e]);
  }
  keeper.Finish(x);
}

void Sampler::DenoiseUniPc(const Denoiser& model, const int32_t* y, int N, float* x,
                           ImageKeeper& keeper) const {
  const size_t n = size_t(shape_.frames) * shape_.channels * shape_.height * shape_.width;
  GuidedModel guided(model, shape_, options_, y, N);
  std::vector<double> state(x, x + N * n);
  // The model's x0's of the steps so far, the newest first (up to the solver's order), with
  // their σ's; and x before the last predictor, where its corrector starts again.
  std::deque<std::vector<double>> x0s;
  std::deque<double> x0_sigmas;
  std::vector<double> last_state, current(N * n);
  const auto lambda = [](double sigma) { return -std::log(sigma); };
  const auto alpha = [](double sigma) { return 1 / std::sqrt(sigma * sigma + 1); };
  // One step of order p from σ_s (x0s's newest, m_0) to σ_t, from x, with the newer x0
  // `corrected` for a corrector: x' = (σ_t α_t)/(σ_s α_s) x − α_t (e^{−h} − 1) m_0 − α_t B(h)
  // Σ ρ_i D_i.
  const auto step_from = [&](const std::vector<double>& from, double sigma_s, double sigma_t, int p,
                             const std::vector<double>* corrected) {
    const double h = lambda(sigma_t) - lambda(sigma_s);
    if (h == 0) return from;  // Karras's repeated last σ: nothing to step
    std::vector<double> r;
    for (int i = 1; i < p; ++i)
      r.push_back((lambda(x0_sigmas[i]) - lambda(sigma_s)) / h);
    if (corrected) r.push_back(1.0);
    const std::vector<double> rho = UniPcRhos(r, -h, options_.unipc.bh2, corrected != nullptr);
    const double a_t = alpha(sigma_t), a_s = alpha(sigma_s);
    const double ratio = (sigma_t * a_t) / (sigma_s * a_s), h_phi_1 = std::expm1(-h);
    const double B = options_.unipc.bh2 ? h_phi_1 : -h;
    const std::vector<double>& m0 = x0s[0];
    std::vector<double> to(from.size());
    for (size_t e = 0; e < from.size(); ++e) {
      double residual = 0;
      for (int i = 1; i < p; ++i)
        residual += rho[i - 1] * (x0s[i][e] - m0[e]) / r[i - 1];
      if (corrected) residual += rho.back() * ((*corrected)[e] - m0[e]);
      to[e] = ratio * from[e] - a_t * h_phi_1 * m0[e] - a_t * B * residual;
    }
    return to;
  };
  for (size_t k = begin_; k < RunEnd(unipc_steps_.size()); ++k) {
    const UniPcStep& step = unipc_steps_[k];
    if (keeper.Keep(state.data(), AtSigma(step.sigma))) keeper.Blend(x, AtSigma(step.sigma));
    guided.Run(x, static_cast<float>(step.timestep));
    const double a = alpha(step.sigma), s = step.sigma * a;
    for (int b = 0; b < N; ++b) {
      for (size_t j = 0; j < n; ++j) {
        const size_t e = b * n + j;
        const double out = guided.Output(b, j), v = state[e];
        current[e] = v_prediction_ ? a * v - s * out : (v - s * out) / a;
      }
    }
    if (step.corrector) {
      // The last step again, from where it started, with this call's x0 as well.
      state = step_from(last_state, x0_sigmas[0], step.sigma, unipc_steps_[k - 1].order, &current);
    }
    x0s.push_front(current);
    x0_sigmas.push_front(step.sigma);
    if (static_cast<int>(x0s.size()) > options_.unipc.order) {
      x0s.pop_back();
      x0_sigmas.pop_back();
    }
    last_state = state;
    state = step_from(state, step.sigma, step.sigma_next, step.order, nullptr);
    for (size_t e = 0; e < state.size(); ++e)
      x[e] = static_cast<float>(state[e]);
  }
  keeper.Finish(x);
}

}  // namespace difftrain
