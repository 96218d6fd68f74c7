#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""trace.agent_gpr: the agent's hit path touches no vector or x87 register.

  agent_gpr_check.py LIBUPROBE_AGENT_SO LIBUPROBE_SO [OBJDUMP]

The agent's consumers declare Consumer::set_vector_state_unused(), so at an
optimized site libuprobe saves no vector or x87 state around them: every
function a hit can reach must leave that state alone. From the consumers'
callbacks (FnConsumer::handler, FnConsumer::ret_handler,
CountConsumer::handler), follows every direct call and tail jump through the
agent and into libuprobe (its probe_read_user*, session_cookie,
usdt::ArgSpec::read and what they call), and fails on:
  - an instruction that names an xmm/ymm/zmm/mm/st register or is an x87 one;
  - a call into libc (through the PLT) other than the system-call wrappers
    and the few functions known to use general registers only (ALLOWED_LIBC:
    no memcpy/memset/strlen..., glibc's use AVX);
  - an indirect call outside the interpreter's map callbacks, which only the
    CLI sets (bt::HitContext::read_map, map_op: null in the agent). (An
    indirect jmp is taken for a switch's jump table.)
Prints what it walked. Exit 0: clean, 1: findings, 2: bad input."""
import re
import subprocess
import sys

ROOTS = re.compile(r"\b(FnConsumer::handler|FnConsumer::ret_handler|CountConsumer::handler)\(uprobe::Regs&")
VECTOR = re.compile(r"%[xyz]mm\d|%mm\d|%st\b|\tf(ld|st|ild|ist|add|mul|sub|div|xch|comi|ucomi|nstcw|ldcw|xsave|xrstor|nstenv|ldenv)|\t(v|vzero)")
# glibc functions a hit may call: system-call wrappers (and clock_gettime,
# which calls the vDSO, built by the kernel without vector code).
ALLOWED_LIBC = {"__errno_location", "clock_gettime", "close", "fallocate", "fallocate64", "getpid", "mmap", "mmap64",
                "munmap", "open", "open64", "prctl", "pthread_self", "pwrite", "pwrite64", "syscall"}
# Functions whose indirect calls are the CLI's callbacks (never set in the agent),
# and now_ns(), whose one indirect call is the vDSO's clock_gettime (built by
# the kernel without vector code; called directly: libc's would be a probe hit
# under uprobe:libc:*).
INDIRECT_OK = re.compile(r"^uptrace::bt::(Vm::(eval|exec|del|run_probe)|now_ns)\(")


def disassemble(path, objdump):
    r = subprocess.run([objdump, "-d", "--no-show-raw-insn", "-C", path], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"agent_gpr_check: {objdump} -d {path}: {r.stderr.strip()}")
    funcs, cur = {}, None
    for line in r.stdout.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            continue
        m = re.match(r"^\s+[0-9a-f]+:\t(.*)$", line)
        if m and cur is not None:
            funcs[cur].append(m.group(1))
    return funcs


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    objdump = sys.argv[3] if len(sys.argv) > 3 else "objdump"
    libs = [("agent", disassemble(sys.argv[1], objdump)), ("libuprobe", disassemble(sys.argv[2], objdump))]
    roots = [("agent", f) for f in libs[0][1] if ROOTS.search(f)]
    if len(roots) != 3:
        print(f"agent_gpr_check: expected the 3 consumer callbacks in {sys.argv[1]}, found {len(roots)}")
        return 2
    findings, seen, todo, libc_calls = [], set(), list(roots), set()
    funcs = dict(libs)
    while todo:
        lib, f = todo.pop()
        if (lib, f) in seen:
            continue
        seen.add((lib, f))
        body = funcs[lib].get(f)
        if body is None:
            findings.append(f"{lib}: {f}: not found")
            continue
        for ins in body:
            if VECTOR.search("\t" + ins):
                findings.append(f"{lib}: {f}: {ins}")
            m = re.match(r"(call|jmp)\s+[0-9a-f]+ <(.+)>$", ins)
            if m:
                target = m.group(2)
                if target.endswith("@plt"):
                    name = target[: -len("@plt")]
                    if name.startswith("uprobe::"):
                        todo.append(("libuprobe", name))
                    elif name in ALLOWED_LIBC:
                        libc_calls.add(name)
                    else:
                        findings.append(f"{lib}: {f}: calls {name} (not known to leave vector registers alone)")
                elif re.search(r"\+0x[0-9a-f]+$", target):
                    continue  # a branch inside a function
                else:
                    todo.append((lib, target))
            elif re.match(r"call\s+\*", ins) and not INDIRECT_OK.search(f):
                findings.append(f"{lib}: {f}: indirect {ins}")
            # (an indirect jmp is a switch's jump table: a branch inside the function)
    print(f"agent_gpr_check: {len(seen)} functions reached from the consumers' callbacks:")
    for lib, f in sorted(seen):
        print(f"  {lib}: {f}")
    print(f"agent_gpr_check: libc calls: {', '.join(sorted(libc_calls))}")
    for x in findings:
        print(f"agent_gpr_check: FAIL {x}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
