// The Python helpers of the GPU session scripts, which run only where a GPU is lent, checked here
// on what those runs print:
// - bench/ncu_summary.py, which says where a GPU step's time goes, on Nsight Compute CSVs in the
//   two forms ncu writes kernel names: the function name alone (--print-kernel-base function,
//   rows as an H100 run printed them) and its default, demangled with namespaces, template
//   arguments and parameters. An H100 session found the second form read as one kernel named
//   "difftrain::" that held half the step.
// - bench/fastest_attention.py, which picks the flash variant bench/cuda_session.sh times in the
//   whole step from bench_cuda_attention's lines.
// - bench/cuda_dit.sh's flow from the GPU tests to the table, with stand-ins for the GPU
//   programs that print what the real ones print on a GPU (this machine's would skip). An H100
//   session lost its bench to a test program that printed no "note:" line.
// - bench/cuda_session.sh, what a GPU session runs first, over the same kind of stand-ins and
//   stand-ins for nvidia-smi, nvcc, ncu and compute-sanitizer: every step runs and ends well, the
//   fastest flash variant joins the step's attentions, and Latte's step runs with and without the
//   short-sequence kernels.
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "tests/testing/run_command.h"

namespace difftrain::testing {
namespace {

constexpr char kHeader[] =
    R"("ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value")";

// One row of `ncu --csv --metrics gpu__time_duration.sum`.
std::string Row(int id, const std::string& kernel, const std::string& unit,
                const std::string& value) {
  return fmt::format(
      R"csv("{}","4580","bench_cuda_dit","127.0.0.1","{}","1","13","(256, 1, 1)","(512, 1, 1)",)csv"
      R"csv("0","9.0","Command line profiler metrics","gpu__time_duration.sum","{}","{}")csv",
      id, kernel, unit, value);
}

// Runs bench/<script> on a file holding `contents`.
CommandResult RunScript(const std::string& script, const std::string& contents) {
  TempDir dir("bench-script");
  const std::string path = dir.path() + "/input";
  std::ofstream(path) << contents;
  return RunCommand("/usr/bin/python3 " +
                    ShellQuote(std::string(DIFFTRAIN_SOURCE_DIR "/bench/") + script) + " " +
                    ShellQuote(path));
}

CommandResult Summarize(const std::string& csv) {
  return RunScript("ncu_summary.py", "==PROF== Connected to process 4580\n" + csv);
}

TEST(NcuSummaryTest, FunctionNamesGroupByKernelAndCategory) {
  const std::string csv =
      std::string(kHeader) + "\n" + Row(0, "AdamWKernel", "ns", "7,326,000") + "\n" +
      Row(1, "nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", "us", "82.0") + "\n" +
      Row(2, "FlashDkvKernel", "ns", "196,250") + "\n" + Row(3, "FlashDkvKernel", "ns", "196,250") +
      "\n" + Row(4, "LayerNormModulateForwardKernel", "ns", "23,500") + "\n" +
      Row(5, "globalKernelBgradAB_v2", "us", "32.5") + "\n" +
      Row(6, "ZeroRangesKernel", "us", "4.0") + "\n" +
      Row(7, "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1",
          "us", "50.0") +
      "\n";
  const CommandResult r = Summarize(csv);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("8 launches, 7.9 ms of kernel time"), std::string::npos) << r.output;
  // cuDNN's attention kernels are attention, though their names hold an "sm90_" too.
  EXPECT_NE(r.output.find("| 0.44 | attention |"), std::string::npos) << r.output;
  // cuBLASLt's BGRADB epilogue, a kernel of its own, is a bias gradient, not "other".
  EXPECT_NE(r.output.find("| 0.03 | bias gradients |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| 0.39 | 2 | FlashDkvKernel |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| 0.08 | GEMM (cuBLASLt) |"), std::string::npos) << r.output;
  // The gradient arena's zeroing (a step's first micro-batch) goes with the optimizer's passes.
  EXPECT_NE(r.output.find("| 7.33 | optimizer, EMA, gradients |"), std::string::npos) << r.output;
}

// The UNet's kernels: a convolution's columns and their gathering back are a category of their
// own, its bias gradient (the planes' sums) a bias gradient, the residual adds with the norms.
TEST(NcuSummaryTest, TheUNetsConvolutionLayoutIsACategoryOfItsOwn) {
  const std::string csv = std::string(kHeader) + "\n" + Row(0, "Im2colKernel", "us", "120.0") +
                          "\n" + Row(1, "Col2imKernel", "us", "180.0") + "\n" +
                          Row(2, "SumPlanesKernel", "us", "20.0") + "\n" +
                          Row(3, "AddIntoKernel", "us", "30.0") + "\n" +
                          Row(4, "UpsampleKernel", "us", "40.0") + "\n";
  const CommandResult r = Summarize(csv);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("| 0.30 | convolutions' im2col, col2im |"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("| 0.02 | bias gradients |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| 0.03 | norms, modulation, residuals |"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("| 0.04 | embeddings, layout, loss |"), std::string::npos) << r.output;
}

TEST(NcuSummaryTest, DemangledNamesLoseNamespacesTemplatesAndParameters) {
  const std::string csv =
      std::string(kHeader) + "\n" +
      Row(0,
          "void difftrain::cuda::(anonymous namespace)::FlashDqKernel<72, 64>(const "
          "difftrain::cuda::(anonymous namespace)::FlashParams)",
          "ns", "130,000") +
      "\n" +
      Row(1, "void difftrain::cuda::<unnamed>::FlashDqKernel<72, 64>(FlashParams)", "ns",
          "130,000") +
      "\n" +
      Row(2,
          "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_nn>("
          "T1::Params)",
          "us", "10.0") +
      "\n";
  const CommandResult r = Summarize(csv);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("| 0.26 | 2 | FlashDqKernel |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| 0.01 | GEMM (cuBLASLt) |"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("difftrain::"), std::string::npos) << r.output;
}

TEST(NcuSummaryTest, AFileWithoutTheTableIsAnError) {
  const CommandResult r = Summarize("==ERROR== the application returned an error code (1)\n");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("no row names the columns"), std::string::npos) << r.output;
}

// bench_cuda_attention's lines as it prints them (one per kernel; an error line among them):
// the fastest flash variant at 256 tokens whose results matched flash's, not a faster one that
// did not, nor gemm, nor a faster row at another shape, nor bench_cuda_norms's rows.
TEST(FastestAttentionTest, PicksTheFastestFlashVariantThatMatches) {
  const std::string lines =
      R"({"kernel":"flash","matches_first":true,"tokens":256,"forward_ms":2.6,"backward_ms":9.2})"
      "\n"
      R"({"kernel":"flash-pipelined","matches_first":true,"tokens":256,"forward_ms":1.9,"backward_ms":7.4})"
      "\n"
      R"({"kernel":"flash-pipelined-wide","matches_first":true,"tokens":256,"forward_ms":1.5,"backward_ms":7.4})"
      "\n"
      R"({"kernel":"flash-wide","matches_first":false,"tokens":256,"forward_ms":0.9,"backward_ms":1.0})"
      "\n"
      R"({"kernel":"gemm","matches_first":true,"tokens":256,"forward_ms":0.5,"backward_ms":0.5})"
      "\n"
      "bench_cuda_attention: flash-wide differs from flash: out 0.5, dqkv 0.7 relative L2\n"
      R"({"kernel":"flash","matches_first":true,"tokens":16,"forward_ms":0.1,"backward_ms":0.1})"
      "\n"
      // bench_cuda_norms's lines, which bench/cuda_session.sh appends to the same file.
      R"({"kernel":"copy","bytes":2147483648,"ms":0.7,"gb_per_s":3000.0})"
      "\n"
      R"({"kernel":"gated-residual-norm","rows_per_block":16,"tokens":256,"forward_ms":0.04,"backward_ms":0.07})"
      "\n";
  const CommandResult r = RunScript("fastest_attention.py", lines);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "flash-pipelined-wide\n");
}

