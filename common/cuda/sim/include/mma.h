// The CUDA simulator's tensor cores, nvcuda::wmma (see ../cuda_sim_wmma.hpp).
#pragma once
#include "../cuda_sim_wmma.hpp"
