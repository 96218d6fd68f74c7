# ctest scheduling of the tests whose assertion is about timing between their
# own threads (applied after discovery, as sanitizer_labels.cmake). Keep this
# list short; every entry says why.

# A thread runs through 64 optimized sites without pause while the main
# thread attaches and detaches them 16 times; detached stubs are reused once
# a sample has seen the thread outside them, and the test requires that no
# second XOL region was needed. With another test's processes competing for
# the two CPUs (ctest -j2) the thread can be preempted inside stubs often
# enough that reuse waits (one failure in a clean clone's `make test` while
# other programs ran too; 0 in 30 runs alone, with 2 or 4 busy loops beside).
set_tests_properties(opt.Reclaim.AThreadRunsThroughSitesWhileTheirMemoryIsReused PROPERTIES RUN_SERIAL TRUE)

# A second thread sends SIGUSR1 without pause while the main thread calls a
# return-probed function; the handler calls another, and the test requires
# that at least one of those calls returned through its probe (a signal
# landing inside one of libuprobe's handlers makes a recursion miss instead).
# With another test's processes competing for the two CPUs (ctest -j2), every
# signal of a run landed inside a handler in ~1 run of 10 (0 in 60 alone).
set_tests_properties(ret.RetLanding.SignalsWithProbedCallsInBetween PROPERTIES RUN_SERIAL TRUE)
