#!/usr/bin/env bash
# The README's "Adding a backend" list names exactly the functions a backend supplies: each
# numbered item's backticked names equal the function members of the struct it describes,
# read from the one header that defines it. A member added to a table without the README
# (or a README name that is no member) fails here.
set -euo pipefail
root="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-strata}"
[ -f "$root/README.md" ] || root=.
readme="$root/README.md"

members() { # header, struct name: its function-pointer members
    awk -v s="struct $2 {" 'index($0, s) == 1 { on = 1; next } on && /^};/ { exit } on' \
        "$root/$1" | grep -o '(\*[a-z_0-9]*)' | tr -d '(*)' | sort -u
}

listed() { # the names item N of the section puts in backticks (no paths, calls or types)
    awk '/^### Adding a backend/ { on = 1; next } on && /^## / { exit } on' "$readme" |
        awk -v n="$1" '/^[0-9]+\. / { on = (index($0, n ". ") == 1) } on' |
        grep -o '`[a-z_0-9]*`' | tr -d '`' | sort -u
}

fail=0
check() { # item, header, struct
    local want got
    want=$(members "$2" "$3")
    got=$(listed "$1")
    if [ -z "$want" ]; then
        echo "FAIL: no members of struct $3 found in $2"
        fail=1
    elif [ "$want" != "$got" ]; then
        echo "FAIL: README 'Adding a backend' item $1 vs struct $3 ($2):"
        diff <(echo "$want") <(echo "$got") | sed 's/^/  /' || true
        fail=1
    else
        echo "ok: item $1 lists the $(echo "$want" | wc -l) functions of struct $3"
    fi
}

check 1 reference/forward.h forward_ops
check 2 reference/vision_encoder_internal.h vision_ops
check 3 reference/weight_load.h weight_sink
check 4 runtime/stage/backend.h stage_backend_i
exit $fail
