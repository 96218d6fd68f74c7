// SPDX-License-Identifier: MIT
// libuprobe loaded after libc: a program that links a library which links
// libuprobe (load_order_main.c, load_order_lib.c) loads libuprobe after libc,
// so libuprobe's interposers of sigaction, sigprocmask, pthread_create and
// dlopen never see the program's calls (libc's definitions come first in the
// search order) and an int3 could be hit with SIGTRAP blocked. Every
// registration is then refused with -EPERM and a message saying what to do,
// and the program's text is unchanged; with libuprobe LD_PRELOADed (first in
// the order) the same program is probed: 10 hits. (A bug report: with libuprobe after libc,
// dlsym(RTLD_NEXT, "dlopen") found nothing, Capstone was never loaded and
// every registration failed with "Capstone cannot be loaded: undefined
// symbol: dlopen".)

#include <errno.h>
#include <stdio.h>

#include <string>

#include <gtest/gtest.h>

namespace {

std::string run(const std::string& env) {
  const std::string cmd = env + " " + LOAD_ORDER_MAIN + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "popen failed";
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int st = pclose(p);
  if (st != 0) out += " [exit status " + std::to_string(st) + "]";
  return out;
}

TEST(LoadOrder, AfterLibcEveryRegistrationIsRefusedAndTheTextIsUnchanged) {
  const std::string out = run("env -u LD_PRELOAD");
  const std::string head = "rc=" + std::to_string(-EPERM) + " sum=145 hits=0 same=1 why=libuprobe: cannot probe ";
  EXPECT_EQ(out.rfind(head, 0), 0u) << out;
  EXPECT_NE(out.find("libuprobe was loaded after libc in this process"), std::string::npos) << out;
  EXPECT_NE(out.find("put libuprobe.so first in LD_PRELOAD"), std::string::npos) << out;
}

TEST(LoadOrder, InANamespaceOfItsOwnEveryRegistrationIsRefused) {
  // dlmopen(LM_ID_NEWLM): libuprobe is first in its own namespace, but the
  // program calls the base namespace's libc (a bug report: accepted, then
  // killed by SIGTRAP after sigprocmask blocked it).
  const std::string cmd = std::string("GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536 ") + LOAD_ORDER_DLMOPEN +
                          " " + LIBUPROBE_SO + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << out;
  const std::string head = "rc=" + std::to_string(-EPERM) + " hits=0 sum=11 why=libuprobe: cannot probe ";
  EXPECT_EQ(out.rfind(head, 0), 0u) << out;
  EXPECT_NE(out.find("into a namespace of its own by dlmopen"), std::string::npos) << out;
}

TEST(LoadOrder, PreloadedFirstTheSameProgramIsProbed) {
  const std::string out = run(std::string("LD_PRELOAD=") + LIBUPROBE_SO);
  EXPECT_EQ(out, "rc=0 sum=145 hits=10 same=0 why=\n");
}

}  // namespace
