# The CUDA backend (docs/cuda.md). EMBER_CUDA: AUTO (the default: on when CMake finds a CUDA
# compiler), ON (required: no compiler is an error) or OFF. With it, src/backend/cuda/*.cu are
# compiled by nvcc for sm_90 (SASS) plus compute_90 PTX into an object library whose objects go
# into ember_core, with the static CUDA runtime (nothing to carry beside the binary but the
# driver's libcuda); src/backend/gpu_none.c is left out. Without it, gpu_none.c answers every
# GPU entry point with "this ember was built without CUDA". Included right after ember_core is
# defined; tests/cuda/ (GPU tests, not run by ctest: CI has no GPU) is built only with CUDA.
set(EMBER_CUDA AUTO CACHE STRING "build the CUDA backend: AUTO (when a CUDA compiler is found), ON, OFF")
set_property(CACHE EMBER_CUDA PROPERTY STRINGS AUTO ON OFF)

set(EM_GPU_NONE ${PROJECT_SOURCE_DIR}/src/backend/gpu_none.c)
set(EM_HAVE_CUDA OFF)
# The libFuzzer build links with clang's -fsanitize=fuzzer, which the CUDA link step (nvcc's
# host g++) does not take; its targets are host parsers, so it is built without CUDA.
if(EMBER_FUZZ AND NOT EMBER_CUDA STREQUAL "OFF")
  message(STATUS "Ember: CUDA backend off in the fuzz build (EMBER_FUZZ)")
elseif(NOT EMBER_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(EM_HAVE_CUDA ON)
  elseif(EMBER_CUDA STREQUAL "ON")
    message(FATAL_ERROR "EMBER_CUDA=ON, but no CUDA compiler was found (put nvcc on PATH or set CMAKE_CUDA_COMPILER)")
  endif()
endif()

if(NOT EM_HAVE_CUDA)
  message(STATUS "Ember: CUDA backend off (EMBER_CUDA=${EMBER_CUDA}); gpu_none.c answers the GPU entry points")
  return()
endif()

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90) # sm_90 SASS + compute_90 PTX
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
message(STATUS "Ember: CUDA backend on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES})")

file(GLOB EM_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.cu)
add_library(ember_cuda OBJECT ${EM_CUDA_SOURCES})
# Not the C flags of the directory (-Wall, sanitizers: nvcc does not take them as they are).
set_target_properties(ember_cuda PROPERTIES COMPILE_OPTIONS "" CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                                            POSITION_INDEPENDENT_CODE OFF)
# --fmad=false: a * b + c rounds twice, as the CPU's C does; fused multiply-adds only where a
# kernel writes __fmaf_rn (docs/cuda.md: width invariance and CPU parity).
# ptxas advises against .multicast::cluster bulk copies (mla.cu's tile, shared by a cluster) in
# plain sm_90 code because some future architectures run them slowly; on sm_90 they are what
# the copy is for, so the advisory is silenced rather than turned into an error.
target_compile_options(ember_cuda PRIVATE --fmad=false -Xcompiler=-Wall,-Wextra -D_GNU_SOURCE
                       -Xptxas=--suppress-async-bulk-multicast-advisory-warning
                       $<$<BOOL:${EMBER_WERROR}>:-Werror=all-warnings>)
target_include_directories(ember_cuda PRIVATE ${PROJECT_SOURCE_DIR}/src)
# NCCL for several GPUs (ep.cu): only its header at build time; libnccl.so.2 is loaded when a
# run opens two or more devices, so one-GPU runs and binaries carried elsewhere need none of it.
find_path(EM_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
if(EM_NCCL_INCLUDE)
  message(STATUS "Ember: NCCL header ${EM_NCCL_INCLUDE}/nccl.h (several GPUs)")
  target_include_directories(ember_cuda PRIVATE ${EM_NCCL_INCLUDE})
  target_compile_definitions(ember_cuda PRIVATE EM_HAVE_NCCL=1)
  target_link_libraries(ember_core PUBLIC ${CMAKE_DL_LIBS})
else()
  message(STATUS "Ember: no nccl.h: --devices with two or more GPUs will say this build lacks NCCL")
  target_compile_definitions(ember_cuda PRIVATE EM_HAVE_NCCL=0)
endif()
set_source_files_properties(${EM_GPU_NONE} PROPERTIES HEADER_FILE_ONLY ON)
target_sources(ember_core PRIVATE $<TARGET_OBJECTS:ember_cuda>)
set_target_properties(ember_core PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
target_link_libraries(ember_core PUBLIC CUDA::cudart_static)

# GPU tests and benchmarks (tests/cuda/run.sh runs them on the device machine).
file(GLOB EM_CUDA_TESTS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/cuda/test_*.c)
foreach(src ${EM_CUDA_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE ember_core)
endforeach()
