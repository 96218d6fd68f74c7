# ctest labels of the tests that do not run under a sanitizer build
# (`make test-asan` runs `ctest -LE no-asan`, `make test-tsan` `-LE no-tsan`).
# Included by ctest after the tests are discovered (tests/CMakeLists.txt adds
# it to every test directory's TEST_INCLUDE_FILES), so gtest names work here.
# Keep this list short; every entry says why.

# Strict seccomp filter (read, write, exit_group, rt_sigreturn, futex) and then
# "no system call at all" on the optimized path: the instrumented path calls
# into the sanitizer runtime, which the filter then kills for its own calls.
set_tests_properties(opt.Seccomp.OptimizedHitsMakeNoSystemCall PROPERTIES LABELS "no-asan;no-tsan")
# An RSS bound (1000 threads, 2 MiB): shadow memory and the sanitizer
# allocator's per-thread caches are resident memory the bound does not allow for.
set_tests_properties(ret.RetProcess.ThousandThreadsNoLeak PROPERTIES LABELS "no-asan;no-tsan")
# TSD destructors that run the test's (instrumented) code in glibc's later
# destructor rounds, after TSan's own thread-exit destructor has freed its
# state for the thread: TSan faults in its runtime (SEGV, "nested bug").
set_tests_properties(ret.RetProcess.TsdDestructorsCallingReturnProbedCodeLeakNothing PROPERTIES LABELS "no-tsan")
# A green thread: siglongjmp back into a signal handler's frame on another
# stack after a jump out of it; TSan's longjmp interceptor cannot follow it
# ("can't find longjmp buf", CHECK failed). ASan runs it.
set_tests_properties([=[life.Kinds/Signals.AHitLeftForAnotherStackAndResumedEndsAsAnyHit/int3  # GetParam() = 4-byte object <00-00 00-00>]=]
                     [=[life.Kinds/Signals.AHitLeftForAnotherStackAndResumedEndsAsAnyHit/optimized  # GetParam() = 4-byte object <01-00 00-00>]=]
                     PROPERTIES LABELS "no-tsan")
# Counts every mapping of the process round by round: ASan's allocator makes
# and merges regions of its own between rounds (its quarantine holds freed
# blocks; seen as 286 -> 285 mappings, every region the same size class).
# It runs in the plain and TSan suites.
set_tests_properties(opt.Reclaim.RoundsOfDistinctSitesReuseTheirStubsAndMappingsStayBounded PROPERTIES LABELS "no-asan")
# dlopen("libX.so") must search the calling executable's RUNPATH; libuprobe's
# interposed dlopen() finds its caller by return address, and under a
# sanitizer the caller is the sanitizer's own dlopen interceptor (libasan /
# libtsan, no RUNPATH), so the search path is the wrong one.
set_tests_properties(usdt.pie.Libraries.NotLoadedThenSearchPathThenLoaded PROPERTIES LABELS "no-asan;no-tsan")
# Asserts which argument operand forms (index, stack) gcc chose for sys/sdt.h
# probes in an -O2 C fixture; instrumented code generation chooses others.
set_tests_properties(usdt.UsdtArgs.SdtFromCLive usdt.nopie.UsdtArgs.SdtFromCLive usdt.lld.UsdtArgs.SdtFromCLive
                     PROPERTIES LABELS "no-asan;no-tsan")
# uprobe-trace preloads libuprobe-agent.so (instrumented) into the traced
# program; a program not linked with the sanitizer runtime then stops with
# "ASan runtime does not come first in initial library list" (TSan likewise).
set_tests_properties(trace.Trace.BashRunsItsCommandsAndNoFollowLeavesThemUntraced
                     PROPERTIES LABELS "no-asan;no-tsan")  # (bash: as the tests below)
set_tests_properties(trace.Trace.FunctionAndMallocCountsAreExact trace.Trace.MallocCountIsExactWithoutOtherProbes
                     trace.Trace.FilesNamedLikeLibrariesInTheWorkingDirectoryAreNotLoaded
                     trace.Trace.WildcardMatchesExactlyTheThreeFunctions
                     trace.Trace.UsdtSemaphoreGuardedBranchRunsOnlyWhileTraced trace.Trace.ThreadsCountInTheirOwnSlots
                     trace.Trace.ForkedChildCountsSeparately trace.Trace.ExecIsFollowedUnlessNoFollow
                     trace.Trace.UnderscoreExitKeepsTheCounts trace.Trace.ProcessesThatSkipExitKeepTheirCounts
                     trace.Trace.FatalSignalKeepsTheCounts trace.Trace.CtrlCPrintsTheCounts
                     trace.Trace.SecondCtrlCPrintsTheCountsSoFar trace.Trace.DashScriptIsCounted
                     trace.Trace.ForkChildrenCountFromTheirFirstInstruction trace.Trace.HitsThatCannotBeRecordedAreReported
                     trace.Trace.EveryInitializerAndDestructorCounts trace.Trace.AnotherInitFirstLibraryIsNamed
                     trace.Trace.AgentOwnLibcCallsAreNotCounted trace.Trace.BadInputIsRefusedBeforeTheProgramRuns
                     trace.Trace.SpecsNamingOneSiteEachCount trace.Trace.EveryLibcFunctionLeavesTheProgramAlive
                     trace.Trace.TraceDirectoryIsInMemoryUnlessTmpdirIsSet
                     trace.Trace.LatencyHistogramOfASleepingFunction trace.Trace.ErrorsAndExitStatus
                     trace.Trace.ProbeHitWithSignalsBlocked trace.Trace.XzWorkersBlockEverySignalAndCallInt3ProbedMemcpy
                     trace.Trace.XzWorkersCallPunnedMemcpy trace.Trace.EveryLibcReturnLeavesThreadsAndVforkAlive
                     trace.Trace.ReturnProbeOnVforkIsRefusedEntryProbeCounts
                     trace.Trace.ReturnProbeOnThreadExitPathCountsEachThread
                     trace.Trace.TheAgentTakesTheChecksElfTables trace.Trace.HitsMissedInsideAnotherHitAreReported
                     trace.Trace.ASmallTmpdirKeepsTheReportWhole trace.Trace.TheChecksKeepTheirElfTablesForTheNextRun
                     trace.Trace.VforkChildResettingAHandlerLeavesTheParentsHandler
                     trace.Trace.ProgramSeesOnlyItsOwnFileDescriptors trace.Trace.TheProgramStartsSingleThreaded
                     trace.Trace.ProgramStartsWithTheCallersSignalDispositions
                     trace.Python.FunctionEntryCountsEveryCallWhenLineIsOn
                     trace.Python.FunctionEntryAloneFiresOnGeneratorThrow trace.Postgres.ListAndAttachUsdt
                     trace.Bpftrace.CorpusOutputEqualsBpftraces trace.Bpftrace.LiveBpftracePrintsTheSame
                     trace.Bpftrace.OutputFileProgramFileAndDashDash trace.Bpftrace.BareSpecStillCounts
                     trace.Bpftrace.CommandWordsExitStatusAndNoCommand trace.Bpftrace.NoPrintfEventLostOnFind
                     trace.Bpftrace.DeepNestingIsRefusedNotACrash trace.Bpftrace.MapOpsInAProbeReachEveryThreadAndProcess
                     trace.Bpftrace.IncrementsFromEveryThreadAddUp trace.Bpftrace.ListingIsBpftraces
                     trace.Bpftrace.CtrlCEndsTheProgramAndPrintsTheMaps
                     trace.Bpftrace.LostEventsAreCountedInTheOutput
                     trace.Bpftrace.UstackOfSeveralProcessesSymbolizedWithTheirOwnModules
                     trace.Bpftrace.UstackOfADlopenedLibraryIsSymbolized
                     trace.Bpftrace.UstackShowsTheRealReturnAddressOfAFrameWithAPendingReturnProbe
                     trace.Bpftrace.ExecutableLinesAreSkippedAsBpftraceSkipsThem
                     trace.Bpftrace.ACrashDoesNotWaitForTheProcessesItLeft trace.Trace.ACrashDoesNotWaitForTheProcessesItLeft
                     trace.Bpftrace.UstackInAnInterposedLibcFunctionIsTheKernels
                     trace.Bpftrace.TimePrintsTheHitsLocalTimeAsBpftraceFormatsIt
                     trace.Bpftrace.StringMapsReadAndMissingFunctionsSkippedAsBpftrace
                     trace.Bpftrace.PositionalParametersAsBpftraceTakesThem
                     trace.Bpftrace.LoopsRunAsBpftraceRunsThem
                     trace.Trace.TheAgentsOwnCallsAreNotMissedHits
                     trace.Bpftrace.UstackAtAFrameSettingEntryHasItsCaller
                     trace.Bpftrace.AProbeTheProgramRefusedIsNamedWithItsReason
                     trace.Bpftrace.OutputFileInAMissingDirectoryStopsTheProgramBeforeItRuns
                     trace.Bpftrace.OneMapUpdateBlocksRunWithoutTheInterpreterWithItsValues
                     trace.Bpftrace.AnExitInAnEarlierBlockOfTheHitStopsAFastBlock
                     trace.Bpftrace.BuiltinsCallNoLibcFunctionAtAHit
                     trace.Bpftrace.MissingUsdtProbesAreSkippedAsBpftraceSkipsThem
                     trace.Trace.TheEnvironmentIsTheSameWithTheKeptTablesOrWithout
                     trace.Trace.ElfutilsAreMappedOnlyInAProcessThatReadsAFile
                     trace.Trace.AMissingLibdwRefusesTheProbesOfTheProcessThatNeedsItAndSaysWhy
                     trace.Bpftrace.DashReadsTheProgramFromStandardInput
                     PROPERTIES LABELS "no-asan;no-tsan")

# Every descriptor taken: UBSan's vptr check reads the object's memory through
# a pipe it must open (sanitizer_common's IsAccessibleMemoryRange), fails, and
# reports an uprobe::Error being constructed as "invalid vptr".
set_tests_properties(
  [=[life.Kinds/Process.DlopenWithEveryDescriptorTakenLeavesTheProgramRunning/int3  # GetParam() = 4-byte object <00-00 00-00>]=]
  [=[life.Kinds/Process.DlopenWithEveryDescriptorTakenLeavesTheProgramRunning/optimized  # GetParam() = 4-byte object <01-00 00-00>]=]
  PROPERTIES LABELS "no-asan")
# The default action of SIGSEGV/SIGBUS: under ASan and TSan the disposition is
# the sanitizer's own handler (handle_segv), which reports and exits instead
# of letting the process die of the signal (so it does without libuprobe too).
set_tests_properties(life.UserRead.DefaultActionStillKills PROPERTIES LABELS "no-asan;no-tsan")
# SA_RESETHAND as sigaction() shows it afterwards: TSan answers sigaction()
# from a table of its own, which keeps the handler (its deliveries go through
# its own handler, installed without SA_RESETHAND).
set_tests_properties(life.UserRead.ResetHandHandlesOneFault PROPERTIES LABELS "no-tsan")

# The agent's hit path read from its disassembly: instrumented code calls the
# sanitizer runtimes (which use vector registers; libuprobe saves the vector
# state for every consumer under TSan, set_vector_state_unused() or not).
set_tests_properties(trace.agent_gpr PROPERTIES LABELS "no-asan;no-tsan")

# ThreadSanitizer only (`make test-tsan`). TSan keeps the program's sigaction()
# in a table of its own (sigaction() reads sa_mask back as given, SIGKILL and
# SIGSTOP included) and runs deferred handlers under its own pthread_sigmask of
# every signal (which glibc's rules then apply to): the exact masks this test
# asserts are the kernel's, not TSan's. (Its hits work under TSan.)
set_tests_properties(life.Masks.HandlerWithFullSaMaskTakesInt3Hits PROPERTIES LABELS "no-tsan")
# TSan intercepts pthread_mutex_lock/unlock and runs libc's from inside its
# interceptor: the probe on libc's internal unlock would be hit inside the
# sanitizer's runtime, which its hooks do not allow.
set_tests_properties(life.Threads.ProbeOnWhatReaderRegistrationRunsDoesNotHang PROPERTIES LABELS "no-tsan")
# TSan's vfork() interceptor calls fork(): the child's hits are not in our memory.
set_tests_properties(
  [=[life.Kinds/Process.VforkChildCallsProbedCodeThenExecs/int3  # GetParam() = 4-byte object <00-00 00-00>]=]
  [=[life.Kinds/Process.VforkChildCallsProbedCodeThenExecs/optimized  # GetParam() = 4-byte object <01-00 00-00>]=]
  [=[life.Kinds/Process.VforkChildExitsInsideReturnProbedFunction/int3  # GetParam() = 4-byte object <00-00 00-00>]=]
  [=[life.Kinds/Process.VforkChildExitsInsideReturnProbedFunction/optimized  # GetParam() = 4-byte object <01-00 00-00>]=]
  PROPERTIES LABELS "no-tsan")
# TSan's clone() interceptor treats every clone as a fork (ForkBefore, and
# ForkChildAfter in the child): with CLONE_VM the child resets the TSan state
# it shares with the parent, and the test hangs until its timeout.
set_tests_properties(
  [=[life.Kinds/Process.CloneVmChildStackBelowParent/int3  # GetParam() = 4-byte object <00-00 00-00>]=]
  [=[life.Kinds/Process.CloneVmChildStackBelowParent/optimized  # GetParam() = 4-byte object <01-00 00-00>]=]
  [=[life.Kinds/Process.CloneVmChildStackAboveParent/int3  # GetParam() = 4-byte object <00-00 00-00>]=]
  [=[life.Kinds/Process.CloneVmChildStackAboveParent/optimized  # GetParam() = 4-byte object <01-00 00-00>]=]
  PROPERTIES LABELS "no-tsan")
# Entry probes on every exported libc function: some run on a thread before
# libtsan has set up its per-thread state (glibc's thread start, ahead of
# TSan's start routine) or after it tore it down, and a hit there runs our
# TSan-instrumented hit path, whose first TSan call dereferences the missing
# state (core dump: SIGSEGV in __tsan::Acquire with thr=0, called from the
# optimized stub's entry, opt_entry.cpp). Instrumented code cannot run there at
# all; the uninstrumented builds run these tests. The fork children of the
# blocked-SIGTRAP test also do not finish within its timeout under TSan.
set_tests_properties(stress.LibcAll.EntryProbeOnEveryDynsymFunction
                     stress.LibcAll.FunctionsRunWithSigtrapBlockedAreRefusedOrSafe
                     opt.EntryBreak.LibcLibmLibstdcxxEntriesUnderLoad PROPERTIES LABELS "no-tsan")
# TSan defers asynchronous signals to its own delivery points (atomic
# operations, intercepted calls) and keeps one pending per signal, so the
# handler counts that this test bounds (> 200 SIGUSR1, > 100 SIGALRM) depend
# on the machine's load there (31 SIGUSR1 seen on a loaded machine).
set_tests_properties(
  [=[pool.Modes/PoolSignals.HandlersStormWhileMainThreadStorms/objpool  # GetParam() = 1-byte object <00>]=]
  [=[pool.Modes/PoolSignals.HandlersStormWhileMainThreadStorms/freelist  # GetParam() = 1-byte object <01>]=]
  PROPERTIES LABELS "no-tsan")
# The installed libuprobe.a linked into a static consumer: GCC 12 tests
# UBSan's null check on an initial-exec TLS reference (t_state) with the flags
# of `add x@gottpoff(%rip), %reg`, and ld rewrites that add into a flag-less
# `lea` when it relaxes the access for an executable (objdump of
# static_consumer: `lea -0x610(%rax),%rax; je <ubsan null handler>`), so a
# stale flag reports a null ThreadState. A toolchain false positive; the test
# runs in the normal build (make test), shared and static.
set_tests_properties(pkg.consumer PROPERTIES LABELS "no-asan")
# A filter that forbids mmap/munmap/mprotect/mremap for the whole process, then
# pthread_create(): under a sanitizer the runtime maps the new thread's own
# state ("AddressSanitizer failed to allocate 0x1000 bytes of DTLS_NextBlock";
# TSan's thread set-up faults), so the filter stops the sanitizer runtime, not
# a hit. The uninstrumented build runs them.
set_tests_properties(
  [=[life.Kinds/SeccompNoMapping.FirstHitsOfEveryThreadMapNothing/int3_eperm  # GetParam() = (4-byte object <00-00 00-00>, false)]=]
  [=[life.Kinds/SeccompNoMapping.FirstHitsOfEveryThreadMapNothing/int3_sigsys  # GetParam() = (4-byte object <00-00 00-00>, true)]=]
  [=[life.Kinds/SeccompNoMapping.FirstHitsOfEveryThreadMapNothing/optimized_eperm  # GetParam() = (4-byte object <01-00 00-00>, false)]=]
  [=[life.Kinds/SeccompNoMapping.FirstHitsOfEveryThreadMapNothing/optimized_sigsys  # GetParam() = (4-byte object <01-00 00-00>, true)]=]
  PROPERTIES LABELS "no-asan;no-tsan")
# A strict filter (read, write, exit_group, rt_sigreturn, futex) for every
# thread of the process (SECCOMP_FILTER_FLAG_TSYNC): ThreadSanitizer's own
# system calls (its deferred signal delivery, its background thread) are then
# forbidden and the process dies by SIGSYS outside any hit.
set_tests_properties(
  [=[life.Kinds/SeccompStrictThread.ThreadStartedBeforeTheFilterHitsWithoutSystemCalls/int3  # GetParam() = 4-byte object <00-00 00-00>]=]
  [=[life.Kinds/SeccompStrictThread.ThreadStartedBeforeTheFilterHitsWithoutSystemCalls/optimized  # GetParam() = 4-byte object <01-00 00-00>]=]
  PROPERTIES LABELS "no-tsan")
# ThreadSanitizer replaces vfork() with fork() in its interceptor: libc's vfork
# never runs (its entry probe counts 0) and the child does not share the
# parent's memory (what these tests are about).
set_tests_properties(
  [=[life.Kinds/Process.ReturnProbeOnVforkIsRefusedEntryProbeCounts/int3  # GetParam() = 4-byte object <00-00 00-00>]=]
  [=[life.Kinds/Process.ReturnProbeOnVforkIsRefusedEntryProbeCounts/optimized  # GetParam() = 4-byte object <01-00 00-00>]=]
  [=[life.Kinds/Process.VforkChildResettingHandlersLeavesTheParentsAlone/int3  # GetParam() = 4-byte object <00-00 00-00>]=]
  [=[life.Kinds/Process.VforkChildResettingHandlersLeavesTheParentsAlone/optimized  # GetParam() = 4-byte object <01-00 00-00>]=]
  PROPERTIES LABELS "no-tsan")
# Return handlers on glibc's thread-exit path (__nptl_deallocate_tsd) run
# after TSan's own thread-exit destructor: TSan's state of that thread is
# gone (an instrumented atomic that needs a new sync object faults: SEGV in
# __tsan::MetaMap::GetSync), and the hand-over that makes the unregister's
# grace period wait for such a handler (a count of readers liburcu-bp no
# longer knows, src/hit/rcu_read.c) is uninstrumented for that reason, so
# TSan reports the consumer set's free after the wait as a race. The plain
# and ASan suites run them (UnregisterWaits... asserts the wait).
set_tests_properties(
  [=[life.Kinds/Threads.ReturnProbeOnThreadExitPathReturns/int3  # GetParam() = 4-byte object <00-00 00-00>]=]
  [=[life.Kinds/Threads.ReturnProbeOnThreadExitPathReturns/optimized  # GetParam() = 4-byte object <01-00 00-00>]=]
  [=[life.Kinds/Threads.UnregisterWaitsForAReturnHandlerOnTheThreadExitPath/int3  # GetParam() = 4-byte object <00-00 00-00>]=]
  [=[life.Kinds/Threads.UnregisterWaitsForAReturnHandlerOnTheThreadExitPath/optimized  # GetParam() = 4-byte object <01-00 00-00>]=]
  PROPERTIES LABELS "no-tsan")
# LD_PRELOAD=libuprobe.so (instrumented) loads it ahead of the sanitizer
# runtime, which then stops with "ASan runtime does not come first in initial
# library list" (TSan likewise). The refusal test of the same file runs.
# dlmopen() of the instrumented libuprobe.so loads a second sanitizer runtime into the new namespace.
set_tests_properties(life.LoadOrder.PreloadedFirstTheSameProgramIsProbed
                     life.LoadOrder.InANamespaceOfItsOwnEveryRegistrationIsRefused PROPERTIES LABELS "no-asan;no-tsan")
# A fork child of a process whose other thread is inside malloc: GCC 12's
# AddressSanitizer allocator does not hold its size-class locks across fork(),
# so the child may wait forever in its first calloc() (seen in Capstone's
# cs_open(); the test's SIGALRM ends it). The tests are about libuprobe's own
# locks; they run in the plain and the TSan suites. (life.ForkLocks: a child
# stuck in the allocator's GetFromAllocator under a registration's new, 1 of
# 10 runs of ActionRemoveInAnotherThread.)
set_tests_properties(opt.Window.ForkWhileAnotherThreadPlansLeavesTheChildFree
                     life.ForkLocks.ProgramSettingItsSigtrapActionInAnotherThread
                     life.ForkLocks.LockedLookupWhileAnotherThreadHits
                     life.ForkLocks.ActionRemoveInAnotherThread PROPERTIES LABELS "no-asan")
# ThreadSanitizer reports a thread leak at the exit of each fork child of
# life_fork_first_use (the parent's planning thread, not joined there), so
# every child exits non-zero; and it is ASan's allocator case above too.
set_tests_properties(life.ForkLocks.FirstUseInAFreshProcess PROPERTIES LABELS "no-asan;no-tsan")

# A consumer on malloc() whose handler forks: under a sanitizer malloc() is the
# runtime's (libasan's, libtsan's), where libuprobe refuses probes (its trap
# path runs that code), and libc's malloc is never called.
set_tests_properties(life.CApiFork.AHandlerThatForksInsideACApiCallDoesNotHang
                     life.CApiFork.AHandlerThatForksDuringARegistrationDoesNotHang PROPERTIES LABELS "no-asan;no-tsan")
# A probe on libc's pthread_create must see the program's start routine and
# argument (libuprobe's pthread_create interposer hands them over); under a
# sanitizer the program's call goes first to the sanitizer's own
# pthread_create interceptor, which passes its own start routine and argument
# on (asan_thread_start / TSan's), so the program's are not in the call at all.
# Likewise the count of libc calls made around it (the interceptor makes its
# own: pthread_attr_getstacksize, ...), and of dlopen/dlclose (intercepted too).
set_tests_properties([=[life.Kinds/Threads.ProbeOnPthreadCreateSeesTheProgramsStartAndArgument/int3  # GetParam() = 4-byte object <00-00 00-00>]=]
                     [=[life.Kinds/Threads.ProbeOnPthreadCreateSeesTheProgramsStartAndArgument/optimized  # GetParam() = 4-byte object <01-00 00-00>]=]
                     [=[life.Kinds/Threads.ProbesSeeOnlyTheProgramsOwnCallsNotTheInterposersOnes/int3  # GetParam() = 4-byte object <00-00 00-00>]=]
                     [=[life.Kinds/Threads.ProbesSeeOnlyTheProgramsOwnCallsNotTheInterposersOnes/optimized  # GetParam() = 4-byte object <01-00 00-00>]=]
                     PROPERTIES LABELS "no-asan;no-tsan")
# Its second thread comes from C11's thrd_create(), which GCC 12's
# ThreadSanitizer does not intercept: TSan faults in that thread's first
# instrumented access (SEGV at 0, "nested bug"). ASan runs it.
set_tests_properties(life.DlLock.WithElfutilsDeferredTheFirstReadLoadsItOutsideTheRegistryMutex PROPERTIES LABELS "no-tsan")
