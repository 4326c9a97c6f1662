# libFuzzer targets (*_fuzz.cc): the wire decoder, the job-spec parser and the checkpoint
# shard reader. They need clang with -fsanitize=fuzzer, which the GCC build cannot use, so
# each is compiled by clang++ directly from the few sources it needs (cmake/fuzz_step.sh), and
# `ctest` runs each for a few seconds. Without a working clang the tests report themselves
# skipped with the reason.
set(DIFFTRAIN_FUZZ_SECONDS 4 CACHE STRING "Seconds each fuzz target runs in ctest")
# The sources a target drives compile at -O0 by default: two thirds of -O1's compile time, for
# the few seconds `make test` runs each target (the eight targets' compiles were a minute more
# of the build at -O1); -O1 runs more inputs a second, for long runs (docs/benchmarks.md).
set(DIFFTRAIN_FUZZ_OPT -O0 CACHE STRING "Optimization of the sources a fuzz target drives")
find_program(DIFFTRAIN_FUZZ_CXX NAMES clang++ clang++-16 clang++-15 clang++-14)
set(fuzz_skip_reason "")
if(NOT DIFFTRAIN_FUZZ_CXX)
  set(fuzz_skip_reason "no clang++ found")
else()
  file(WRITE ${CMAKE_BINARY_DIR}/fuzz/probe.cc
    "#include <cstddef>\n#include <cstdint>\n"
    "extern \"C\" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n")
  execute_process(
    COMMAND ${DIFFTRAIN_FUZZ_CXX} -fsanitize=fuzzer,address -fopenmp ${CMAKE_BINARY_DIR}/fuzz/probe.cc
            -o ${CMAKE_BINARY_DIR}/fuzz/probe
    RESULT_VARIABLE probe_result OUTPUT_QUIET ERROR_VARIABLE probe_error)
  if(NOT probe_result EQUAL 0)
    string(REGEX REPLACE "['\n\"]" " " probe_error "${probe_error}")
    set(fuzz_skip_reason "${DIFFTRAIN_FUZZ_CXX} cannot link -fsanitize=fuzzer: ${probe_error}")
  endif()
endif()

# `make build` configures on every call: a script rewritten with the same text would still
# get a new mtime and re-link the targets that depend on it. Only a change is written.
function(difftrain_write_if_changed path content)
  if(EXISTS ${path})
    file(READ ${path} old)
    if(old STREQUAL content)
      return()
    endif()
  endif()
  file(WRITE ${path} "${content}")
endfunction()

# tests/fuzz/precompiled.h, precompiled for the sources of one optimization level, and the
# object holding the code of its inline functions and templates (clang's -fpch-codegen), which
# every target with a source of that level links. Sets PCH and OBJECT to their paths. The
# eleven targets compiled in 166 CPU s where they took 335 with each source parsing and
# generating that code again (docs/benchmarks.md). If it fails to build, every target's test
# fails with its errors.
function(difftrain_fuzz_pch level compile pch_var object_var)
  set(dir ${CMAKE_BINARY_DIR}/fuzz/objects${level})
  set(pch ${dir}/precompiled.pch)
  set(object ${dir}/precompiled.o)
  get_property(made GLOBAL PROPERTY difftrain_fuzz_pchs)
  if(NOT pch IN_LIST made)
    set_property(GLOBAL APPEND PROPERTY difftrain_fuzz_pchs ${pch})
    file(MAKE_DIRECTORY ${dir})
    set(step ${CMAKE_SOURCE_DIR}/cmake/fuzz_step.sh)
    add_custom_command(
      OUTPUT ${pch}
      COMMAND sh ${step} compile ${pch} ${CMAKE_SOURCE_DIR}/tests/fuzz/precompiled.h ${compile}
        ${level} -fpch-codegen -fpch-instantiate-templates -x c++-header
      DEPENDS ${CMAKE_SOURCE_DIR}/tests/fuzz/precompiled.h ${step}
      DEPFILE ${pch}.d
      COMMENT "Precompiling tests/fuzz/precompiled.h for fuzz targets (${level})")
    add_custom_command(
      OUTPUT ${object}
      COMMAND sh ${step} compile ${object} ${pch} ${compile} ${level}
      DEPENDS ${pch} ${step}
      COMMENT "Compiling the precompiled header's code for fuzz targets (${level})")
  endif()
  set(${pch_var} ${pch} PARENT_SCOPE)
  set(${object_var} ${object} PARENT_SCOPE)
endfunction()

