#!/usr/bin/env bash
# Integration, deployment with existing tools: the Kubernetes StatefulSet and the
# systemd unit of deploy/ checked as far as this machine allows (no cluster, no systemd
# manager), then each one's stage command run for real as a 4-stage ring across 4 hosts
# (network namespaces, tests/pipeline/netns_lib.sh) with TLS certificates:
#   - deploy/k8s/strata-statefulset.yaml parses (PyYAML) and holds together (headless
#     Service with unready addresses, stage-0 Service, selectors, ports, replicas = PP x TP x
#     KVP, the grid flags, the Secret and model volumes where the command reads them); then
#     each "pod" R runs the container's own /bin/sh script with POD_NAME=strata-R, its own
#     host name and the manifest's env, the volume mount paths mapped to the test's model and
#     certificates, the per-pod DNS names (strata-R.strata.NAMESPACE.svc.cluster.local)
#     resolving to the hosts: as written (PP 2 x TP 2), with the env set to PP 1 x TP 2 x
#     KVP 2 (--kvp-tokens 32: the 48-token sequence spans both KVP ranks) and to PP 4; every
#     pod sits at its grid place, the readiness probe passes in every pod, a client at
#     strata-client.NAMESPACE.svc gets the golden tokens, and SIGTERM to every pod at once
#     stops them all with status 0.
#   - deploy/systemd/strata-stage@.service passes `systemd-analyze verify` (ExecStart pointed
#     at the built binary), and its ExecStart, expanded with deploy/systemd/strata.env.example
#     (per host: stage index, next host, model) as systemd would, forms a ring that gives the
#     golden tokens.
# Skipped with the reason without root, network namespaces or PyYAML.
set -u
. "$(dirname "$0")/../pipeline/netns_lib.sh"
nl_init 4

TOOL="$(dirname "$0")/manifest_tool.py"
YAML="$PL_ROOT/deploy/k8s/strata-statefulset.yaml"
UNIT="$PL_ROOT/deploy/systemd/strata-stage@.service"
ENV_EXAMPLE="$PL_ROOT/deploy/systemd/strata.env.example"
python3 -c 'import yaml' 2>/dev/null || nl_skip "no PyYAML for python3 (Debian python3-yaml)"
[ -x "$PL_ROOT/tests/wire/make_test_pki" ] || pl_fail "no make_test_pki"

case=qwen3_deep8
model=$(pl_golden "$case")
prompt=$(pl_golden_prompt "$case")
want=$(pl_golden_generated "$case")
steps=$(pl_golden_steps "$case")
"$PL_ROOT/tests/wire/make_test_pki" "$PL_WORK/pki" || pl_fail "cannot make the test PKI"
# The Secret / credentials: one stage certificate for every stage (CA membership is the
# identity), the client with another certificate of the same CA.
mkdir -p "$PL_WORK/secret"
cp "$PL_WORK/pki/ca.crt" "$PL_WORK/secret/ca.pem"
cp "$PL_WORK/pki/a.crt" "$PL_WORK/secret/stage.pem"
cp "$PL_WORK/pki/a.key" "$PL_WORK/secret/stage.key"
client_tls=(--tls-cert "$PL_WORK/pki/b.crt" --tls-key "$PL_WORK/pki/b.key" --tls-ca "$PL_WORK/pki/ca.crt")

# check_ring TAG: the 4 stages formed a certificate-TLS ring; a client gets the golden tokens.
check_ring() {
    local tag=$1 host=$2 r
    pl_wait_ready "$tag" 4
    for r in 0 1 2 3; do
        grep -q "links: TLS 1.3 with certificates" "$PL_WORK/$tag.$r.log" ||
            pl_fail "$tag: stage $r is not on certificate TLS"
        nl_established "$r" "$(nl_addr $(((r + 1) % 4))):7000" ||
            pl_fail "$tag: stage $r has no connection to the next host"
    done
    ip netns exec "$NL_CLIENT" "$PL_CLIENT" --host "$host" --port 7000 "${client_tls[@]}" \
        --timeout-ms 20000 --prompt "$prompt" --max-tokens "$steps" >"$PL_WORK/$tag.client" ||
        pl_fail "$tag: client failed: $(cat "$PL_WORK/$tag.client")"
    [ "$(pl_tokens_of "$PL_WORK/$tag.client" 0)" = "$want" ] || pl_fail "$tag: tokens are not golden"
}

