// The text of proto/kiln/v1/kernel_abi.h, embedded at build time (embed_kernel_abi.cmake): the
// generator puts it in every kernel source, so the ABI the kernels are built against is the one
// the runtime includes, and the kernels build where no kiln header is installed.
#pragma once

namespace kiln::compiler {

extern const char kKernelAbiHeader[];

}  // namespace kiln::compiler
