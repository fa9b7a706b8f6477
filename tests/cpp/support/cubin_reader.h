// A reader of the cubins NVRTC makes, for tests that cannot run them (no GPU): the ELF's kernel
// symbols and, per kernel, the resources the .nv.info sections record (registers, stack frame)
// and its static shared memory (the size of .nv.shared.<kernel>). Needs no CUDA tool.
#pragma once

#include <elf.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>

namespace kiln::testing {

struct CubinKernel {
  int registers = -1;        // EIATTR_REGCOUNT; -1 when not recorded
  int64_t frame_bytes = 0;   // EIATTR_FRAME_SIZE: local memory per thread (spills, stack arrays)
  int64_t shared_bytes = 0;  // static shared memory
  int max_threads = 0;       // EIATTR_MAX_THREADS (__launch_bounds__); 0 when not recorded
};

struct Cubin {
  uint16_t machine = 0;                        // e_machine: EM_CUDA (190)
  int sm = 0;                                  // the architecture, 90 for sm_90 (from e_flags)
  std::map<std::string, CubinKernel> kernels;  // by symbol: global functions (STT_FUNC, .text.*)
};

// The cubin's kernels, or nullopt when `bytes` is not a 64-bit little-endian ELF whose section
// and symbol tables lie inside it.
inline std::optional<Cubin> ReadCubin(const std::string& bytes) {
  auto in = [&](uint64_t off, uint64_t n) {
    return off <= bytes.size() && n <= bytes.size() - off;
  };
  Elf64_Ehdr eh;
  if (!in(0, sizeof eh)) return std::nullopt;
  std::memcpy(&eh, bytes.data(), sizeof eh);
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_shentsize != sizeof(Elf64_Shdr) ||
      !in(eh.e_shoff, uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr)) || eh.e_shstrndx >= eh.e_shnum) {
    return std::nullopt;
  }
  std::vector<Elf64_Shdr> sh(eh.e_shnum);
  std::memcpy(sh.data(), bytes.data() + eh.e_shoff, sh.size() * sizeof(Elf64_Shdr));
  for (const Elf64_Shdr& s : sh) {
    if (s.sh_type != SHT_NOBITS && !in(s.sh_offset, s.sh_size)) return std::nullopt;
  }
  auto str = [&](const Elf64_Shdr& table, uint32_t off) -> std::string {
    if (off >= table.sh_size) return "";
    const char* p = bytes.data() + table.sh_offset + off;
    return std::string(p, strnlen(p, table.sh_size - off));
  };
  Cubin cubin;
  cubin.machine = eh.e_machine;
  // e_flags: the SM version in bits 8..15 (CUDA >= 12 cubins) or 0..7 (older ones).
  cubin.sm = static_cast<int>((eh.e_flags >> 8) & 0xff);
  if (cubin.sm == 0) cubin.sm = static_cast<int>(eh.e_flags & 0xff);

  // Symbols: kernels are the function symbols; nv.info names them by symbol index.
  std::map<uint32_t, std::string> symbol_names;
  for (const Elf64_Shdr& s : sh) {
    if (s.sh_type != SHT_SYMTAB || s.sh_link >= sh.size() || s.sh_entsize != sizeof(Elf64_Sym)) {
      continue;
    }
    for (uint64_t i = 0; i < s.sh_size / sizeof(Elf64_Sym); ++i) {
      Elf64_Sym sym;
      std::memcpy(&sym, bytes.data() + s.sh_offset + i * sizeof sym, sizeof sym);
      const std::string name = str(sh[s.sh_link], sym.st_name);
      symbol_names[static_cast<uint32_t>(i)] = name;
      if (ELF64_ST_TYPE(sym.st_info) == STT_FUNC && ELF64_ST_BIND(sym.st_info) == STB_GLOBAL) {
        cubin.kernels[name];
      }
    }
  }
  // .nv.info (attributes of every kernel, by symbol index) and .nv.info.<kernel>: entries of a
  // format byte, an attribute byte and a 16-bit value or size (EIFMT_SVAL, 0x04: `size` bytes
  // follow: for REGCOUNT and FRAME_SIZE a 32-bit symbol index then the value; for MAX_THREADS the
  // block's x, y, z).
  constexpr uint8_t kSval = 0x04, kMaxThreads = 0x05, kFrameSize = 0x11, kRegCount = 0x2f;
  for (const Elf64_Shdr& s : sh) {
    const std::string name = str(sh[eh.e_shstrndx], s.sh_name);
    if (name.rfind(".nv.shared.", 0) == 0) {
      auto k = cubin.kernels.find(name.substr(11));
      if (k != cubin.kernels.end()) k->second.shared_bytes = static_cast<int64_t>(s.sh_size);
      continue;
    }
    if (name.rfind(".nv.info", 0) != 0) continue;
    const std::string owner = name.size() > 9 ? name.substr(9) : "";
    uint64_t at = 0;
    while (at + 4 <= s.sh_size) {
      const unsigned char* e =
          reinterpret_cast<const unsigned char*>(bytes.data() + s.sh_offset + at);
      const uint8_t format = e[0], attr = e[1];
      const uint16_t value = static_cast<uint16_t>(e[2] | (e[3] << 8));
      at += 4;
      if (format != kSval) continue;
      if (at + value > s.sh_size) break;
      const unsigned char* data = e + 4;
      at += value;
      if (attr == kMaxThreads && value >= 4 && cubin.kernels.count(owner)) {
        uint32_t x;  // x, y, z of __launch_bounds__, in the kernel's own section
        std::memcpy(&x, data, 4);
        cubin.kernels[owner].max_threads = static_cast<int>(x);
        continue;
      }
      if (value < 8) continue;
      uint32_t symbol, v;
      std::memcpy(&symbol, data, 4);
      std::memcpy(&v, data + 4, 4);
      auto sym = symbol_names.find(symbol);
      if (sym == symbol_names.end()) continue;
      auto k = cubin.kernels.find(sym->second);
      if (k == cubin.kernels.end()) continue;
      if (attr == kRegCount) k->second.registers = static_cast<int>(v);
      if (attr == kFrameSize) k->second.frame_bytes = v;
    }
  }
  return cubin;
}

}  // namespace kiln::testing
