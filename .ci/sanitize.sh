#!/usr/bin/env bash
# The C reader (tinyctx/_speedups.c) reads documents from a shared store, which any writer
# may have filled, and the counting loop (tinyctx/_token_speedups.c) reads every message a
# counter sees: build both with AddressSanitizer and UBSan, run the tests that drive them
# (the C reader's own, the codec's, the SQLite stores', the counters'), then put the plain
# builds back.
# Usage, from the checkout with its .venv (an editable install): bash .ci/sanitize.sh
set -euo pipefail

py=.venv/bin/python
suffix="$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
include="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
modules="_speedups _token_speedups"  # the codec's reader, a cold count's loop
for module in $modules; do
    built="tinyctx/$module$suffix"
    [ -f "$built" ] || { echo "sanitize: $built is missing: install with pip -e first" >&2; exit 2; }
done

runtimes=""
for lib in libasan.so libubsan.so; do
    path="$(gcc -print-file-name="$lib")"
    [ -f "$path" ] || { echo "sanitize: gcc has no $lib" >&2; exit 2; }
    runtimes="$runtimes $path"
done

saved="$(mktemp -d)"
for module in $modules; do cp "tinyctx/$module$suffix" "$saved/"; done
trap 'for module in $modules; do cp "$saved/$module$suffix" tinyctx/; done; rm -rf "$saved"' EXIT

for module in $modules; do
    gcc -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all \
        -ffp-contract=off -Wall -Wextra -Werror -Wno-unused-parameter \
        -Wno-missing-field-initializers -shared -fPIC -I"$include" "tinyctx/$module.c" \
        -o "tinyctx/$module$suffix"
done

# leaks are CPython's own at exit, not the reader's (its loop-of-decodes test checks growth);
# --capture=sys leaves file descriptor 2 alone, so a sanitizer's report is seen
LD_PRELOAD="${runtimes# }" ASAN_OPTIONS=detect_leaks=0 TINYCTX_REQUIRE_EXTENSIONS=1 \
    "$py" -m pytest -q -p no:cacheprovider --capture=sys \
    tests/test_speedups.py tests/test_codec.py tests/test_thread_stores.py \
    tests/test_token_speedups.py tests/test_token_shapes.py tests/test_tokens.py
echo "sanitize OK"
