// The CUDA simulator's __half (see ../cuda_sim_half.hpp).
#pragma once
#include "../cuda_sim_half.hpp"
