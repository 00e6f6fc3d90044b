// The CUDA simulator in place of the CUDA runtime (see ../cuda_sim.hpp).
#pragma once
#include "../cuda_sim.hpp"