TEST(FastestAttentionTest, NothingQualifiesIsAnExitOfOne) {
  const CommandResult r =
      RunScript("fastest_attention.py", "bench_cuda_attention: no usable GPU\n");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.output, "");
}

// Writes an executable shell script.
void WriteScript(const std::string& path, const std::string& body) {
  std::ofstream(path) << "#!/bin/sh\n" << body;
  ASSERT_EQ(RunCommand("chmod +x " + ShellQuote(path)).exit_code, 0);
}

TEST(CudaDitScriptTest, TestProgramsWithoutNotesDoNotEndTheRun) {
  TempDir dir("cuda-dit-script");
  const std::string bin = dir.path() + "/bin";
  ASSERT_EQ(RunCommand("mkdir -p " + ShellQuote(bin)).exit_code, 0);
  // What a test program prints on a GPU: a summary, and perhaps the path it took.
  WriteScript(bin + "/cuda_first_test", "echo '[  PASSED  ] 3 tests.'\n");
  WriteScript(bin + "/cuda_second_test",
              "echo 'note: bias gradient of N=8 I=8 O=8: in the GEMM epilogue (BGRADB)'\n"
              "echo '[  PASSED  ] 2 tests.'\n");
  // bench_cuda_dit's JSON row for the micro-batch and attention it is given.
  WriteScript(bin + "/bench_cuda_dit", R"(while [ $# -gt 0 ]; do
  case $1 in --micro-batch) b=$2 ;; --attention) a=$2 ;; --fp8) a=$a+fp8 ;; esac
  shift
