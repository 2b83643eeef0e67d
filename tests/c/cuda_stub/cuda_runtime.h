/* A stand-in for CUDA's runtime header: just what NVIDIA's nccl.h needs to compile on a
 * machine without CUDA (the C ABI tests build against it to prove our library runs programs
 * compiled against NVIDIA's header). */
#ifndef TOPOCCL_CUDA_RUNTIME_STUB_H
#define TOPOCCL_CUDA_RUNTIME_STUB_H
#define CUDART_VERSION 13000
typedef struct CUstream_st* cudaStream_t;
#endif
