#!/usr/bin/env bash
# pkg.readme: the README shows the consumer programs exactly as CI builds them.
# A line `<!-- file: tests/consumer/X -->` in README.md is followed by a fenced
# code block that must equal that file.
# usage: check_readme.sh <source dir>
set -euo pipefail
src=$1
status=0
mapfile -t files < <(sed -n 's/^<!-- file: \(.*\) -->$/\1/p' "$src/README.md")
[[ ${#files[@]} -ge 2 ]] || { echo "pkg.readme: no '<!-- file: ... -->' markers in README.md" >&2; exit 1; }
for f in "${files[@]}"; do
  block=$(awk -v marker="<!-- file: $f -->" '
    $0 == marker { armed = 1; next }
    armed && /^```/ { if (inside) exit; inside = 1; next }
    inside { print }' "$src/README.md")
  if ! diff -u <(printf '%s\n' "$block") "$src/$f" >&2; then
    echo "pkg.readme: the README block for $f differs from the file (diff above)" >&2
    status=1
  fi
done
[[ $status == 0 ]] && echo "pkg.readme: ${files[*]} match the README"
exit $status
