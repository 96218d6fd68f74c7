# ctest labels of the tests that do not run under a sanitizer build
# (`make test-asan` runs `ctest -LE no-asan`, `make test-tsan` `-LE no-tsan`).
# Included by ctest after the tests are discovered (tests/CMakeLists.txt adds
# it to every test directory's TEST_INCLUDE_FILES), so gtest names work here.
# Keep this list short; every entry says why.
