/* SPDX-License-Identifier: MIT */
/* Offsets into glibc's x86-64 ucontext_t and jmp_buf that context.S uses
 * (plain #defines: included by the assembler too). arch/x86_64/ucontext.cpp
 * checks each against offsetof() at compile time. */
#pragma once

/* ucontext_t: uc_mcontext.gregs[REG_RDI], [REG_RSP], [REG_RIP], uc_sigmask. */
#define UPROBE_UC_RDI 104
#define UPROBE_UC_RSP 160
#define UPROBE_UC_RIP 168
#define UPROBE_UC_SIGMASK 296

/* struct __jmp_buf_tag: __saved_mask.__val[15], a word the kernel never
 * writes (it reads and writes 8 of the mask's 128 bytes): __sigsetjmp()
 * leaves the program's SIGTRAP view there for siglongjmp() (src/interpose/masks.cpp). */
#define UPROBE_JB_MARK 192

/* The two values of that word: the program's view blocked SIGTRAP when the
 * mask was saved, or not. */
#define UPROBE_JB_MARK_CLEAR 0x7570726f62656d30 /* "0mebopru" */
#define UPROBE_JB_MARK_BLOCKED 0x7570726f62656d31

/* SIGTRAP's bit in the first word of a sigset_t. */
#define UPROBE_SIGTRAP_BIT 0x10
