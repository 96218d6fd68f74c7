// Limits and hostile inputs found by a break-it review: a FIFO is refused at
// once (never waited on), the 11th return consumer of one probe is refused,
// Config::max_uretprobe_depth is validated.

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <uprobe/config.hpp>

#include "common.hpp"
#include "fixtures.hpp"

using namespace coretest;
using uprobe::Errc;

namespace {

struct Ret : uprobe::Consumer {
  Ret() : Consumer(uprobe::Callbacks::entry_and_ret) {}
  void ret_handler(uprobe::Regs&, std::uint64_t) override { ++rets; }
  unsigned rets = 0;
};

struct Plain : uprobe::Consumer {
  uprobe::Action handler(uprobe::Regs&) override { return uprobe::Action::keep; }
};

TEST(Limits, FifoIsRefusedWithoutBlocking) {
  const std::string fifo = "/tmp/libuprobe-test-fifo-" + std::to_string(::getpid());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Plain c;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    uprobe::register_uprobe(fifo, 0x10, c);
    ADD_FAILURE() << "a FIFO was accepted";
  } catch (const uprobe::Error& e) {
    EXPECT_EQ(e.code(), Errc::not_executable) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  ::unlink(fifo.c_str());
}

TEST(Limits, EmptyPathSaysSo) {
  Plain c;
  try {
    uprobe::register_uprobe(std::string(), 0, c);
    ADD_FAILURE() << "an empty path was accepted";
  } catch (const uprobe::Error& e) {
    EXPECT_EQ(e.code(), Errc::file_not_found);
    EXPECT_NE(std::string(e.what()).find("empty"), std::string::npos) << e.what();
  }
}

TEST(Limits, EleventhReturnConsumerIsRefused) {
  std::vector<std::unique_ptr<Ret>> cs;
  std::vector<uprobe::Uprobe*> ps;
  for (int i = 0; i < 10; ++i) {
    cs.push_back(std::make_unique<Ret>());
    ps.push_back(uprobe::register_uprobe(fx_addr(fx_push_rbp), *cs.back()));
  }
  Ret extra;
  try {
    uprobe::register_uprobe(fx_addr(fx_push_rbp), extra);
    ADD_FAILURE() << "an 11th return consumer was accepted";
  } catch (const uprobe::Error& e) {
    EXPECT_EQ(e.code(), Errc::too_many_return_consumers) << e.what();
    EXPECT_NE(std::string(e.what()).find("this probe already has 10 consumers with a ret_handler"), std::string::npos)
        << e.what();
  }
  Plain entry_only;  // an entry-only consumer is still welcome
  uprobe::Uprobe* q = uprobe::register_uprobe(fx_addr(fx_push_rbp), entry_only);
  EXPECT_EQ(uprobe::probe_info(q).consumers, 11u);
  uprobe::unregister_uprobe(q, entry_only);
  for (std::size_t i = 0; i < cs.size(); ++i) uprobe::unregister_uprobe(ps[i], *cs[i]);
}

TEST(Limits, MaxUretprobeDepthIsValidated) {
  const uprobe::Config before = uprobe::configuration();
  for (unsigned bad : {0u, 4097u}) {
    uprobe::Config c = before;
    c.max_uretprobe_depth = bad;
    EXPECT_THROW(uprobe::configure(c), std::invalid_argument) << bad;
    EXPECT_EQ(uprobe::configuration().max_uretprobe_depth, before.max_uretprobe_depth);
  }
  uprobe::Config c = before;
  c.max_uretprobe_depth = 4096;
  uprobe::configure(c);
  EXPECT_EQ(uprobe::configuration().max_uretprobe_depth, 4096u);
  uprobe::configure(before);
}

}  // namespace
