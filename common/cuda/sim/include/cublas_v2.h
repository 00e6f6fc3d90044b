// The CUDA simulator's cuBLAS, on OpenBLAS (see ../cuda_sim.hpp).
#pragma once
#include "../cuda_sim.hpp"
