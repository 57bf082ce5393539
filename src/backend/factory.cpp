#include "backend/factory.h"

#include "core/error.h"

#ifdef PEREGRINE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace pg {

bool cuda_available() {
#ifdef PEREGRINE_HAVE_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

std::unique_ptr<Backend> create_backend(const BackendOptions& opt) {
  const std::string& d = opt.device;
  if (d == "cpu" || (d == "auto" && !cuda_available())) return std::make_unique<CpuBackend>(opt.cpu);
  if (d == "auto" || d.rfind("cuda", 0) == 0) {
    int index = 0;
    if (d.size() > 4) {
      PG_CHECK(d[4] == ':' && d.size() > 5, "invalid device '" + d + "' (expected cpu, cuda or cuda:N)");
      try {
        index = std::stoi(d.substr(5));
      } catch (...) {
        throw Error("invalid device '" + d + "' (expected cpu, cuda or cuda:N)");
      }
    }
#ifdef PEREGRINE_HAVE_CUDA
    return create_cuda_backend(index);
#else
    (void)index;
    throw Error("device '" + d + "' requested but this build has no CUDA backend (rebuild with nvcc available)");
#endif
  }
  throw Error("unknown device '" + d + "' (expected cpu, cuda, cuda:N or auto)");
}

}  // namespace pg
