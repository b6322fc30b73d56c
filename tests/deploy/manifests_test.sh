#!/usr/bin/env bash
# Integration, issue 15 "deployment with existing tools": the Kubernetes StatefulSet and the
# systemd unit of deploy/ checked as far as this machine allows (no cluster, no systemd
# manager), then each one's stage command run for real as a 4-stage ring across 4 hosts
# (network namespaces, tests/pipeline/netns_lib.sh) with TLS certificates:
#   - deploy/k8s/strata-statefulset.yaml parses (PyYAML) and holds together (headless
#     Service with unready addresses, stage-0 Service, selectors, ports, replicas = stages,
#     the Secret and model volumes where the command reads them); then each "pod" R runs the
#     container's own /bin/sh script with POD_NAME=strata-R and the manifest's env, the volume
#     mount paths mapped to the test's model and certificates, the ring's per-pod DNS names
#     (strata-R.strata.NAMESPACE.svc.cluster.local) resolving to the hosts; the readiness probe
#     passes in every pod and a client at strata-client.NAMESPACE.svc gets the golden tokens.
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
[ "$replicas" = 4 ] || pl_fail "the test runs the manifest's 4 stages; it has $replicas"
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
for r in 0 1 2 3; do
    ip netns exec "$(nl_host_ns "$r")" env -i PATH=/usr/bin:/bin "POD_NAME=$sts-$r" \
        "POD_NAMESPACE=$ns_k8s" "${pod_env[@]}" /bin/sh -c "$script" \
        >"$PL_WORK/k8s.$r.out" 2>"$PL_WORK/k8s.$r.log" &
    PL_PIDS="$PL_PIDS $!"
    eval "PL_PID_k8s_$r=$!"
done
check_ring k8s "strata-client.$ns_k8s.svc.cluster.local"
probe=$(cat "$PL_WORK/probe.sh")
for r in 0 1 2 3; do
    ip netns exec "$(nl_host_ns "$r")" /bin/sh -c "$probe" || pl_fail "pod $r: readiness probe fails"
    grep -q "connected to next stage $(((r + 1) % 4)) at $sts-$(((r + 1) % 4)).$svc.$ns_k8s.svc.cluster.local" \
        "$PL_WORK/k8s.$r.log" || pl_fail "pod $r did not reach its next pod by its DNS name"
done
pl_stop_pipeline k8s 4
echo "k8s: 4 pods ran the StatefulSet's script: ring over per-pod DNS names, certificate TLS," \
    "readiness probes pass, golden tokens through strata-client.$ns_k8s.svc"

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
