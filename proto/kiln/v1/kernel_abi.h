// kiln.v1's CPU kernel ABI (artifact.proto, KernelLaunch): the types a generated kernel is called
// through, defined once. kilnd's CPU code generator puts this file's text at the top of every
// kernel source (kernels build with no kiln header installed); the client's runtime and the tests
// include it. Plain C, so that it means the same in the kernels, the runtime and any loader.
#ifndef KILN_V1_KERNEL_ABI_H_
#define KILN_V1_KERNEL_ABI_H_

#include <stdint.h>

// The body of a parallel loop: runs iterations [begin, end) over the kernel's arguments.
typedef void (*kiln_range_fn)(int64_t begin, int64_t end, void* const* args);

// The runtime's thread pool (torch's intra-op threads): runs fn over [begin, end) in chunks of at
// least `grain` iterations and returns when all are done. Kernels bring no thread runtime.
typedef void (*kiln_parallel_for_fn)(int64_t begin, int64_t end, int64_t grain, kiln_range_fn fn,
                                     void* const* args);

// A kernel, exported from the artifact's shared object as
//   extern "C" void <KernelLaunch.symbol>(void* const* args, kiln_parallel_for_fn parallel_for);
// args[i] is the data pointer (storage offset applied) of value KernelLaunch.args[i], which has
// exactly the dtype, sizes and strides ExecutionPlan.values gives for it (in a plan with size
// symbols, evaluated at the call's); after them, args[args_size() + j] points to the int64_t
// value of KernelLaunch.size_args[j] at this call.
typedef void (*kiln_kernel_fn)(void* const* args, kiln_parallel_for_fn parallel_for);

// CUDA kernels (BINARY_FORMAT_CUBIN) need no type from this file: the cubin exports
//   extern "C" __global__ void <KernelLaunch.symbol>(T0* a0, T1* a1, ...)
// with exactly one pointer parameter per KernelLaunch.args entry, in order: the device address
// (storage offset applied) of that value, which has exactly the dtype, sizes and strides
// ExecutionPlan.values gives for it (sizes and strides are compiled in; bf16 and f16 are passed as
// 16-bit words); then one int64_t parameter per KernelLaunch.size_args entry, its value at this
// call, and grid[0] computed per call where KernelLaunch.grid_work is set. The runtime launches it with cuLaunchKernel on the caller's current stream with
// KernelLaunch.grid, .block and .shared_memory_bytes (dynamic shared memory) and nothing else;
// kernels never allocate. Artifact.kernel_ptx holds the same kernels as PTX for newer GPUs.

#endif  // KILN_V1_KERNEL_ABI_H_
