#!/usr/bin/env bash
# pkg.consumer: installs the build tree to a temporary prefix, then builds and
# runs the consumer project (tests/consumer) against that prefix only: the C++
# consumers with find_package(uprobe CONFIG), the C consumer with pkg-config.
#
# usage: consumer_test.sh <build dir> <source dir> <work dir> <libdir> <cmake> <generator> <c compiler>
#                         <c++ compiler> <static ON|OFF>
set -euo pipefail
build=$1 src=$2 work=$3 libdir=$4 cmake=$5 generator=$6 cc=$7 cxx=$8 static=$9
prefix=$work/prefix
rm -rf "$work"
mkdir -p "$work"
step() { echo "== $*"; }

step "install to $prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log"
(cd "$prefix" && find . \( -type f -o -type l \) | sed 's|^\./||' | sort)

# The installed programs must use the installed library, not the build tree's.
uses_prefix_lib() {
  local want got
  want=$(realpath "$prefix/$libdir")
  got=$(ldd "$1" | sed -n 's/^[[:space:]]*libuprobe\.so[^ ]* => \([^ ]*\) .*/\1/p')
  if [[ -z "$got" || "$(dirname "$(realpath "$got")")" != "$want" ]]; then
    echo "$1 does not load libuprobe.so from $prefix/$libdir:" >&2
    ldd "$1" >&2
    return 1
  fi
}

step "C++: find_package(uprobe CONFIG) from the prefix"
"$cmake" -S "$src/tests/consumer" -B "$work/cpp" -G "$generator" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON -DUPROBE_CONSUMER_STATIC="$static" \
  >"$work/cpp-configure.log" || { cat "$work/cpp-configure.log"; exit 1; }
grep "uprobe .* from" "$work/cpp-configure.log"
"$cmake" --build "$work/cpp" -j 2 >"$work/cpp-build.log" || { cat "$work/cpp-build.log"; exit 1; }
uses_prefix_lib "$work/cpp/consumer_cpp"
"$work/cpp/consumer_cpp"
if [[ "$static" == ON ]]; then
  if ldd "$work/cpp/static_consumer" | grep -q libuprobe; then
    echo "static_consumer is linked against libuprobe.so" >&2
    exit 1
  fi
  "$work/cpp/static_consumer"
fi

step "C: pkg-config from the prefix"
export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
pkg-config --modversion uprobe
make -s -C "$src/tests/consumer" O="$work/c" CC="$cc" >"$work/c-build.log" 2>&1 || { cat "$work/c-build.log"; exit 1; }
uses_prefix_lib "$work/c/consumer_c"
"$work/c/consumer_c"

if [[ -x "$prefix/bin/uprobe-bench" ]]; then
  step "installed tool: uprobe-bench --help"
  uses_prefix_lib "$prefix/bin/uprobe-bench"
  "$prefix/bin/uprobe-bench" --help >/dev/null
fi
step "pkg.consumer: OK"
