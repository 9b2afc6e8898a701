# Runtime benchmarks: host-IR interpreter overhead, MPI collective bandwidth vs memcpy, overlap.
find_package(benchmark REQUIRED)
add_executable(hostir_overhead ${CMAKE_CURRENT_LIST_DIR}/hostir_overhead.cpp)
target_link_libraries(hostir_overhead PRIVATE meshfuse_core meshfuse_models benchmark::benchmark)
add_executable(collectives_busbw ${CMAKE_CURRENT_LIST_DIR}/collectives_busbw.cpp)
target_link_libraries(collectives_busbw PRIVATE meshfuse_core MPI::MPI_C)
add_executable(overlap_cpu ${CMAKE_CURRENT_LIST_DIR}/overlap_cpu.cpp)
target_link_libraries(overlap_cpu PRIVATE meshfuse_core meshfuse_models MPI::MPI_C)
