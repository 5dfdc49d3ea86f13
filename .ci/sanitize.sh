#!/usr/bin/env bash
# The C reader (tinyctx/_speedups.c) reads documents from a shared store, which any writer
# may have filled: build it with AddressSanitizer and UBSan, run the tests that drive it
# (the C reader's own, the codec's, the SQLite stores'), then put the plain build back.
# Usage, from the checkout with its .venv (an editable install): bash .ci/sanitize.sh
set -euo pipefail

py=.venv/bin/python
suffix="$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
include="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
built="tinyctx/_speedups$suffix"
[ -f "$built" ] || { echo "sanitize: $built is missing: install with pip -e first" >&2; exit 2; }

runtimes=""
for lib in libasan.so libubsan.so; do
    path="$(gcc -print-file-name="$lib")"
    [ -f "$path" ] || { echo "sanitize: gcc has no $lib" >&2; exit 2; }
    runtimes="$runtimes $path"
done

saved="$(mktemp)"
cp "$built" "$saved"
trap 'cp "$saved" "$built"; rm -f "$saved"' EXIT

gcc -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all \
    -Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers \
    -shared -fPIC -I"$include" tinyctx/_speedups.c -o "$built"

# leaks are CPython's own at exit, not the reader's (its loop-of-decodes test checks growth);
# --capture=sys leaves file descriptor 2 alone, so a sanitizer's report is seen
LD_PRELOAD="${runtimes# }" ASAN_OPTIONS=detect_leaks=0 TINYCTX_REQUIRE_EXTENSIONS=1 \
    "$py" -m pytest -q -p no:cacheprovider --capture=sys \
    tests/test_speedups.py tests/test_codec.py tests/test_thread_stores.py
echo "sanitize OK"
