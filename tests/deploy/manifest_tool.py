"""Reads the deployment files of deploy/ for tests/deploy/manifests_test.sh.

  manifest_tool.py k8s-check YAML             structural checks of the StatefulSet manifest
  manifest_tool.py k8s-pod YAML OUTDIR        writes the stage container's script, env and
                                              readiness probe, for running the pod's command
  manifest_tool.py systemd-argv UNIT ENV CRED NAME   prints ExecStart's argv, one per line

No cluster and no systemd manager are needed (neither exists on the test machines): the
checks are what `kubectl apply` would need to be true for the ring to form, and ExecStart is
expanded by systemd.service(5)'s rules for the subset the unit uses: `${VAR}` is one word,
`$VAR` splits on whitespace, `%d` is the credentials directory, `%i` the instance name.
"""

import os
import re
import shlex
import sys

import yaml


def fail(msg):
    print(f"manifest_tool: {msg}", file=sys.stderr)
    sys.exit(1)


def load(path):
    with open(path, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    by_kind = {}
    for d in docs:
        for key in ("apiVersion", "kind", "metadata", "spec"):
            if key not in d:
                fail(f"a document without {key}")
        by_kind.setdefault(d["kind"], []).append(d)
    return by_kind


def stage_container(sts):
    containers = sts["spec"]["template"]["spec"]["containers"]
    if len(containers) != 1:
        fail("the StatefulSet pod must have exactly one container")
    return containers[0]


def k8s_check(path):
    kinds = load(path)
    if len(kinds.get("StatefulSet", [])) != 1:
        fail("expected one StatefulSet")
    sts = kinds["StatefulSet"][0]
    spec = sts["spec"]
    services = {s["metadata"]["name"]: s for s in kinds.get("Service", [])}
    name = sts["metadata"]["name"]

    headless = services.get(spec["serviceName"])
    if headless is None:
        fail(f"serviceName {spec['serviceName']} has no Service")
    if headless["spec"].get("clusterIP") != "None":
        fail("the StatefulSet's Service must be headless (clusterIP: None) for per-pod DNS")
    if headless["spec"].get("publishNotReadyAddresses") is not True:
        fail("the ring needs DNS names before pods are ready (publishNotReadyAddresses)")

    labels = spec["template"]["metadata"]["labels"]
    for k, v in spec["selector"]["matchLabels"].items():
        if labels.get(k) != v:
            fail(f"selector {k}={v} does not match the pod template")
    for s in services.values():
        for k, v in s["spec"]["selector"].items():
            if k == "statefulset.kubernetes.io/pod-name":
                if v != f"{name}-0":
                    fail(f"Service {s['metadata']['name']} must select stage 0 ({name}-0)")
            elif labels.get(k) != v:
                fail(f"Service {s['metadata']['name']} selector {k}={v} matches no pod")

    c = stage_container(sts)
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    grid = [int(env.get(k) or "-1") for k in ("STRATA_NUM_STAGES", "STRATA_TP", "STRATA_KVP")]
    if min(grid) < 1 or grid[0] * grid[1] * grid[2] != spec["replicas"]:
        fail("replicas must equal STRATA_NUM_STAGES x STRATA_TP x STRATA_KVP (one pod per rank)")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for s in services.values():
        for p in s["spec"]["ports"]:
            if p["targetPort"] not in ports or ports[p["targetPort"]] != p["port"]:
                fail(f"Service {s['metadata']['name']} targets a port the stage does not open")
    script = c["command"][-1]
    if f"--listen 0.0.0.0:{ports['stage']}" not in script:
        fail("the stage does not listen on its container port")
    if f".{spec['serviceName']}." not in script:
        fail("the next hop is not the headless Service's per-pod DNS name")
    if f".{spec['serviceName']}.$POD_NAMESPACE.svc.cluster.local:{ports.get('group')}" not in script:
        fail("--tp-peers must name the stage's pods by their DNS names at the group port")
    for flag in ("--tp-rank", "--kvp-rank", "--kvp-tokens", "--tp ", "--kvp "):
        if flag not in script:
            fail(f"the stage command does not pass {flag.strip()}")

    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    for m in mounts:
        if m not in volumes:
            fail(f"volumeMount {m} has no volume")
    secret = next((v for v in volumes.values() if "secret" in v), None)
    if secret is None:
        fail("the certificates must come from a Secret volume")
    tls_dir = mounts[secret["name"]]
    for flag in ("--tls-cert", "--tls-key", "--tls-ca"):
        m = re.search(rf"{flag} (\S+)", script)
        if not m or os.path.dirname(m.group(1)) != tls_dir:
            fail(f"{flag} must name a file of the Secret mounted at {tls_dir}")
    model = next((v for v in volumes.values() if "persistentVolumeClaim" in v), None)
    if model is None or not re.search(rf"--model {re.escape(mounts[model['name']])}\b", script):
        fail("--model must be the model volume's mount path")
    print(f"k8s: {', '.join(sorted(kinds))}: {spec['replicas']} pods = PP {grid[0]} x TP "
          f"{grid[1]} x KVP {grid[2]}, headless Service "
          f"{spec['serviceName']}, client Service to {name}-0, TLS from Secret "
          f"{secret['secret']['secretName']} at {tls_dir}, model at {mounts[model['name']]}")


def k8s_pod(path, outdir):
    sts = load(path)["StatefulSet"][0]
    c = stage_container(sts)
    if c["command"][:2] != ["/bin/sh", "-c"]:
        fail("expected the command /bin/sh -c SCRIPT")
    with open(os.path.join(outdir, "pod.sh"), "w", encoding="utf-8") as f:
        f.write(c["command"][2])
    with open(os.path.join(outdir, "pod.env"), "w", encoding="utf-8") as f:
        for e in c.get("env", []):
            if "value" in e:  # one NAME=VALUE per line, as `env` takes it (no shell quoting)
                f.write(f"{e['name']}={e['value']}\n")
    probe = c["readinessProbe"]["exec"]["command"]
    with open(os.path.join(outdir, "probe.sh"), "w", encoding="utf-8") as f:
        f.write(shlex.join(probe) + "\n")
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    with open(os.path.join(outdir, "mounts"), "w", encoding="utf-8") as f:
        for name, mount in mounts.items():
            f.write(f"{name} {mount}\n")
    with open(os.path.join(outdir, "names"), "w", encoding="utf-8") as f:
        f.write(f"{sts['metadata']['name']} {sts['spec']['serviceName']} {sts['spec']['replicas']}\n")


def read_env_file(path):
    """systemd EnvironmentFile=: KEY=VALUE lines, # comments, optional quotes."""
    env = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition("=")
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            env[key.strip()] = value
    return env


def systemd_argv(unit, env_file, cred_dir, instance):
    with open(unit, encoding="utf-8") as f:
        text = f.read().replace("\\\n", " ")
    m = re.search(r"^ExecStart=(.*)$", text, re.M)
    if not m:
        fail("no ExecStart=")
    env = read_env_file(env_file)
    argv = []
    for word in m.group(1).split():
        word = word.replace("%d", cred_dir).replace("%i", instance)
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:  # $VAR: split on whitespace into several words
            argv.extend(env.get(whole.group(1), "").split())
            continue
        word = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda v: env.get(v.group(1), ""), word)
        argv.append(word)
    print("\n".join(argv))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "k8s-check":
        k8s_check(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "k8s-pod":
        k8s_pod(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 6 and sys.argv[1] == "systemd-argv":
        systemd_argv(*sys.argv[2:6])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