# A fuzz target that fails to build (a new dependency of the parser, say) must not break
# everybody's build: the failure is written down and its test fails with the compiler's
# errors. Once the probe above has linked, such a failure is the target's own (most often a
# source missing from its list below), not the machine's, so it is not a skip: two of the
# three targets once stopped linking and their tests skipped unnoticed.
#
#   difftrain_fuzz_target(NAME "LIBS" SOURCE... [LINKED SOURCE...])
#
# The SOURCEs, the code the fuzzer drives, compile at DIFFTRAIN_FUZZ_OPT with line tables (what
# a sanitizer's stack trace shows). Those after LINKED are only there for the linker (a
# family's model behind the registry the parser reads through): -O0 whatever the option, which
# halves their compile and leaves them instrumented.
#
# Every source compiles once, with the same flags for all targets (OpenMP, OpenBLAS's header),
# and links into each target that names it: the nine targets named safetensors.cc four times
# and posix_file.cc five; 75 compiles instead of 96. LIBS are the target's libraries.
function(difftrain_fuzz_target name libs)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "" "LINKED")
  set(out ${CMAKE_BINARY_DIR}/fuzz/${name})
  set(run_test ${CMAKE_BINARY_DIR}/fuzz/run_${name}.sh)
  if(fuzz_skip_reason STREQUAL "")
    set(compile ${DIFFTRAIN_FUZZ_CXX} -std=c++20 -gline-tables-only
      -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fopenmp
      -I${CMAKE_SOURCE_DIR} -isystem ${OPENBLAS_INCLUDE_DIR})
    set(step ${CMAKE_SOURCE_DIR}/cmake/fuzz_step.sh)
    set(pch_objects "")
    # One ninja edge a source, so that a target's compiles spread over the build's jobs (one
    # script compiling them one after another was the build's last 200 s on two cores) and
    # only what a change touches compiles again (the depfiles).
    set(objects "")
    foreach(src ${arg_UNPARSED_ARGUMENTS} ${arg_LINKED})
      if(src IN_LIST arg_LINKED)
        set(level -O0)
      else()
        set(level ${DIFFTRAIN_FUZZ_OPT})
      endif()
      string(MAKE_C_IDENTIFIER ${src} object)
      set(object ${CMAKE_BINARY_DIR}/fuzz/objects${level}/${object}.o)
      difftrain_fuzz_pch(${level} "${compile}" pch pch_object)
      get_property(made GLOBAL PROPERTY difftrain_fuzz_objects)
      if(NOT object IN_LIST made)
        set_property(GLOBAL APPEND PROPERTY difftrain_fuzz_objects ${object})
        add_custom_command(
          OUTPUT ${object}
          COMMAND sh ${step} compile ${object} ${CMAKE_SOURCE_DIR}/${src} ${compile} ${level}
            -include-pch ${pch}
          DEPENDS ${CMAKE_SOURCE_DIR}/${src} ${step} ${pch}
          DEPFILE ${object}.d
          COMMENT "Compiling ${src} for fuzz targets")
      endif()
      list(APPEND objects ${object})
      list(APPEND pch_objects ${pch_object})
    endforeach()
    list(REMOVE_DUPLICATES pch_objects)
    list(APPEND objects ${pch_objects})
    add_custom_command(
      OUTPUT ${out}.stamp
      COMMAND sh ${step} link ${out} ${out}.stamp ${DIFFTRAIN_FUZZ_CXX}
        -fsanitize=fuzzer,address,undefined -fopenmp ${objects} ${libs}
      DEPENDS ${objects} ${step}
      COMMENT "Linking fuzz target ${name}")
    add_custom_target(${name} ALL DEPENDS ${out}.stamp)
    file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz/${name}-corpus)
    difftrain_write_if_changed(${run_test} "#!/bin/sh
if [ ! -x ${out} ]; then
  echo '${name} did not build with ${DIFFTRAIN_FUZZ_CXX}:'
  grep -m 20 -E 'error|undefined reference' ${out}.error
  exit 1
fi
exec ${out} -max_total_time=${DIFFTRAIN_FUZZ_SECONDS} -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 ${CMAKE_BINARY_DIR}/fuzz/${name}-corpus ${CMAKE_SOURCE_DIR}/tests/fuzz/${name}
")
    add_test(NAME ${name} COMMAND sh ${run_test})
  else()
    add_test(NAME ${name} COMMAND sh -c "echo 'skipped: ${fuzz_skip_reason}'; exit 77")
  endif()
  # One OpenMP thread: an input's run is then the same every time it is replayed, and ctest
  # runs other tests on the other core.
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 ENVIRONMENT OMP_NUM_THREADS=1)
endfunction()

