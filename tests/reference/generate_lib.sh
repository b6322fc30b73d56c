# Shared by generate_image_test.sh and generate_video_test.sh (sourced after `gen` and `tmp` are
# set): JSON lists, the logit comparison with an --out file, and refusals.
fail() { echo "FAIL: $*"; exit 1; }
json_list() { tr -d '\n ' <"$1" | sed "s/.*\"$2\":\[\([0-9,-]*\)\].*/\1/"; }

# Max |a - b| between the logits in an --out file (after its header and n I32 tokens) and a
# raw f32 file of the same [n, V] values.
max_logit_diff() { # out golden n
    local hlen
    hlen=$(od -An -v -tu8 -N8 "$1" | tr -d ' ')
    paste <(od -An -v -w4 -tf4 -j $((8 + hlen + 4 * $3)) "$1") <(od -An -v -w4 -tf4 "$2") |
        awk 'BEGIN { m = 0; n = 0 } { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; n++ }
             END { printf "%g %d\n", m, n }'
}

# expect_refused WHAT ARGS...: strata-generate exits 3 with a "strata-generate: " message.
expect_refused() {
    local what=$1 rc=0
    shift
    "$gen" "$@" --max-tokens 2 >/dev/null 2>"$tmp/err" || rc=$?
    [ "$rc" = 3 ] || fail "$what: exit $rc, want 3 ($(cat "$tmp/err"))"
    grep -q '^strata-generate: ' "$tmp/err" || fail "$what: no message"
    echo "ok: $what refused: $(head -c 240 "$tmp/err")"
}