done
printf '{"impl": "difftrain", "micro_batch": %s, "attention": "%s", "samples_per_s": 100.0, ' "$b" "$a"
printf '%s' '"tflops": 71.2, "mfu": 0.072, "peak_mem_gib": 1.5, "step_ms_median": 40.0, '
printf '%s' '"gemm_tuning": {"plans": 9, '
printf '%s' '"tuned": 7, "changed": 2, "heuristic_ms_a_step": 34.5, "tuned_ms_a_step": 33.25}, '
echo '"ema": {"own_stream": true, "step_ms_the_other_way": 41.5}}'
)");
  const CommandResult r = RunCommand(
      "CUDA_BENCH_OUT=" + ShellQuote(dir.path() + "/out") + " bash " +
      ShellQuote(std::string(DIFFTRAIN_SOURCE_DIR "/bench/cuda_dit.sh")) + " --prebuilt " +
      ShellQuote(bin) + " --micro-batches 4 --steps 1 --attention flash --no-torch --fp8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // --fp8: each attention again with --fp8 (the stand-in labels its row as bench_cuda_dit does).
  EXPECT_NE(r.output.find("| 4 | flash+fp8 | 100.0 | 71 | 7.2% | 1.5 |"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("cuda_first_test: PASSED  ] 3 tests."), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("note: bias gradient of N=8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| 4 | flash | 100.0 | 71 | 7.2% | 1.5 |"), std::string::npos)
      << r.output;
  // What autotuning found, under the table.
  EXPECT_NE(r.output.find("GEMM autotuning, micro-batch 4 flash: 34.50 ms a step on cuBLASLt's "
                          "first choices, 33.25 tuned (7 of 9 plans timed, 2 changed)"),
            std::string::npos)
      << r.output;
  // And where the EMA ran, both ways.
  EXPECT_NE(r.output.find("EMA, micro-batch 4 flash: 40.00 ms a step on its own stream, 41.50 in "
                          "AdamW's pass"),
            std::string::npos)
      << r.output;
}

// Runs bench/cuda_session.sh over stand-ins for the GPU programs and tools (an H100's
// nvidia-smi, tools that end well) in `dir`, with `env` before it; its OUT is dir/out.
CommandResult RunSessionScript(const TempDir& dir, const std::string& env) {
  const std::string bin = dir.path() + "/bin", tools = dir.path() + "/tools";
  EXPECT_EQ(RunCommand("mkdir -p " + ShellQuote(bin) + " " + ShellQuote(tools)).exit_code, 0);
  WriteScript(bin + "/cuda_dit_test", "echo '[  PASSED  ] 6 tests.'\n");
  WriteScript(bin + "/cuda_attention_test", "echo '[  PASSED  ] 16 tests.'\n");
  // bench_cuda_attention: a row per kernel at the tokens it is given, flash-wide the fastest.
  WriteScript(bin + "/bench_cuda_attention", R"(while [ $# -gt 0 ]; do
  case $1 in --tokens) t=$2 ;; --kernels) k=$2 ;; esac
  shift
done
for kernel in $(echo "$k" | tr , ' '); do
  ms=2.0
  [ "$kernel" = flash-wide ] && ms=1.0
  printf '{"kernel": "%s", "matches_first": true, "tokens": %s, ' "$kernel" "$t"
  printf '"forward_ms": %s, "backward_ms": %s}\n' "$ms" "$ms"
done
)");
  WriteScript(bin + "/bench_cuda_norms", "echo '{\"rows\": 32, \"backward_gbps\": 1900}'\n");
  WriteScript(bin + "/bench_cuda_unet", R"(while [ $# -gt 0 ]; do
  case $1 in --model) m=$2 ;; --attention) a=$2 ;; --micro-batch) b=$2 ;; esac
  shift
