// SPDX-License-Identifier: MIT
/// @file sweep.cpp
/// Linear sweeps over a function's bytes, for the attach-time checks that
/// look at every instruction of a function or of its neighbours (branches
/// into a window, jump-table leas, instruction starts). Capstone decides
/// what an instruction is; asking it for each one costs ~200 ns (it formats
/// the text of every instruction, detail on or off), and attaching every
/// entry of libc sweeps hundreds of thousands. So the common encodings are
/// measured here from a table of their operand shapes (ModRM, SIB,
/// displacement, immediate), with the lengths Capstone 4 gives them
/// (tests/arch/sweep_test.cpp compares the two over every prefix, opcode,
/// ModRM and SIB form the table takes, over VEX forms, and at every
/// instruction of libc); any other instruction (EVEX, 3DNow!, system and
/// segment instructions, other prefixes) is Capstone's (known_length()
/// returns 0 for it). Not hot.

#include "sweep.hpp"

#include <capstone/capstone.h>

#include <array>
#include <cstring>

#include "arch.hpp"
#include "capstone_lib.hpp"
#include "thread_object.hpp"

namespace uprobe::arch {
namespace {

/// The operand shape of an opcode.
enum Shape : std::uint8_t {
  kNo = 0,  ///< not in the table: Capstone decides
  kBare,    ///< the opcode alone
  kM,       ///< ModRM (with its SIB and displacement)
  kMI8,     ///< ModRM, imm8
  kMIz,     ///< ModRM, imm16/imm32 (66 without REX.W: 16)
  kI8,      ///< imm8 (rel8 too)
  kI16,     ///< imm16 (not with 66: Capstone's)
  kIz,      ///< imm16/imm32
  kIv,      ///< imm16/32/64 (mov r, imm: REX.W 64, 66 16)
  kI16I8,   ///< enter: imm16, imm8
  kRel32,   ///< call/jmp/Jcc rel32 (not with 66: Capstone's)
  kGrp3b,   ///< f6: ModRM, imm8 for /0 and /1 (test)
  kGrp3v,   ///< f7: ModRM, imm16/32 for /0 and /1 (test)
};

/// Which ModRM forms are valid: any, a memory operand only, a register only.
enum ModForm : std::uint8_t { kAnyMod = 0, kMemOnly, kRegOnly };

/// One opcode: its shape, the prefix classes it is measured with (bit 0:
/// none or 64, 1: 66, 2: f3, 3: f2, 4: 66 before a 2e, which Capstone does
/// not take as a mandatory 66; others are Capstone's), the
/// ModRM forms that are valid, and the /reg values that are not (bit r).
struct Op {
  Shape shape = kNo;
  std::uint8_t classes = 0;
  ModForm form = kAnyMod;
  std::uint8_t bad_reg = 0;
  std::uint8_t lock_reg = 0;  ///< /reg values that take a lock prefix (with a memory operand)
};

constexpr std::uint8_t kNone = 1, k66 = 2, kF3 = 4, kF2 = 8, k66Seg = 16, kAll = 0x1f;

constexpr std::array<Op, 256> one_byte_map() {
  std::array<Op, 256> t{};
  auto set = [&](int op, Shape s, ModForm f = kAnyMod, std::uint8_t bad = 0) { t[op] = Op{s, kAll, f, bad, 0}; };
  for (int op = 0x00; op < 0x40; op += 8) {
    for (int k = 0; k < 4; ++k) set(op + k, kM);  // add, or, adc, sbb, and, sub, xor, cmp r/m
    set(op + 4, kI8);                               // ... al, imm8
    set(op + 5, kIz);                               // ... eax, imm32
  }
  for (int op = 0x50; op <= 0x5f; ++op) set(op, kBare);  // push/pop r64
  set(0x63, kM);                                          // movsxd
  set(0x68, kIz);
  set(0x69, kMIz);
  set(0x6a, kI8);
  set(0x6b, kMI8);
  for (int op = 0x70; op <= 0x7f; ++op) set(op, kI8);  // Jcc rel8
  set(0x80, kMI8);
  set(0x81, kMIz);
  set(0x83, kMI8);
  for (int op = 0x84; op <= 0x8b; ++op) set(op, kM);  // test, xchg, mov
  set(0x8d, kM, kMemOnly);                             // lea
  set(0x8f, kM, kAnyMod, 0xfe);                        // pop r/m (other /r: XOP)
  for (int op = 0x90; op <= 0x99; ++op) set(op, kBare);  // nop/xchg, cbw, cwd
  for (int op = 0x9b; op <= 0x9f; ++op) set(op, kBare);  // fwait, pushf, popf, sahf, lahf
  for (int op = 0xa4; op <= 0xa7; ++op) set(op, kBare);  // movs, cmps
  set(0xa8, kI8);
  set(0xa9, kIz);
  for (int op = 0xaa; op <= 0xaf; ++op) set(op, kBare);  // stos, lods, scas
  for (int op = 0xb0; op <= 0xb7; ++op) set(op, kI8);
  for (int op = 0xb8; op <= 0xbf; ++op) set(op, kIv);
  set(0xc0, kMI8);
  set(0xc1, kMI8);
  set(0xc2, kI16);
  set(0xc3, kBare);
  set(0xc6, kMI8, kAnyMod, 0xfe);  // mov r/m8, imm8 (/7: xabort, Capstone's)
  set(0xc7, kMIz, kAnyMod, 0xfe);  // mov r/m, imm32 (/7: xbegin)
  set(0xc8, kI16I8);
  set(0xc9, kBare);
  set(0xcc, kBare);
  set(0xcd, kI8);
  for (int op = 0xd0; op <= 0xd3; ++op) set(op, kM);  // shifts
  // x87: the memory forms (the register forms, some of them undefined, are Capstone's).
  set(0xd8, kM, kMemOnly);
  set(0xd9, kM, kMemOnly, 1u << 1);
  set(0xda, kM, kMemOnly);
  set(0xdb, kM, kMemOnly, (1u << 4) | (1u << 6));
  set(0xdc, kM, kMemOnly);
  set(0xdd, kM, kMemOnly, 1u << 5);
  set(0xde, kM, kMemOnly);
  set(0xdf, kM, kMemOnly);
  for (int op = 0xe0; op <= 0xe3; ++op) set(op, kI8);  // loop, jrcxz
  set(0xe8, kRel32);
  set(0xe9, kRel32);
  set(0xeb, kI8);
  set(0xf4, kBare);  // hlt
  set(0xf5, kBare);  // cmc
  set(0xf6, kGrp3b);
  set(0xf7, kGrp3v);
  for (int op = 0xf8; op <= 0xfd; ++op) set(op, kBare);  // clc .. std
  set(0xfe, kM, kAnyMod, 0xfc);                           // inc, dec r/m8
  set(0xff, kM, kAnyMod, 0x80);                           // inc, dec, call, callf, jmp, jmpf, push (/3, /5: memory only)
  // lock: add, or, adc, sbb, and, sub, xor r/m, r; the immediate groups but
  // cmp; xchg; not, neg; inc, dec.
  for (int op = 0x00; op < 0x38; op += 8) t[op].lock_reg = t[op + 1].lock_reg = 0xff;
  t[0x80].lock_reg = t[0x81].lock_reg = t[0x83].lock_reg = 0x7f;
  t[0x86].lock_reg = t[0x87].lock_reg = 0xff;
  t[0xf6].lock_reg = t[0xf7].lock_reg = 0x0c;
  t[0xfe].lock_reg = t[0xff].lock_reg = 0x03;
  return t;
}

constexpr std::array<Op, 256> two_byte_map() {
  std::array<Op, 256> t{};
  auto set = [&](int op, Shape s, std::uint8_t classes = kAll, ModForm f = kAnyMod, std::uint8_t bad = 0) {
    t[op] = Op{s, classes, f, bad, 0};
  };
  set(0x05, kBare);  // syscall
  set(0x18, kM, kAll, kMemOnly, 0xf0);  // prefetchnta, prefetcht0 .. t2
  set(0x0b, kBare);  // ud2
  for (int op = 0x10; op <= 0x17; ++op) set(op, kM);  // SSE moves
  set(0x13, kM, kAll, kMemOnly);
  set(0x17, kM, kAll, kMemOnly);
  set(0x1f, kM, kAll, kMemOnly);  // nop r/m
  for (int op = 0x28; op <= 0x2f; ++op) set(op, kM);
  set(0x2b, kM, kAll, kMemOnly);
  set(0x31, kBare);                                   // rdtsc
  for (int op = 0x40; op <= 0x4f; ++op) set(op, kM);  // cmovcc
  set(0x50, kM, kAll, kRegOnly);
  for (int op = 0x51; op <= 0x6b; ++op) set(op, kM);  // SSE / MMX
  set(0x6c, kM, k66);
  set(0x6d, kM, k66);
  set(0x6e, kM);
  set(0x6f, kM);
  set(0x70, kMI8);                                    // pshuf*
  set(0x71, kMI8, kNone | k66, kRegOnly, 0xab);       // psrlw, psraw, psllw imm8
  set(0x72, kMI8, kNone | k66, kRegOnly, 0xab);       // psrld, psrad, pslld imm8
  set(0x73, kMI8, k66, kRegOnly, 0x33);               // psrlq, psrldq, psllq, pslldq imm8
  for (int op = 0x74; op <= 0x76; ++op) set(op, kM);  // pcmpeq*
  set(0x7e, kM);
  set(0x7f, kM);
  for (int op = 0x80; op <= 0x8f; ++op) set(op, kRel32);  // Jcc rel32
  for (int op = 0x90; op <= 0x9f; ++op) set(op, kM);     // setcc
  set(0xa2, kBare);                                       // cpuid
  for (int op : {0xa3, 0xab, 0xb3, 0xbb}) set(op, kM);   // bt, bts, btr, btc
  set(0xa4, kMI8);                                        // shld, shrd imm8
  set(0xac, kMI8);
  set(0xa5, kM);  // shld, shrd cl
  set(0xad, kM);
  set(0xaf, kM);  // imul
  set(0xba, kMI8, kAll, kAnyMod, 0x0f);  // bt, bts, btr, btc imm8
  set(0xb0, kM);  // cmpxchg
  set(0xb1, kM);
  for (int op : {0xb6, 0xb7, 0xbe, 0xbf}) set(op, kM);  // movzx, movsx
  set(0xb8, kM, kF3);                                    // popcnt
  set(0xbc, kM);                                         // bsf, bsr (tzcnt, lzcnt)
  set(0xbd, kM);
  set(0xc0, kM);  // xadd
  set(0xc1, kM);
  set(0xc2, kMI8);  // cmpps
  set(0xc3, kM, kAll, kMemOnly);  // movnti
  set(0xc6, kMI8);                // shufps
  for (int op = 0xc8; op <= 0xcf; ++op) set(op, kBare);  // bswap
  for (int op = 0xd1; op <= 0xfe; ++op) set(op, kM);     // SSE / MMX
  for (int op : {0xab, 0xb0, 0xb1, 0xb3, 0xbb, 0xc0, 0xc1}) t[op].lock_reg = 0xff;  // lock bts, cmpxchg, btr, btc, xadd
  t[0xba].lock_reg = 0xe0;                                                       // lock bts, btr, btc imm8
  set(0xd6, kM, k66);
  set(0xd7, kM, kAll, kRegOnly);
  set(0xe6, kM, k66 | kF3 | kF2);
  set(0xe7, kM, kAll, kMemOnly);
  set(0xf0, kNo);
  set(0xf7, kM, kAll, kRegOnly);
  return t;
}

/// 0F 38 xx (ModRM): SSSE3 .. SSE4.2, AES, SHA, CRC32, ADX.
constexpr std::array<Op, 256> three_byte_38_map() {
  std::array<Op, 256> t{};
  auto set = [&](int lo, int hi, std::uint8_t classes) {
    for (int op = lo; op <= hi; ++op) t[op] = Op{kM, classes, kAnyMod, 0};
  };
  set(0x00, 0x0b, kAll);  // pshufb .. pmulhrsw (MMX and SSE forms)
  set(0x1c, 0x1e, kAll);  // pabs*
  set(0xc8, 0xcd, kAll);  // sha*
  set(0x10, 0x10, k66);
  set(0x14, 0x15, k66);
  set(0x17, 0x17, k66);
  set(0x20, 0x25, k66);  // pmovsx*
  set(0x28, 0x29, k66);
  set(0x2b, 0x2b, k66);
  set(0x30, 0x35, k66);  // pmovzx*
  set(0x37, 0x41, k66);
  set(0xdb, 0xdf, k66);   // aes*
  set(0xf0, 0xf1, kF2);   // crc32
  set(0xf6, 0xf6, k66 | kF3);  // adcx, adox
  return t;
}

/// 0F 3A xx (ModRM, imm8).
constexpr std::array<Op, 256> three_byte_3a_map() {
  std::array<Op, 256> t{};
  auto set = [&](int lo, int hi, std::uint8_t classes) {
    for (int op = lo; op <= hi; ++op) t[op] = Op{kMI8, classes, kAnyMod, 0};
  };
  set(0x0f, 0x0f, kAll);  // palignr
  set(0xcc, 0xcc, kAll);  // sha1rnds4
  set(0x08, 0x0e, k66);   // round*, blend*
  set(0x14, 0x17, k66);   // pextr*, extractps
  set(0x20, 0x22, k66);   // pinsr*, insertps
  set(0x40, 0x42, k66);   // dpps, dppd, mpsadbw
  set(0x44, 0x44, k66);   // pclmulqdq
  set(0x60, 0x63, k66);   // pcmp[ei]str[im]
  set(0xdf, 0xdf, k66);   // aeskeygenassist
  return t;
}

constexpr std::array<Op, 256> kOneByte = one_byte_map();
constexpr std::array<Op, 256> kTwoByte = two_byte_map();
constexpr std::array<Op, 256> k0F38 = three_byte_38_map();
constexpr std::array<Op, 256> k0F3A = three_byte_3a_map();

/// The bytes of a ModRM operand from its ModRM byte on (ModRM, SIB,
/// displacement), or 0 when `b` holds too few to tell.
std::size_t modrm_bytes(const std::uint8_t* b, std::size_t n) noexcept {
  if (n < 1) return 0;
  const unsigned mod = b[0] >> 6, rm = b[0] & 7u;
  std::size_t len = 1;
  if (mod == 3) return len;
  if (rm == 4) {
    if (n < 2) return 0;
    if (mod == 0 && (b[1] & 7u) == 5) len += 4;
    ++len;
  } else if (mod == 0 && rm == 5) {
    len += 4;  // rip-relative
  }
  if (mod == 1) len += 1;
  else if (mod == 2) len += 4;
  return len;
}

}  // namespace

std::size_t known_length(const std::uint8_t* b, std::size_t n, bool& lea, bool& branch) noexcept {
  lea = branch = false;
  if (n == 0) return 0;
  // VEX (c5, c4 with maps 0F, 0F38, 0F3A; no prefix before it): vex_length()
  // is Capstone's length wherever Capstone decodes one, and what a sweep
  // steps over where it does not, except vzeroupper/vzeroall (map 0F, 77:
  // no ModRM). Neither a branch nor a lea. (EVEX, 62, is Capstone's: it
  // reads one byte more than the encoding for some register forms.)
  if (b[0] == 0xc5 || b[0] == 0xc4) {
    const bool map0f = b[0] == 0xc5 || (n > 1 && (b[1] & 0x1fu) == 1);
    const std::size_t op_at = b[0] == 0xc5 ? 2 : 3;
    if (map0f && n > op_at && b[op_at] == 0x77)  // vvvv 1111, pp 00: vzeroupper, vzeroall
      return (b[op_at - 1] & 0x7bu) == 0x78 ? op_at + 1 : vex_length(b, n);
    return vex_length(b, n);
  }
  // The prefixes the table was measured with: none, 66, f3, f2, 64, f0
  // (lock: before a memory operand of the instructions that take it), or
  // 66 2e / 66 66 2e (the multi-byte nops' padding), then an optional REX.
  std::size_t i = 0;
  std::uint8_t cls = kNone;
  bool lock = false;
  switch (b[0]) {
    case 0x66:
      cls = k66;
      i = 1;
      if (n > 1 && b[1] == 0x2e) cls = k66Seg, i = 2;
      else if (n > 2 && b[1] == 0x66 && b[2] == 0x2e) cls = k66Seg, i = 3;
      break;
    case 0xf3:
      cls = kF3;
      i = 1;
      break;
    case 0xf2:
      cls = kF2;
      i = 1;
      break;
    case 0x64:
      i = 1;
      break;
    case 0xf0:
      lock = true;
      i = 1;
      break;
    default:
      break;
  }
  std::uint8_t rex = 0;
  if (i < n && (b[i] & 0xf0) == 0x40) rex = b[i++];
  if (i >= n) return 0;
  const bool w = rex & 8, opsize = cls == k66 || cls == k66Seg;
  const std::size_t iz = opsize && !w ? 2 : 4;
  const std::uint8_t op = b[i++];
  Op d;
  if (op == 0x0f) {
    if (i >= n) return 0;
    const std::uint8_t op2 = b[i++];
    if (op2 == 0x38 || op2 == 0x3a) {
      if (i >= n) return 0;
      d = (op2 == 0x38 ? k0F38 : k0F3A)[b[i++]];
    } else {
      d = kTwoByte[op2];
    }
  } else {
    d = kOneByte[op];
  }
  if (d.shape == kNo || !(d.classes & cls) || (lock && !d.lock_reg)) return 0;
  std::size_t len = i;
  const std::uint8_t* m = b + i;  // the ModRM byte, where there is one
  const std::size_t left = n - i;
  auto with_modrm = [&](std::size_t imm) -> std::size_t {
    if (left == 0) return 0;
    const unsigned mod = m[0] >> 6, reg = (m[0] >> 3) & 7u;
    if ((d.form == kMemOnly && mod == 3) || (d.form == kRegOnly && mod != 3) || (d.bad_reg >> reg) & 1u) return 0;
    if (lock && (mod == 3 || !((d.lock_reg >> reg) & 1u))) return 0;
    if (op == 0xff && mod == 3 && (reg == 3 || reg == 5)) return 0;  // far call/jmp: a memory operand only
    const std::size_t mb = modrm_bytes(m, left);
    return mb ? len + mb + imm : 0;
  };
  switch (d.shape) {
    case kNo: return 0;
    case kBare: break;
    case kM: len = with_modrm(0); break;
    case kMI8: len = with_modrm(1); break;
    case kMIz: len = with_modrm(iz); break;
    case kI8: len += 1; break;
    case kI16:
      if (opsize) return 0;
      len += 2;
      break;
    case kIz: len += iz; break;
    case kIv: len += w ? 8 : opsize ? 2 : 4; break;
    case kI16I8: len += 3; break;
    case kRel32:
      if (opsize) return 0;
      len += 4;
      break;
    case kGrp3b: len = with_modrm(left && ((m[0] >> 3) & 7u) <= 1 ? 1 : 0); break;
    case kGrp3v: len = with_modrm(left && ((m[0] >> 3) & 7u) <= 1 ? iz : 0); break;
  }
  if (len == 0 || len > n || len > kMaxInsnLen) return 0;
  lea = op == 0x8d;
  branch = d.shape == kRel32 || (d.shape == kI8 && ((op >= 0x70 && op <= 0x7f) || (op >= 0xe0 && op <= 0xe3) || op == 0xeb));
  return len;
}

namespace {

/// One Capstone handle per thread, detail off, for what the table does not
/// know.
struct Handle {
  csh h = 0;
  cs_insn* insn = nullptr;
  Handle() {
    if (capstone::open(CS_ARCH_X86, CS_MODE_64, &h) != CS_ERR_OK) {
      h = 0;
      return;
    }
    insn = capstone::malloc_insn(h);
  }
  ~Handle() {
    if (insn) capstone::free_insn(insn, 1);
    if (h) capstone::close(&h);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  /// Capstone's decoding of the instruction at `code`, or nullptr.
  const cs_insn* decode(const std::uint8_t* code, std::size_t left, std::uint64_t address) {
    if (!h || !insn) return nullptr;
    return capstone::disasm_iter(h, &code, &left, &address, insn) ? insn : nullptr;
  }
};

Handle& handle() { return uprobe::detail::thread_object<Handle>(); }

}  // namespace

SweepStep sweep_step(const std::uint8_t* code, std::size_t left, bool vex) {
  SweepStep s;
  // (The table's VEX lengths are what a sweep with `vex` steps over: without
  // it, a VEX form Capstone cannot decode is undecodable.)
  if (vex || left == 0 || (code[0] != 0xc4 && code[0] != 0xc5)) s.len = known_length(code, left, s.lea, s.branch);
  if (s.len) return s;
  s.capstone = true;
  if (const cs_insn* ci = handle().decode(code, left, 0)) {
    s.len = ci->size;
    s.lea = ci->id == X86_INS_LEA;
    s.branch = true;
  } else if (vex) {
    s.len = vex_length(code, left);  // (not a branch, not a lea)
  }
  return s;
}

BranchInfo branch_info(const std::uint8_t* b, std::size_t n) noexcept {
  BranchInfo bi;
  std::size_t i = 0;
  bool opsize = false;
  for (; i < n; ++i) {
    const std::uint8_t c = b[i];
    if (c == 0x66) opsize = true;
    else if (c == 0x67 || c == 0xf2 || c == 0xf3 || c == 0xf0 || c == 0x2e || c == 0x3e || c == 0x26 ||
             c == 0x36 || c == 0x64 || c == 0x65 || (c & 0xf0) == 0x40)
      continue;
    else
      break;
  }
  if (i >= n) return bi;
  const std::uint8_t op = b[i];
  const std::uint8_t op2 = i + 1 < n ? b[i + 1] : 0;
  auto rel8 = [&] { return static_cast<std::int64_t>(static_cast<std::int8_t>(b[n - 1])); };
  auto relz = [&] {
    if (opsize) {  // rel16 (Intel truncates rip; either way the target is computed below)
      std::int16_t v;
      std::memcpy(&v, b + n - 2, 2);
      return static_cast<std::int64_t>(v);
    }
    std::int32_t v;
    std::memcpy(&v, b + n - 4, 4);
    return static_cast<std::int64_t>(v);
  };
  if ((op >= 0x70 && op <= 0x7f) || op == 0xeb || (op >= 0xe0 && op <= 0xe3)) {
    bi.relative = true;
    bi.rel = rel8();
  } else if (op == 0xe8 || op == 0xe9 || (op == 0x0f && op2 >= 0x80 && op2 <= 0x8f) ||
             (op == 0xc7 && op2 == 0xf8)) {  // call, jmp, Jcc rel32, xbegin
    bi.relative = true;
    bi.rel = relz();
  }
  return bi;
}

bool lea_rip_target(const std::uint8_t* b, std::size_t n, std::uint64_t end, std::uint64_t& target) noexcept {
  std::size_t i = 0;
  while (i < n && (b[i] == 0x66 || b[i] == 0x67 || (b[i] & 0xf0) == 0x40)) ++i;
  if (i + 6 > n || b[i] != 0x8d || (b[i + 1] & 0xc7) != 0x05) return false;
  std::int32_t disp;
  std::memcpy(&disp, b + i + 2, 4);
  target = end + static_cast<std::uint64_t>(static_cast<std::int64_t>(disp));
  return true;
}

bool sweep_available() { return handle().h != 0 && handle().insn != nullptr; }

std::string sweep_text(const std::uint8_t* code, std::size_t left, std::uint64_t address) {
  const cs_insn* ci = handle().decode(code, left, address);
  if (!ci) return "";
  return std::string(ci->mnemonic) + " " + ci->op_str;
}

// Capstone 4 (Debian 12) cannot decode some VEX/EVEX instructions (e.g.
// `vpcmpeqb (%rdi), %ymm16, %k0` and `kmovd %k0, %edx`, common in glibc's
// *_evex string functions); none is a branch, so a sweep steps over it: c5 +
// 1 payload byte (map 0F), c4 + 2 (map in the first one's low bits) or 62 +
// 3 (likewise), then the opcode, ModRM with its SIB and displacement, and an
// imm8 in map 0F3A and for the 0F opcodes that take one.
std::size_t vex_length(const std::uint8_t* b, std::size_t n) noexcept {
  if (n < 2) return 0;
  std::size_t len = 0;
  unsigned map = 0;
  if (b[0] == 0xc5) {
    len = 2;
    map = 1;
  } else if (b[0] == 0xc4) {
    len = 3;
    map = b[1] & 0x1fu;
  } else if (b[0] == 0x62) {
    len = 4;
    map = b[1] & 7u;
  } else {
    return 0;
  }
  if (map != 1 && map != 2 && map != 3 && !(b[0] == 0x62 && (map == 5 || map == 6))) return 0;
  if (n < len + 2) return 0;
  const std::uint8_t op = b[len], modrm = b[len + 1];
  len += 2;
  const unsigned mod = modrm >> 6, rm = modrm & 7u;
  if (mod != 3) {
    if (rm == 4) {
      if (n < len + 1) return 0;
      const unsigned base = b[len] & 7u;
      ++len;
      if (mod == 0 && base == 5) len += 4;
    } else if (mod == 0 && rm == 5) {
      len += 4;
    }
    if (mod == 1) len += 1;
    else if (mod == 2) len += 4;
  }
  const bool imm = map == 3 || (map == 1 && ((op >= 0x70 && op <= 0x73) || op == 0xc2 || (op >= 0xc4 && op <= 0xc6)));
  if (imm) len += 1;
  return len <= n ? len : 0;
}

}  // namespace uprobe::arch
