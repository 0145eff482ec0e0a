#pragma once
// QSTAGE_HD marks functions that compile for both the host and the device, so the CPU twins
// (.cpp) and the CUDA kernels (.cu) compute the same values from the same code. It is in core
// because the codec's block math (codec/, below the kernels) is such code too.
#ifdef __CUDACC__
#define QSTAGE_HD __host__ __device__ __forceinline__
#else
#define QSTAGE_HD inline
#endif