done
printf '{"impl": "difftrain", "model": "%s", "attention": "%s", "micro_batch": %s}\n' "$m" "$a" "$b"
)");
  WriteScript(bin + "/bench_cuda_dit", R"(while [ $# -gt 0 ]; do
  case $1 in --micro-batch) b=$2 ;; --attention) a=$2 ;; --model) m=$2 ;; --no-short-attention) s=false ;; --fp8) f=+fp8 ;; esac
  shift
done
a=${a:-flash-pipelined-wide-stored}$f
printf '{"impl": "difftrain", "model": "%s", "micro_batch": %s, "attention": "%s", ' "$m" "$b" "$a"
printf '"short_attention": %s, "samples_per_s": 100.0, "tflops": 71.2, "mfu": 0.072, ' "${s:-true}"
echo '"peak_mem_gib": 1.5}'
)");
  WriteScript(tools + "/nvidia-smi", R"(case "$*" in
  *noheader*) echo 81559 ;;
  *) echo 'name, driver_version, memory.total [MiB]'; echo 'NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB' ;;
esac
)");
  WriteScript(tools + "/nvcc", "echo 'Cuda compilation tools, release 13.0'\n");
  WriteScript(tools + "/ncu", "echo '==PROF== Disconnected'\n");
  WriteScript(tools + "/compute-sanitizer", "echo '========= ERROR SUMMARY: 0 errors'\n");
  return RunCommand(env + " PATH=" + ShellQuote(tools) + ":$PATH TORCH_MODES= CUDA_BENCH_OUT=" +
                    ShellQuote(dir.path() + "/bench") + " bash " +
                    ShellQuote(std::string(DIFFTRAIN_SOURCE_DIR "/bench/cuda_session.sh")) + " " +
                    ShellQuote(bin) + " " + ShellQuote(dir.path() + "/out"));
}

