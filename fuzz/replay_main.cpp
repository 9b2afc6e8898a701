// main() of the fuzz targets in builds without libFuzzer (gcc; MESHFUSE_BUILD_FUZZERS=OFF): runs
// each input file given on the command line through LLVMFuzzerTestOneInput once, as a libFuzzer
// binary does with file arguments, so that every build's ctest replays fuzz/regressions/. A
// finding aborts (fuzz_target.h); success prints how many inputs ran.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s INPUT...\n", argv[0]);
    return 2;
  }
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "cannot read %s\n", argv[i]);
      return 2;
    }
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "Running: %s\n", argv[i]);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::fprintf(stderr, "Executed %d inputs\n", argc - 1);
  return 0;
}
