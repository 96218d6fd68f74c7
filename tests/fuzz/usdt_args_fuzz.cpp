// SPDX-License-Identifier: MIT
// libFuzzer target: USDT argument specs (the args string of a .note.stapsdt
// note, e.g. "-4@%edi 8@-8(%rbp) 8@%rax 4@$5 -8@12(%rdx,%rcx,8)") through
// uprobe::usdt::parse_args(), format_arg() and ArgSpec::read().
//
// Oracles besides the sanitizers (ASan, UBSan):
//  - parse_args() reports an error with a 1-based argument number, or parses
//    at most kMaxArgs arguments, each with a valid size, kind and registers;
//  - every parsed argument without a symbol prints (format_arg) as a spec
//    that parses back to the identical argument (no symbol: the printed form
//    of a resolved symbol operand, "%rip+0x..", is for messages only);
//  - ArgSpec::read() (checked access: process_vm_readv, never a fault) agrees
//    with an independent evaluation of the argument for registers and
//    constants, and never reads past the 12 arguments.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "uprobe/usdt.hpp"

namespace {

using uprobe::Regs;
using uprobe::usdt::Arg;
using uprobe::usdt::ArgKind;
using uprobe::usdt::kMaxArgs;
using uprobe::usdt::MemoryAccess;
using uprobe::usdt::ParseContext;
using uprobe::usdt::ParseResult;
using uprobe::usdt::Reg;

[[noreturn]] void fail(const char* what, std::string_view text) {
  std::fprintf(stderr, "usdt_args_fuzz: %s for input `%.*s'\n", what, static_cast<int>(text.size()), text.data());
  std::abort();
}

bool same(const Arg& a, const Arg& b) {
  return a.disp == b.disp && a.kind == b.kind && a.size == b.size && a.base == b.base && a.index == b.index &&
         a.scale == b.scale && a.width == b.width && a.pc_relative == b.pc_relative && a.is_float == b.is_float;
}

std::uint64_t reg_of(const Regs& r, Reg g) {
  switch (g) {
    case Reg::rax: return r.rax;
    case Reg::rbx: return r.rbx;
    case Reg::rcx: return r.rcx;
    case Reg::rdx: return r.rdx;
    case Reg::rsi: return r.rsi;
    case Reg::rdi: return r.rdi;
    case Reg::rbp: return r.rbp;
    case Reg::rsp: return r.rsp;
    case Reg::r8: return r.r8;
    case Reg::r9: return r.r9;
    case Reg::r10: return r.r10;
    case Reg::r11: return r.r11;
    case Reg::r12: return r.r12;
    case Reg::r13: return r.r13;
    case Reg::r14: return r.r14;
    case Reg::r15: return r.r15;
    case Reg::rip: return r.rip;
    case Reg::ah: return r.rax >> 8 & 0xff;
    case Reg::bh: return r.rbx >> 8 & 0xff;
    case Reg::ch: return r.rcx >> 8 & 0xff;
    case Reg::dh: return r.rdx >> 8 & 0xff;
    default: return 0;
  }
}

std::uint64_t extend(std::uint64_t v, const Arg& a) {
  const unsigned n = a.bytes();
  if (n >= 8) return v;
  const unsigned sh = 64 - 8 * n;
  return a.is_signed() ? static_cast<std::uint64_t>(static_cast<std::int64_t>(v << sh) >> sh) : (v << sh) >> sh;
}

void check_arg(const Arg& a, std::string_view text) {
  const unsigned n = a.bytes();
  if (n != 1 && n != 2 && n != 4 && n != 8) fail("argument size not 1, 2, 4 or 8", text);
  if (a.is_float && n != 4 && n != 8) fail("float argument size not 4 or 8", text);
  if (a.kind != ArgKind::constant && a.kind != ArgKind::reg && a.kind != ArgKind::memory) fail("bad kind", text);
  if (a.kind == ArgKind::memory) {
    if (a.scale != 1 && a.scale != 2 && a.scale != 4 && a.scale != 8) fail("bad scale", text);
    if (a.index == Reg::rsp || a.index == Reg::rip || a.index > Reg::r15) fail("bad index register", text);
    if (a.base > Reg::rip) fail("bad base register", text);
  }
  if (a.kind == ArgKind::reg && a.base == Reg::none) fail("register argument without a register", text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ParseContext ctx;
  ctx.pc = 0x401000;
  // Two known symbols; everything else is unknown (as in a file's tables).
  ctx.lookup = [](std::string_view name) -> std::optional<std::uint64_t> {
    if (name == "counter") return 0x404010;
    if (name == "_ZL5table") return 0x405000;
    return std::nullopt;
  };
  const ParseResult r = uprobe::usdt::parse_args(text, ctx);
  if (!r.ok()) {
    if (r.error_arg == 0 || r.error_arg > kMaxArgs + 1) fail("error without a valid argument number", text);
    if (r.args.count() != r.error_arg - 1) fail("arguments before the bad one not all kept", text);
  } else if (r.error_arg != 0) {
    fail("success with an error argument number", text);
  }
  if (r.args.count() > kMaxArgs) fail("more than kMaxArgs arguments", text);

  Regs regs{};
  regs.rax = 0x80f1e2d3c4b5a697;
  regs.rbx = 0x1122334455667788;
  regs.rcx = 0xfedcba9876543210;
  regs.rdx = 0x0123456789abcdef;
  regs.rsi = 0xa5a5a5a5a5a5a5a5;
  regs.rdi = 0x5a5a5a5a5a5a5a5a;
  regs.rbp = reinterpret_cast<std::uint64_t>(&regs);  // memory operands off rbp read this frame
  regs.rsp = 0x10;
  regs.r8 = 0xffffffffffffff80;
  regs.r9 = 0x8000000080008080;
  regs.r12 = 0x7fffffff;
  regs.r13 = 0x8000000000000000;
  regs.rip = 0x401000;

  for (unsigned i = 0; i < r.args.count(); ++i) {
    const Arg& a = r.args[i];
    check_arg(a, text);
    if (!a.pc_relative) {
      const std::string printed = uprobe::usdt::format_arg(a);
      const ParseResult again = uprobe::usdt::parse_args(printed, ctx);
      if (!again.ok() || again.args.count() != 1 || !same(again.args[0], a)) {
        std::fprintf(stderr, "printed as `%s' (%s)\n", printed.c_str(), again.error.c_str());
        fail("format_arg() does not parse back to the same argument", text);
      }
    }
    std::uint64_t got = 0xdead;
    const bool ok = r.args.read(i, regs, got, MemoryAccess::checked);
    switch (a.kind) {
      case ArgKind::constant: {
        const std::uint64_t want = extend(static_cast<std::uint64_t>(a.disp) + (a.pc_relative ? regs.rip : 0), a);
        if (!ok || got != want) fail("constant evaluated wrongly", text);
        break;
      }
      case ArgKind::reg:
        if (a.base == Reg::xmm) {
          if (ok || got != 0xdead) fail("xmm register evaluated", text);
        } else if (!ok || got != extend(reg_of(regs, a.base), a)) {
          fail("register evaluated wrongly", text);
        }
        break;
      case ArgKind::memory:
        if (!ok && got != 0xdead) fail("failed read changed the output", text);
        break;
    }
  }
  std::uint64_t v = 0x77;
  if (r.args.read(r.args.count(), regs, v) || v != 0x77) fail("read past the last argument", text);
  if (r.args.read(kMaxArgs + 3, regs, v) || v != 0x77) fail("read past kMaxArgs", text);
  return 0;
}
