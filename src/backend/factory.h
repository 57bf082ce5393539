// Creates the backend a user asked for: "cpu", "cuda", "cuda:N" or "auto" (CUDA when built and a
// device is present, else CPU).
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"

namespace pg {

struct BackendOptions {
  std::string device = "auto";
  CpuOptions cpu;
};

std::unique_ptr<Backend> create_backend(const BackendOptions& opt);
bool cuda_available();  // built with CUDA and at least one device visible

}  // namespace pg
