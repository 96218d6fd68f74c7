#!/usr/bin/env bash
# pkg.exports: libuprobe.so exports only the public API, and all of it.
#
# usage: check_exports.sh <libuprobe.so> <expected SONAME> <uprobe.h> <libuprobe.map> [<libuprobe.a>]
#
# Public = the C++ API (namespace uprobe outside uprobe::detail and
# uprobe::arch, with the typeinfo/vtables of its classes), the UPROBE_API
# functions of include/uprobe/uprobe.h, and the interposed libc/libgcc
# functions listed in src/api/libuprobe.map. With the static library given, also
# checks the other way: every strong default-visibility symbol its objects
# define (the library is compiled with -fvisibility=hidden, so those are the
# ones meant to be public) is exported, i.e. the version script lost nothing.
set -euo pipefail
lib=$1 soname=$2 header=$3 map=$4 archive=${5:-}
NM=${NM:-nm} READELF=${READELF:-readelf} CXXFILT=${CXXFILT:-c++filt}
status=0
fail() {
  echo "pkg.exports: FAIL: $*" >&2
  status=1
}

got_soname=$("$READELF" -dW "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
[[ "$got_soname" == "$soname" ]] || fail "SONAME is '$got_soname', expected '$soname'"

mapfile -t mangled < <("$NM" -D --defined-only "$lib" | awk '{ print $NF }' | sort -u)
mapfile -t demangled < <(printf '%s\n' "${mangled[@]}" | "$CXXFILT")
mapfile -t c_api < <(sed -n 's/^UPROBE_API[^(]*[ *]\([A-Za-z_][A-Za-z0-9_]*\)(.*/\1/p' "$header" | sort -u)
mapfile -t interposed < <(sed -n '/Interposed (begin)/,/Interposed (end)/p' "$map" |
                          sed -n 's/^[[:space:]]*\([A-Za-z_][A-Za-z0-9_]*\);.*/\1/p' | sort -u)
[[ ${#c_api[@]} -gt 0 ]] || fail "no UPROBE_API declaration found in $header"
[[ ${#interposed[@]} -gt 0 ]] || fail "no interposed section found in $map"

in_list() {
  local x=$1
  shift
  local y
  for y in "$@"; do [[ "$x" == "$y" ]] && return 0; done
  return 1
}

n_cxx=0 n_c=0 n_interposed=0
for i in "${!mangled[@]}"; do
  m=${mangled[$i]} d=${demangled[$i]}
  case "$d" in
    uprobe::detail::* | uprobe::arch::* | *" for uprobe::detail::"* | *" for uprobe::arch::"*)
      fail "internal symbol exported: $d" ;;
    uprobe::* | "typeinfo for uprobe::"* | "typeinfo name for uprobe::"* | "vtable for uprobe::"*)
      n_cxx=$((n_cxx + 1)) ;;
    *)
      if in_list "$m" "${c_api[@]}"; then
        n_c=$((n_c + 1))
      elif in_list "$m" "${interposed[@]}"; then
        n_interposed=$((n_interposed + 1))
      else
        fail "non-public symbol exported: $d ($m)"
      fi ;;
  esac
done

# The entry points a user needs are there.
required=(
  "uprobe::register_uprobe(std::" "uprobe::register_uprobe(void const*" "uprobe::unregister_uprobe("
  "uprobe::resolve_address(" "uprobe::probe_info(" "uprobe::configure(" "uprobe::configuration()"
  "uprobe::stats()" "uprobe::in_handler()" "uprobe::Error::Error(" "uprobe::Attachment::Attachment("
  "uprobe::Attachment::~Attachment()" "uprobe::Attachment::detach()" "uprobe::Attachment::operator="
  "typeinfo for uprobe::Error" "vtable for uprobe::Error" "typeinfo for uprobe::Consumer"
  "sigaction" "signal"
)
for r in "${required[@]}" "${c_api[@]}"; do
  found=0
  for d in "${demangled[@]}"; do
    if [[ "$d" == "$r" || ( "$r" == *[\(:\ ]* && "$d" == "$r"* ) ]]; then
      found=1
      break
    fi
  done
  [[ $found == 1 ]] || fail "public symbol not exported: $r"
done

# Nothing meant to be public was dropped by the version script.
if [[ -n "$archive" ]]; then
  while read -r sym; do
    in_list "$sym" "${mangled[@]}" ||
      fail "default-visibility symbol of the library is not exported (add it to $map?): $(echo "$sym" | "$CXXFILT")"
  done < <("$READELF" -sW "$archive" |
           awk '$5 == "GLOBAL" && $6 == "DEFAULT" && $7 != "UND" && ($4 == "FUNC" || $4 == "OBJECT" || $4 == "TLS") { print $8 }' |
           sort -u)
fi

echo "libuprobe.so ($got_soname): ${#mangled[@]} exported symbols: $n_cxx C++ (namespace uprobe), $n_c C API," \
     "$n_interposed interposed"
printf '  %s\n' "${demangled[@]}"
if [[ $status != 0 ]]; then
  echo "pkg.exports: FAILED" >&2
fi
exit $status
