# libFuzzer targets (*_fuzz.cc): the wire decoder, the job-spec parser and the checkpoint
# shard reader. They need clang with -fsanitize=fuzzer, which the GCC build cannot use, so
# each is compiled by clang++
# directly from the few sources it needs, and `ctest` runs each for a few seconds. Without
# a working clang the tests report themselves skipped with the reason.
set(DIFFTRAIN_FUZZ_SECONDS 4 CACHE STRING "Seconds each fuzz target runs in ctest")
find_program(DIFFTRAIN_FUZZ_CXX NAMES clang++ clang++-16 clang++-15 clang++-14)
set(fuzz_skip_reason "")
if(NOT DIFFTRAIN_FUZZ_CXX)
  set(fuzz_skip_reason "no clang++ found")
else()
  file(WRITE ${CMAKE_BINARY_DIR}/fuzz/probe.cc
    "#include <cstddef>\n#include <cstdint>\n"
    "extern \"C\" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n")
  execute_process(
    COMMAND ${DIFFTRAIN_FUZZ_CXX} -fsanitize=fuzzer,address ${CMAKE_BINARY_DIR}/fuzz/probe.cc
            -o ${CMAKE_BINARY_DIR}/fuzz/probe
    RESULT_VARIABLE probe_result OUTPUT_QUIET ERROR_VARIABLE probe_error)
  if(NOT probe_result EQUAL 0)
    string(REGEX REPLACE "['\n\"]" " " probe_error "${probe_error}")
    set(fuzz_skip_reason "${DIFFTRAIN_FUZZ_CXX} cannot link -fsanitize=fuzzer: ${probe_error}")
  endif()
endif()