std::string ReadOut(const TempDir& dir, const std::string& name) {
  std::ifstream in(dir.path() + "/out/" + name);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(CudaSessionScriptTest, EveryStepRunsAndLatteTimesBothTemporalAttentions) {
  TempDir dir("cuda-session-script");
  const CommandResult r = RunSessionScript(dir, "");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto read = [&](const std::string& name) { return ReadOut(dir, name); };
  const std::string steps = read("steps.txt");
  EXPECT_NE(steps.find("NVIDIA H100 80GB HBM3, 580.159.04"), std::string::npos) << steps;
  for (const char* step :
       {"attention: exit 0",
        "norms: exit 0",
        "bench: exit 0",
        "compute-sanitizer memcheck CudaDiTTest.TinyStepMatchesTheCpuModel: exit 0",
        "compute-sanitizer racecheck FlashAttentionTest.MatchesTheReference: exit 0",
        "ncu dit: exit 0",
        "ncu unet: exit 0",
        "ncu kernel sections: exit 0",
        "latte --attention flash-pipelined-wide-stored: exit 0",
        "latte --attention flash-pipelined-wide-stored --no-short-attention: exit 0",
        "latte --attention flash-pipelined-wide: exit 0",
        "latte --attention flash-wide: exit 0",
        "attention cudnn: exit 0",
        "latte --attention cudnn: exit 0",
        "unet --model SD2-base --attention flash: exit 0",
        "unet --model SD2-base --attention fused: exit 0",
        "unet --model SD2-base --attention cudnn: exit 0",
        "unet --model SD1.5 --attention flash: exit 0",
        "fp8 --model DiT-XL/2 --micro-batch 32: exit 0",
        "fp8 --model DiT-XL/2 --micro-batch 128: exit 0",
        "fp8 --model Latte-L/2 --frames 16 --num-classes 0 --micro-batch 8 --warmup 3 --steps 10: "
        "exit 0",
        "attentions timed in the step: flash-pipelined-wide-stored,flash-pipelined-wide,"
        "flash-wide,cudnn\n"}) {
    EXPECT_NE(steps.find(step), std::string::npos) << step << " in\n" << steps;
  }
  // The short kernels at Latte's temporal shape only, cuDNN's at DiT's; the step's rows at an
  // H100's micro-batches.
  const std::string attention = read("attention.jsonl");
  const std::string results = read("results.jsonl");
  EXPECT_NE(attention.find(R"("kernel": "flash-short", "matches_first": true, "tokens": 16)"),
            std::string::npos)
      << attention;
  EXPECT_EQ(attention.find(R"("kernel": "flash-short", "matches_first": true, "tokens": 256)"),
            std::string::npos)
      << attention;
  EXPECT_NE(attention.find(R"("kernel": "cudnn", "matches_first": true, "tokens": 256)"),
            std::string::npos)
      << attention;
  EXPECT_NE(results.find(R"("micro_batch": 32, "attention": "cudnn")"), std::string::npos)
      << results;
  EXPECT_NE(results.find(R"("micro_batch": 128, "attention": "flash-wide")"), std::string::npos)
      << results;
  // FP8's rows, with the model's default attention.
  EXPECT_NE(results.find(R"("model": "DiT-XL/2", "micro_batch": 128, "attention": )"
                         R"("flash-pipelined-wide-stored+fp8")"),
            std::string::npos)
      << results;
  // The UNet's rows after the DiT's, at micro-batch 8.
  EXPECT_NE(results.find(R"("model": "SD2-base", "attention": "fused", "micro_batch": 8})"),
            std::string::npos)
      << results;
  const std::string latte = read("latte.jsonl");
  EXPECT_NE(latte.find(R"("attention": "flash-pipelined-wide-stored", "short_attention": false)"),
            std::string::npos)
      << latte;
  EXPECT_NE(latte.find(R"("attention": "flash-pipelined-wide-stored", "short_attention": true)"),
            std::string::npos)
      << latte;
}

// A second call that runs only what a first one left out (PARTS): those steps, no others.
TEST(CudaSessionScriptTest, PartsRunOnlyTheNamedSteps) {
  TempDir dir("cuda-session-parts");
  const CommandResult r = RunSessionScript(dir, "PARTS=latte,unet");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string steps = ReadOut(dir, "steps.txt");
  EXPECT_NE(steps.find("latte --attention flash-pipelined-wide-stored: exit 0"), std::string::npos)
      << steps;
  EXPECT_NE(steps.find("unet --model SD1.5 --attention flash: exit 0"), std::string::npos) << steps;
  for (const char* absent :
       {"\nattention: exit", "\nattention cudnn: exit", "\nnorms: exit", "\nbench: exit",
        "compute-sanitizer", "\nncu dit: exit", "ncu kernel sections", "fp8 --model"}) {
    EXPECT_EQ(steps.find(absent), std::string::npos) << absent << " in\n" << steps;
  }
  EXPECT_NE(ReadOut(dir, "results.jsonl").find(R"("model": "SD2-base", "attention": "flash")"),
            std::string::npos);
}

}  // namespace
}  // namespace difftrain::testing
