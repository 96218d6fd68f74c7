// SPDX-License-Identifier: MIT
// Multi-thread stress of the return-instance pool in both modes: threads get
// and put 1e6 objects each with random nesting, claiming every object with a
// thread tag (an object handed to two threads at once is caught on the spot);
// objects crossing threads (got on one, put on another); and at the end every
// object is back: the pool hands out exactly capacity() distinct objects.

#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "pool_common.hpp"

using namespace pooltest;

namespace {

struct StressCase {
  RiPoolMode mode;
  int threads;
};

class PoolStress : public ::testing::TestWithParam<StressCase> {};
INSTANTIATE_TEST_SUITE_P(Cases, PoolStress,
                         ::testing::Values(StressCase{RiPoolMode::objpool, 2}, StressCase{RiPoolMode::objpool, 4},
                                           StressCase{RiPoolMode::freelist, 2},
                                           StressCase{RiPoolMode::freelist, 4}),
                         [](const auto& info) {
                           return std::string(mode_name(info.param.mode)) + "_" +
                                  std::to_string(info.param.threads) + "threads";
                         });

constexpr long kPairs = 1000000;
constexpr int kMaxHeld = 40;  // deeper than a cache's slack: rings see traffic too

struct Tally {
  long gets = 0, nulls = 0, errors = 0;
};

void worker(RiPool& p, int id, Tally& out) {
  Rng rng{0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(id + 1)};
  const std::uint64_t tag = 0x1000 + static_cast<std::uint64_t>(id);
  void* held[kMaxHeld];
  int n = 0;
  Tally t;
  while (t.gets < kPairs || n > 0) {
    const bool do_get = t.gets < kPairs && (n == 0 || (n < kMaxHeld && (rng.next() & 1)));
    if (do_get) {
      ++t.gets;
      void* obj = p.get();
      if (obj == nullptr) {
        ++t.nulls;
        continue;
      }
      if (claim(obj, tag) != 0) ++t.errors;
      std::uint64_t* w = words(obj);
      w[2] = tag;
      w[3] = static_cast<std::uint64_t>(t.gets);
      w[7] = tag ^ w[3];
      held[n++] = obj;
    } else {
      const int i = static_cast<int>(rng.next() % static_cast<std::uint64_t>(n));
      void* obj = held[i];
      held[i] = held[--n];
      const std::uint64_t* w = words(obj);
      if (w[2] != tag || w[7] != (tag ^ w[3])) ++t.errors;  // someone else wrote it
      if (release(obj) != tag) ++t.errors;
      p.put(obj);
    }
  }
  p.thread_exit();
  out = t;
}

TEST_P(PoolStress, TaggedGetPutStorm) {
  const StressCase c = GetParam();
  RiPool p(64, 4096);
  p.set_modes(c.mode, RiLockMode::none);
  std::vector<Tally> tallies(static_cast<std::size_t>(c.threads));
  std::vector<std::thread> threads;
  for (int i = 0; i < c.threads; ++i) threads.emplace_back(worker, std::ref(p), i, std::ref(tallies[i]));
  for (auto& t : threads) t.join();
  long nulls = 0;
  for (const Tally& t : tallies) {
    EXPECT_EQ(t.gets, kPairs);
    EXPECT_EQ(t.errors, 0);
    nulls += t.nulls;
  }
  RecordProperty("nulls", static_cast<int>(nulls));
  RecordProperty("capacity", static_cast<int>(p.capacity()));
  std::string why;
  EXPECT_EQ(drain_check_refill(p, &why), p.capacity()) << why;
}

// Producers get objects and hand them to consumers that put them back: every
// put is on another thread (and often another CPU's ring) than the get.
TEST_P(PoolStress, CrossThreadHandOff) {
  const StressCase c = GetParam();
  RiPool p(128, 2048);
  p.set_modes(c.mode, RiLockMode::none);
  const int producers = c.threads / 2, consumers = c.threads - producers;
  constexpr long kPerProducer = 300000;
  constexpr std::size_t kBatch = 32;
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::vector<void*>> queue;
  int producers_left = producers;
  std::atomic<long> errors{0}, nulls{0}, consumed{0};

  auto producer = [&](int id) {
    const std::uint64_t tag = 0x2000 + static_cast<std::uint64_t>(id);
    std::vector<void*> batch;
    for (long i = 0; i < kPerProducer; ++i) {
      void* obj = p.get();
      if (obj == nullptr) {
        ++nulls;
        continue;
      }
      if (claim(obj, tag) != 0) ++errors;
      batch.push_back(obj);
      if (batch.size() == kBatch) {
        std::unique_lock<std::mutex> lk(m);
        cv.wait(lk, [&] { return queue.size() < 16; });
        queue.push_back(std::move(batch));
        batch.clear();
        cv.notify_all();
      }
    }
    std::unique_lock<std::mutex> lk(m);
    if (!batch.empty()) queue.push_back(std::move(batch));
    --producers_left;
    cv.notify_all();
    lk.unlock();
    p.thread_exit();
  };
  auto consumer = [&] {
    for (;;) {
      std::vector<void*> batch;
      {
        std::unique_lock<std::mutex> lk(m);
        cv.wait(lk, [&] { return !queue.empty() || producers_left == 0; });
        if (queue.empty()) break;
        batch = std::move(queue.front());
        queue.pop_front();
        cv.notify_all();
      }
      for (void* obj : batch) {
        if ((release(obj) & ~0xFFFull) != 0x2000) ++errors;
        p.put(obj);
        ++consumed;
      }
    }
    p.thread_exit();
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < producers; ++i) threads.emplace_back(producer, i);
  for (int i = 0; i < consumers; ++i) threads.emplace_back(consumer);
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(consumed.load() + nulls.load(), producers * kPerProducer);
  std::string why;
  EXPECT_EQ(drain_check_refill(p, &why), p.capacity()) << why;
}

}  // namespace