# Headers the fuzzed code may include (no depfile: one script builds each target).
file(GLOB fuzz_headers CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/common/*.h
  ${CMAKE_SOURCE_DIR}/job/*.h ${CMAKE_SOURCE_DIR}/model/family/*.h
  ${CMAKE_SOURCE_DIR}/model/train/*.h ${CMAKE_SOURCE_DIR}/model/dit/*.h
  ${CMAKE_SOURCE_DIR}/model/cpu/*.h ${CMAKE_SOURCE_DIR}/model/parallel/*.h
  ${CMAKE_SOURCE_DIR}/model/diffusion/*.h ${CMAKE_SOURCE_DIR}/model/optim/*.h
  ${CMAKE_SOURCE_DIR}/model/unet/*.h ${CMAKE_SOURCE_DIR}/model/latte/*.h)

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

# A fuzz target that fails to build (a new dependency of the parser, say) must not break
# everybody's build: the failure is written down and its test reports itself skipped
# with the compiler's message.
#
#   difftrain_fuzz_target(NAME "LIBS" SOURCE... [LINKED SOURCE...])
#
# The SOURCEs, the code the fuzzer drives, compile at -O1 with line tables (what a sanitizer's
# stack trace shows). Those after LINKED are only there for the linker (a family's model
# behind the registry the parser reads through): -O0, which halves their compile and leaves
# them instrumented.
function(difftrain_fuzz_target name libs)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "" "LINKED")
  set(out ${CMAKE_BINARY_DIR}/fuzz/${name})
  set(run_test ${CMAKE_BINARY_DIR}/fuzz/run_${name}.sh)
  if(fuzz_skip_reason STREQUAL "")
    set(sources ${arg_UNPARSED_ARGUMENTS} ${arg_LINKED})
    list(TRANSFORM sources PREPEND ${CMAKE_SOURCE_DIR}/)
    list(JOIN libs " " lib_list)
    set(compile "${DIFFTRAIN_FUZZ_CXX} -std=c++20 -gline-tables-only \
  -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined \
  -Wno-unused-command-line-argument -I${CMAKE_SOURCE_DIR} ${lib_list} -c")
    set(objects "")
    set(commands "")
    foreach(src ${arg_UNPARSED_ARGUMENTS} ${arg_LINKED})
      if(src IN_LIST arg_LINKED)
        set(level -O0)
      else()
        set(level -O1)
      endif()
      string(MAKE_C_IDENTIFIER ${src} object)
      set(object ${out}.objects/${object}.o)
      string(APPEND commands "  ${compile} ${level} ${CMAKE_SOURCE_DIR}/${src} -o ${object} &&
")
      string(APPEND objects " ${object}")
    endforeach()
    set(build_script ${CMAKE_BINARY_DIR}/fuzz/build_${name}.sh)
    difftrain_write_if_changed(${build_script} "#!/bin/sh
rm -rf ${out} ${out}.error ${out}.objects
mkdir -p ${out}.objects
build() {
${commands}  ${DIFFTRAIN_FUZZ_CXX} -fsanitize=fuzzer,address,undefined${objects} ${lib_list} \
    -o ${out}
}
build 2>${out}.error || echo 'warning: fuzz target ${name} did not build (its test will say why)'
rm -rf ${out}.objects
touch ${out}.stamp
")
    add_custom_command(
      OUTPUT ${out}.stamp
      COMMAND sh ${build_script}
      DEPENDS ${sources} ${fuzz_headers} ${build_script}
      COMMENT "Building fuzz target ${name} with ${DIFFTRAIN_FUZZ_CXX}")
    add_custom_target(${name} ALL DEPENDS ${out}.stamp)
    file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz/${name}-corpus)
    difftrain_write_if_changed(${run_test} "#!/bin/sh
if [ ! -x ${out} ]; then
  echo 'skipped: ${name} did not build with ${DIFFTRAIN_FUZZ_CXX}:'; head -20 ${out}.error
  exit 77
fi
exec ${out} -max_total_time=${DIFFTRAIN_FUZZ_SECONDS} -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 ${CMAKE_BINARY_DIR}/fuzz/${name}-corpus ${CMAKE_SOURCE_DIR}/tests/fuzz/${name}
")
    add_test(NAME ${name} COMMAND sh ${run_test})
  else()
    add_test(NAME ${name} COMMAND sh -c "echo 'skipped: ${fuzz_skip_reason}'; exit 77")
  endif()
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77)
endfunction()

difftrain_fuzz_target(wire_fuzz "-lfmt" common/wire_fuzz.cc common/wire.cc)
# The job spec reads the model section through the model families, whose registry links
# each family's model (for DiT: its CPU kernels, and OpenBLAS).
difftrain_fuzz_target(job_spec_fuzz
  "-lfmt;-lyaml-cpp;-fopenmp;-isystem;${OPENBLAS_INCLUDE_DIR};${OPENBLAS_LIBRARY}"
  controller/job_spec_fuzz.cc job/job_spec.cc common/yaml_fields.cc
  common/cluster_config.cc model/family/registry.cc
  model/dit/family.cc model/dit/config.cc model/latte/family.cc model/unet/family.cc
  model/unet/config.cc model/train/planner.cc model/train/planner_unet.cc
  LINKED model/family/model.cc model/dit/dit.cc model/dit/params.cc model/dit/shard.cc
  model/cpu/activation.cc model/cpu/attention.cc model/cpu/embed.cc model/cpu/layernorm.cc
  model/cpu/linear.cc model/cpu/modulate.cc model/parallel/mappings.cc
  model/diffusion/gaussian_diffusion.cc model/optim/adamw.cc model/train/gpu_step.cc
  model/device.cc model/tensor/tensor_table.cc model/tensor/host_memory.cc model/unet/plan.cc
  model/unet/unet.cc model/unet/layers.cc model/unet/resnet.cc model/unet/transformer.cc
  model/cpu/conv2d.cc model/cpu/groupnorm.cc model/cpu/affine.cc model/cpu/upsample.cc)
difftrain_fuzz_target(checkpoint_fuzz "-lfmt;-lz"
  tests/fuzz/checkpoint_fuzz.cc model/io/safetensors.cc model/io/posix_file.cc
  model/tensor/tensor_table.cc)
