// .npy I/O.
#include "meshfuse/npy.h"

#include <cstring>
#include <fstream>
#include <regex>

#include "meshfuse/error.h"

namespace meshfuse {

Tensor readNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MF_USER_CHECK(in.good(), ErrorKind::Runtime, "cannot open {}", path);
  char magic[8];
  in.read(magic, 8);
  MF_USER_CHECK(in.good() && std::memcmp(magic, "\x93NUMPY", 6) == 0, ErrorKind::Runtime, "{} is not a .npy file", path);
  uint32_t header_len = 0;
  if (magic[6] == 1) {
    uint16_t h;
    in.read(reinterpret_cast<char*>(&h), 2);
    header_len = h;
  } else {
    in.read(reinterpret_cast<char*>(&header_len), 4);
  }
  std::string header(header_len, '\0');
  in.read(header.data(), header_len);
  std::smatch m;
  MF_USER_CHECK(std::regex_search(header, m, std::regex("'descr':\\s*'([^']*)'")), ErrorKind::Runtime,
                "{}: no dtype in the .npy header", path);
  std::string descr = m[1];
  MF_USER_CHECK(!std::regex_search(header, std::regex("'fortran_order':\\s*True")), ErrorKind::Runtime,
                "{}: Fortran-order arrays are not supported (save with np.ascontiguousarray)", path);
  MF_USER_CHECK(std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")), ErrorKind::Runtime,
                "{}: no shape in the .npy header", path);
  std::vector<int64_t> shape;
  std::string dims = m[1];
  std::regex num("\\d+");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it)
    shape.push_back(std::stoll(it->str()));
  DataType dt;
  if (descr == "<f4") dt = DataType::Float;
  else if (descr == "<f2") dt = DataType::Half;
  else if (descr == "<i8") dt = DataType::Int64;
  else if (descr == "|b1") dt = DataType::Bool;
  else userError(ErrorKind::Runtime, "{}: unsupported .npy dtype '{}' (f4, f2, i8 and b1 are supported)", path, descr);
  Tensor t(dt, shape);
  in.read(static_cast<char*>(t.data()), static_cast<std::streamsize>(t.nbytes()));
  MF_USER_CHECK(in.good() || (in.eof() && in.gcount() == static_cast<std::streamsize>(t.nbytes())), ErrorKind::Runtime,
                "{}: file is shorter than its header says", path);
  return t;
}

void writeNpy(const std::string& path, const Tensor& t0) {
  Tensor t = t0;
  if (t.dtype() == DataType::BFloat16) t = Tensor::fromValues(DataType::Float, t0.shape(), t0.toValues());
  const char* descr = t.dtype() == DataType::Float ? "<f4"
                      : t.dtype() == DataType::Half ? "<f2"
                      : t.dtype() == DataType::Int64 ? "<i8"
                                                     : "|b1";
  std::string shape;
  for (int64_t s : t.shape()) shape += std::to_string(s) + ",";
  if (t.rank() > 1) shape.pop_back();
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, shape);
  size_t total = 10 + header.size() + 1;
  header += std::string((64 - total % 64) % 64, ' ') + "\n";
  std::ofstream out(path, std::ios::binary);
  MF_USER_CHECK(out.good(), ErrorKind::Runtime, "cannot write {}", path);
  out.write("\x93NUMPY\x01\x00", 8);
  uint16_t len = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&len), 2);
  out << header;
  out.write(static_cast<const char*>(t.data()), static_cast<std::streamsize>(t.nbytes()));
  MF_USER_CHECK(out.good(), ErrorKind::Runtime, "error writing {}", path);
}

}  // namespace meshfuse
