# cmake -DINPUT=<kernel_abi.h> -DOUTPUT=<file.cc> -P embed_kernel_abi.cmake
# Writes OUTPUT, defining kiln::compiler::kKernelAbiHeader (kernel_abi_text.h) as the exact text
# of INPUT, in a raw string literal. Through a temporary file, so that a failed run never leaves
# an OUTPUT that looks up to date.
file(READ "${INPUT}" text)
string(FIND "${text}" ")kiln_abi\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw string's delimiter )kiln_abi\"")
endif()
file(WRITE "${OUTPUT}.tmp"
  "// Generated from proto/kiln/v1/kernel_abi.h by embed_kernel_abi.cmake.\n"
  "#include \"compiler/codegen/cpu/kernel_abi_text.h\"\n\n"
  "namespace kiln::compiler {\n\n"
  "const char kKernelAbiHeader[] = R\"kiln_abi(${text})kiln_abi\";\n\n"
  "}  // namespace kiln::compiler\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
