# The tiled attention kernel against the materialized lowering it replaced and PyTorch CPU's
# scaled_dot_product_attention (benchmarks/attention_torch.py). Results:
# benchmarks/results/context-parallel.md.
# (Included before kernels.cmake, which sets the same Python the same way.)
set(MESHFUSE_BENCH_VENV_PYTHON "${MESHFUSE_VENV}/bin/python")
if(NOT MESHFUSE_VENV)
  set(MESHFUSE_BENCH_VENV_PYTHON "$ENV{HOME}/.cache/meshfuse/venv/bin/python")
endif()
add_executable(attention_cpu ${CMAKE_CURRENT_LIST_DIR}/attention_cpu.cpp)
target_include_directories(attention_cpu PRIVATE ${CBLAS_INCLUDE_DIR})
target_link_libraries(attention_cpu PRIVATE meshfuse_internal ${BLAS_LIBRARIES})
target_compile_definitions(attention_cpu PRIVATE MESHFUSE_VENV_PYTHON="${MESHFUSE_BENCH_VENV_PYTHON}"
                           MESHFUSE_BENCH_DIR="${CMAKE_CURRENT_LIST_DIR}")