# ---- Kubernetes
python3 "$TOOL" k8s-check "$YAML" || pl_fail "the StatefulSet manifest does not hold together"
python3 "$TOOL" k8s-pod "$YAML" "$PL_WORK" || pl_fail "cannot read the stage container"
read -r sts svc replicas <"$PL_WORK/names"
[ "$replicas" = 4 ] || pl_fail "the test runs the manifest's 4 pods; it has $replicas"
ns_k8s=strata-test
dns=()
for r in 0 1 2 3; do dns+=("$(nl_addr "$r") $sts-$r.$svc.$ns_k8s.svc.cluster.local"); done
for r in 0 1 2 3; do nl_hosts_file "$(nl_host_ns "$r")" "${dns[@]}"; done
nl_hosts_file "$NL_CLIENT" "$(nl_addr 0) strata-client.$ns_k8s.svc.cluster.local"
# The volumes as the kubelet would mount them: the model claim and the Secret.
script=$(cat "$PL_WORK/pod.sh")
while read -r vol path; do
    case "$vol" in
    model) script=${script//"$path"/"$model"} ;;
    tls) script=${script//"$path"/"$PL_WORK/secret"} ;;
    *) pl_fail "unknown volume $vol in the manifest" ;;
    esac
done <"$PL_WORK/mounts"
script=${script//\/usr\/local\/bin\/strata-stage/"$PL_STAGE"}
mapfile -t pod_env <"$PL_WORK/pod.env"
probe=$(cat "$PL_WORK/probe.sh")

# k8s_run TAG [NAME=VALUE...]: the 4 pods, pod R on host R with the manifest's env (then the
# given overrides, as an edited manifest would set them) and its own host name (a UTS
# namespace, as every pod has: so the ranks of a group see different hosts and use TCP, as
# pods do). Checks the grid the env describes: each stage's leader pod listens, is ready,
# reaches the next stage's leader by its DNS name over certificate TLS; every rank joins its
# group over TCP and is ready; a client at strata-client.NAMESPACE.svc gets the golden
# tokens. Then SIGTERM to all 4 pods at once (as Kubernetes stops a StatefulSet): every
# pod exits 0 within 5 s (followers ignore it and stop with their leader).
k8s_run() {
    local tag=$1 r s pp w tp next pid i
    shift
    local env=("POD_NAMESPACE=$ns_k8s" "${pod_env[@]}" "$@")
    pp=$(env "${env[@]}" sh -c 'echo $STRATA_NUM_STAGES')
    w=$(env "${env[@]}" sh -c 'echo $((STRATA_TP * STRATA_KVP))')
    tp=$(env "${env[@]}" sh -c 'echo $STRATA_TP')
    [ $((pp * w)) = 4 ] || pl_fail "$tag: the test runs 4 pods, the env gives $pp x $w"
    for r in 0 1 2 3; do
        ip netns exec "$(nl_host_ns "$r")" unshare --uts env -i PATH=/usr/bin:/bin:/usr/sbin:/sbin \
            "POD_NAME=$sts-$r" "${env[@]}" /bin/sh -c 'hostname "$POD_NAME" && exec /bin/sh -c "$0"' \
            "$script" >"$PL_WORK/$tag.$r.out" 2>"$PL_WORK/$tag.$r.log" &
        PL_PIDS="$PL_PIDS $!"
        eval "PL_PID_${tag}_$r=$!"
    done
    for ((s = 0; s < pp; s++)); do
        r=$((s * w)) next=$((((s + 1) % pp) * w))
        pl_wait_log "$PL_WORK/$tag.$r.log" "listening on" 1 20 || pl_fail "$tag: leader pod $r did not start"
        grep -q "links: TLS 1.3 with certificates" "$PL_WORK/$tag.$r.log" ||
            pl_fail "$tag: pod $r is not on certificate TLS"
        [ "$pp" = 1 ] && continue
        pl_wait_log "$PL_WORK/$tag.$r.log" "connected to next stage $(((s + 1) % pp)) at $sts-$next.$svc.$ns_k8s.svc.cluster.local" 1 20 ||
            pl_fail "$tag: pod $r did not reach the next stage's leader pod $next by its DNS name"
        pl_wait_log "$PL_WORK/$tag.$r.log" "upstream stage .* connected" 1 20 || pl_fail "$tag: pod $r has no upstream"
    done
    for r in 0 1 2 3; do
        if [ "$w" -gt 1 ]; then
            s=$((r / w))
            pl_wait_log "$PL_WORK/$tag.$r.log" "rank $((r % w)) of $w connected over tcp" 1 20 ||
                pl_fail "$tag: pod $r did not join stage $s's group as rank $((r % w)) over TCP"
            grep -q "^grid: stage $s of $pp, tp rank $((r % w % tp)) of $tp, kvp rank $((r % w / tp)) of $((w / tp))" \
                "$PL_WORK/$tag.$r.out" || pl_fail "$tag: pod $r is not at its grid place"
        fi
        ip netns exec "$(nl_host_ns "$r")" env -i PATH=/usr/bin:/bin "POD_NAME=$sts-$r" "${env[@]}" \
            /bin/sh -c "$probe" || pl_fail "$tag: pod $r: readiness probe fails"
    done
    ip netns exec "$NL_CLIENT" "$PL_CLIENT" --host "strata-client.$ns_k8s.svc.cluster.local" --port 7000 \
        "${client_tls[@]}" --timeout-ms 20000 --prompt "$prompt" --max-tokens "$steps" >"$PL_WORK/$tag.client" ||
        pl_fail "$tag: client failed: $(cat "$PL_WORK/$tag.client")"
    [ "$(pl_tokens_of "$PL_WORK/$tag.client" 0)" = "$want" ] || pl_fail "$tag: tokens are not golden"
    for r in 0 1 2 3; do kill -TERM "$(pl_pid "$tag" "$r")"; done
    for r in 0 1 2 3; do
        pid=$(pl_pid "$tag" "$r")
        for ((i = 0; i < 100; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        kill -0 "$pid" 2>/dev/null && pl_fail "$tag: pod $r still runs 5 s after SIGTERM"
        wait "$pid" || pl_fail "$tag: pod $r exited $? after SIGTERM"
    done
    echo "k8s $tag: 4 pods = PP $pp x $w ranks per stage (${*:-as written}): leaders ring over" \
        "per-pod DNS names with certificate TLS, $([ "$w" -gt 1 ] && echo "groups over TCP, ")readiness" \
        "probes pass, golden tokens through" \
        "strata-client.$ns_k8s.svc, all pods exit 0 on SIGTERM"
}
k8s_run k8s # the manifest as written: PP 2 x TP 2
k8s_run k8s_kvp STRATA_NUM_STAGES=1 STRATA_TP=2 STRATA_KVP=2 STRATA_KVP_TOKENS=32 STRATA_MAX_SEQ=64
k8s_run k8s_pp STRATA_NUM_STAGES=4 STRATA_TP=1 STRATA_KVP=1

# ---- systemd
if command -v systemd-analyze >/dev/null 2>&1; then
    mkdir -p "$PL_WORK/units"
    sed "s#/usr/local/bin/strata-stage#$PL_STAGE#" "$UNIT" >"$PL_WORK/units/strata-stage@.service"
    ln -s strata-stage@.service "$PL_WORK/units/strata-stage@qwen3.service"
    systemd-analyze verify "$PL_WORK/units/strata-stage@qwen3.service" >"$PL_WORK/verify" 2>&1 ||
        pl_fail "systemd-analyze verify: $(cat "$PL_WORK/verify")"
    echo "systemd: systemd-analyze verify passes ($(systemd-analyze --version | head -n 1))"
else
    echo "systemd: systemd-analyze not installed, unit not verified (the ring below still runs)"
fi
for r in 0 1 2 3; do nl_hosts_file "$(nl_host_ns "$r")" "$(for i in 0 1 2 3; do echo "$(nl_addr "$i") box$i"; done)"; done
for r in 0 1 2 3; do
    sed -e "s#^STRATA_MODEL=.*#STRATA_MODEL=$model#" -e "s#^STRATA_STAGE_IDX=.*#STRATA_STAGE_IDX=$r#" \
        -e "s#^STRATA_NEXT_HOST=.*#STRATA_NEXT_HOST=box$(((r + 1) % 4))#" "$ENV_EXAMPLE" >"$PL_WORK/qwen3.$r.env"
    python3 "$TOOL" systemd-argv "$UNIT" "$PL_WORK/qwen3.$r.env" "$PL_WORK/secret" qwen3 \
        >"$PL_WORK/argv.$r" || pl_fail "cannot expand ExecStart"
    mapfile -t argv <"$PL_WORK/argv.$r"
    [ "${argv[0]}" = /usr/local/bin/strata-stage ] || pl_fail "ExecStart runs ${argv[0]}"
    argv[0]=$PL_STAGE
    ip netns exec "$(nl_host_ns "$r")" "${argv[@]}" >"$PL_WORK/sd.$r.out" 2>"$PL_WORK/sd.$r.log" &
    PL_PIDS="$PL_PIDS $!"
    eval "PL_PID_sd_$r=$!"
done
check_ring sd "$(nl_addr 0)"
pl_stop_pipeline sd 4
echo "systemd: ExecStart with strata.env.example on 4 hosts: certificate-TLS ring, golden tokens"
echo "PASS"