difftrain_fuzz_target(wire_fuzz "-lfmt" common/wire_fuzz.cc common/wire.cc)
# The job spec reads the model section through the model families, whose registry links
# each family's model (for DiT: its CPU kernels, and OpenBLAS).
difftrain_fuzz_target(job_spec_fuzz
  "-lfmt;-lyaml-cpp;-lz;${OPENBLAS_LIBRARY}"
  controller/job_spec_fuzz.cc job/job_spec.cc common/yaml_fields.cc common/json_read.cc
  common/cluster_config.cc model/family/registry.cc
  model/dit/family.cc model/dit/config.cc model/latte/family.cc model/unet/family.cc
  model/unet/config.cc model/train/planner.cc model/train/planner_unet.cc
  model/train/lora_config.cc model/train/textual_inversion_config.cc
  LINKED model/family/model.cc model/dit/dit.cc model/dit/params.cc model/dit/shard.cc
  model/cpu/activation.cc model/cpu/attention.cc model/cpu/embed.cc model/cpu/layernorm.cc
  model/cpu/linear.cc model/cpu/modulate.cc model/parallel/mappings.cc
  model/diffusion/gaussian_diffusion.cc model/optim/adamw.cc model/train/gpu_step.cc
  model/device.cc model/tensor/tensor_table.cc model/tensor/host_memory.cc model/unet/plan.cc
  model/unet/unet.cc model/unet/layers.cc model/unet/resnet.cc model/unet/transformer.cc
  model/cpu/conv2d.cc model/cpu/groupnorm.cc model/cpu/affine.cc model/cpu/upsample.cc
  model/dit/diffusers.cc model/io/diffusers_dit.cc model/io/ldm_checkpoint.cc
  model/diffusion/sampler_kind.cc model/io/safetensors.cc model/io/posix_file.cc)
difftrain_fuzz_target(checkpoint_fuzz "-lfmt;-lz"
  tests/fuzz/checkpoint_fuzz.cc model/io/safetensors.cc model/io/posix_file.cc
  model/tensor/tensor_table.cc)
difftrain_fuzz_target(tokenizer_fuzz "-lfmt;-licuuc"
  tests/fuzz/tokenizer_fuzz.cc model/text/tokenizer.cc model/text/clip_bpe.cc
  model/text/wordpiece.cc model/text/unicode.cc common/json_read.cc)
difftrain_fuzz_target(image_fuzz "-lfmt;-lpng;-ljpeg"
  tests/fuzz/image_fuzz.cc model/io/image.cc model/io/png.cc model/io/posix_file.cc)
difftrain_fuzz_target(lora_fuzz
  "-lfmt;-lz;${OPENBLAS_LIBRARY}"
  tests/fuzz/lora_fuzz.cc model/io/lora.cc model/io/ldm_checkpoint.cc model/io/safetensors.cc
  model/io/posix_file.cc model/tensor/tensor_table.cc)
difftrain_fuzz_target(config_fuzz "-lfmt"
  tests/fuzz/config_fuzz.cc model/unet/config.cc model/unet/plan.cc model/text/config.cc
  model/vae/config.cc model/dit/config.cc model/dit/diffusers.cc common/json_read.cc LINKED model/tensor/tensor_table.cc)
difftrain_fuzz_target(scheduler_fuzz "-lfmt"
  tests/fuzz/scheduler_fuzz.cc model/diffusion/gaussian_diffusion.cc
  model/diffusion/timestep_spacing.cc model/diffusion/dpm_solver.cc model/diffusion/deis.cc
  model/diffusion/unipc.cc model/diffusion/lcm.cc model/diffusion/sampler_kind.cc
  model/diffusion/sampler.cc model/diffusion/multistep_samplers.cc common/json_read.cc
  LINKED model/diffusion/guided_model.cc model/diffusion/vb_loss.cc)
difftrain_fuzz_target(text_table_fuzz "-lfmt;-lz"
  tests/fuzz/text_table_fuzz.cc model/data/text_table.cc model/io/safetensors.cc
  model/io/posix_file.cc model/tensor/tensor_table.cc)
difftrain_fuzz_target(single_file_fuzz "-lfmt;-lz"
  tests/fuzz/single_file_fuzz.cc model/io/ldm_checkpoint.cc model/io/safetensors.cc
  model/io/posix_file.cc model/unet/config.cc model/unet/plan.cc model/vae/config.cc
  common/json_read.cc LINKED model/tensor/tensor_table.cc)
difftrain_fuzz_target(latent_folder_fuzz "-lfmt;-lz;-lpng;-ljpeg"
  tests/fuzz/latent_folder_fuzz.cc model/data/latent_folder.cc model/data/dataset.cc
  model/data/text_table.cc model/io/safetensors.cc model/io/posix_file.cc common/json_read.cc
  LINKED model/tensor/tensor_table.cc model/data/fashion_mnist.cc
  model/data/moving_fashion_mnist.cc model/data/image_folder.cc model/io/image.cc
  model/io/png.cc model/io/resample.cc)
