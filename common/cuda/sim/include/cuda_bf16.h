// The CUDA simulator's __nv_bfloat16 (see ../cuda_sim_half.hpp).
#pragma once
#include "../cuda_sim_half.hpp"
