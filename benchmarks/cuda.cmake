# GPU benchmarks (scripts/gpu-check runs them on a GPU machine and records the results). The
# direct-cuBLASLt baseline links cuBLASLt itself; the runtime under test loads it on first use.
if(NOT MESHFUSE_HAVE_CUDA)  # the direct-cuBLASLt baseline needs the toolkit
  return()
endif()
add_executable(cuda_benchmarks ${CMAKE_CURRENT_LIST_DIR}/cuda_benchmarks.cpp)
target_link_libraries(cuda_benchmarks PRIVATE meshfuse_internal meshfuse_models CUDA::cublasLt nlohmann_json::nlohmann_json)
