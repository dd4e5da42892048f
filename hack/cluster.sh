#!/usr/bin/env bash
# A one-node Kubernetes cluster built from source, every part of it inside a network namespace of its
# own, so nothing listens on or sends to the host's interfaces:
#
#   hack/cluster.sh up      # start it (building what is missing); prints how to reach it
#   hack/cluster.sh down    # stop it and remove every trace: processes, mounts, loop devices,
#                           # the network namespace (with its iptables rules), sysctls restored
#   hack/cluster.sh check   # exit 1 (and say what) if anything of a stopped cluster is left
#   hack/cluster.sh exec CMD...   # run CMD inside the cluster's network namespace, KUBECONFIG set
#   hack/cluster.sh restart kubelet|containerd   # stop one of the node's services (SIGTERM) and start
#                           # it again, as a service manager does after a crash or an upgrade
#   hack/cluster.sh reboot  # the node loses power and boots: every process of it killed, its mounts
#                           # and loop devices gone, then its disk mounted and its services started
#
# Inside the namespace: a bridge with no ports, `node0`, holds the node's address (10.250.0.1), a default
# route points at it (so nothing can leave), the bridge `cni0` (10.244.0.0/24) holds the Pods, and
# kube-proxy (iptables) routes Services (10.96.0.0/24; DNS at 10.96.0.10). The registry listens on
# 10.250.0.1:5000 (HTTPS, its certificate from the cluster's CA, which `exec` names in CLUSTER_CA_FILE),
# reached by that name from containerd and from Pods. containerd mirrors quay.io,
# docker.io, ghcr.io and registry.k8s.io from it (an image is pushed under its whole name, for example
# 10.250.0.1:5000/ghcr.io/csi-addons-rs/csi-addons-manager:v0.1.0), so manifests are applied as shipped
# (registry.access.redhat.com too, for hack/olm.sh).
#
# The reference driver's state directory (/var/lib/csi-addons-reference, a hostPath in its manifests)
# is a filesystem of its own, an ext4 in a sparse file of CLUSTER_DRIVER_DISK_SIZE (8G) under the state
# directory, as a node's data disk is: the fault suite fills it without touching the host's disk.
#
# Processes enter only the network namespace, not a mount namespace of their own: the kubelet's
# mounts must be seen by containerd and the driver. Every mount lives under the state directory, and
# `down` unmounts it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"

NETNS="${CLUSTER_NETNS:-csi-addons-cluster}"
STATE="${CLUSTER_DIR:-${TMPDIR:-/tmp}/csi-addons-cluster}"
NODE_NAME=csi-addons-node
NODE_IP=10.250.0.1
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/24
DNS_IP=10.96.0.10
API_PORT=6443
REGISTRY=$CLUSTER_REGISTRY
# The registries containerd takes from REGISTRY instead.
MIRRORED="quay.io docker.io ghcr.io registry.k8s.io registry.access.redhat.com"
# The kubelet's directory where every cluster has it: the shipped manifests mount it by this path.
KUBELET_DIR=/var/lib/kubelet
# Host-wide sysctls the kubelet sets at start; `down` puts back what they were.
KUBELET_SYSCTLS="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes"
# Host paths some components use whatever they are told (the kubelet's device-plugin socket, CNI's
# cache, containerd's shim sockets); `down` removes those that were not there before `up`.
# containerd's cgroup for Pods (cgroupfs driver, the kubelet's QoS cgroups off).
CGROUP=k8s.io
# The reference driver's state and volumes (a hostPath in its manifests, shared by its controller
# and node plugins); its loop devices are detached by `down`.
DRIVER_DIR=/var/lib/csi-addons-reference
# That directory is a filesystem of its own, as a node's data disk is: the fault suite fills it, where
# filling the host's disk would harm the machine. An ext4 in a sparse file under the state directory,
# with no blocks reserved for root (the driver runs as root, and must see the disk full).
DRIVER_DISK_SIZE="${CLUSTER_DRIVER_DISK_SIZE:-8G}"
# Where the product's service accounts live (the manager, the reference driver with its sidecars,
# the driver operator): their requests are audited.
AUDITED_NAMESPACES="csi-addons-system csi-addons-reference reference-driver-operator"
HOST_PATHS="$DRIVER_DIR /var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni /run/containerd /opt/containerd"

in_netns() { nsenter --net="/run/netns/$NETNS" -- "$@"; }

# start NAME CMD... : runs CMD in the namespace, in a session of its own, logging to NAME.log.
# The pid recorded is the service's own: no function or subshell stands between (backgrounding one
# would record the subshell's), nsenter enters a network namespace without forking, and setsid
# forks only in a process-group leader, which a child of this script is not.
start() {
  local name=$1; shift
  nsenter --net="/run/netns/$NETNS" -- setsid "$@" >"$STATE/logs/$name.log" 2>&1 </dev/null &
  echo "$! $name" >>"$STATE/pids"
}

# wait_for WHAT SECONDS CMD... : polls CMD until it succeeds, or fails with the log of WHAT.
wait_for() {
  local what=$1 seconds=$2; shift 2
  for _ in $(seq $((seconds * 4))); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.25
  done
  log "$what did not come up in $seconds s; the end of its log:"
  tail -n 30 "$STATE/logs/$what.log" >&2 || true
  return 1
}

kubectl() { in_netns env KUBECONFIG="$STATE/kubeconfig" "$ASSETS/kubectl" "$@"; }

pki() {
  local d="$STATE/pki"
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=csi-addons-cluster-ca" \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
  # The API server's serving certificate: reached by loopback, the node address and the Service.
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout "$d/apiserver.key" -out "$d/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,IP:%s,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n' \
    "$NODE_IP" >"$d/apiserver.ext"
  openssl x509 -req -in "$d/apiserver.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 2 \
    -extfile "$d/apiserver.ext" -out "$d/apiserver.crt" 2>/dev/null
  # The registry's: HTTPS, as registries are (operator-sdk reads an index image over HTTPS only).
  openssl req -newkey rsa:2048 -nodes -subj "/CN=registry" -keyout "$d/registry.key" -out "$d/registry.csr" 2>/dev/null
  printf 'subjectAltName=IP:%s\nextendedKeyUsage=serverAuth\n' "${REGISTRY%:*}" >"$d/registry.ext"
  openssl x509 -req -in "$d/registry.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 2 \
    -extfile "$d/registry.ext" -out "$d/registry.crt" 2>/dev/null
  # One admin identity for the node's components: they are test peers, not what is tested.
  openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=cluster-admin" -keyout "$d/admin.key" -out "$d/admin.csr" 2>/dev/null
  # An extension makes it an X.509 v3 certificate: rustls (the test code's client) accepts no other.
  printf 'extendedKeyUsage=clientAuth\n' >"$d/admin.ext"
  openssl x509 -req -in "$d/admin.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 2 \
    -extfile "$d/admin.ext" -out "$d/admin.crt" 2>/dev/null
  # The aggregation layer (OLM's package server): a CA of its own for the identity the API server
  # proxies with, which aggregated servers trust through extension-apiserver-authentication.
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=csi-addons-cluster-front-proxy-ca" \
    -keyout "$d/front-proxy-ca.key" -out "$d/front-proxy-ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=front-proxy-client" -keyout "$d/front-proxy-client.key" \
    -out "$d/front-proxy-client.csr" 2>/dev/null
  openssl x509 -req -in "$d/front-proxy-client.csr" -CA "$d/front-proxy-ca.crt" -CAkey "$d/front-proxy-ca.key" \
    -CAcreateserial -days 2 -extfile "$d/admin.ext" -out "$d/front-proxy-client.crt" 2>/dev/null
  openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
  openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
  cat >"$STATE/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: cluster, cluster: {server: "https://$NODE_IP:$API_PORT", certificate-authority: "$d/ca.crt"}}]
users: [{name: admin, user: {client-certificate: "$d/admin.crt", client-key: "$d/admin.key"}}]
contexts: [{name: admin, context: {cluster: cluster, user: admin}}]
current-context: admin
EOF
}

network() {
  ip netns add "$NETNS"
  in_netns ip link set lo up
  # A bridge with no ports stands in for the node's NIC (these kernels have no dummy driver): its
  # address is local, and what is routed to it goes nowhere.
  in_netns ip link add node0 type bridge
  in_netns ip addr add "$NODE_IP/24" dev node0
  in_netns ip link set node0 up
  # Everything not local goes to that port-less bridge and is dropped: nothing leaves the namespace.
  in_netns ip route add default dev node0
  in_netns sysctl -qw net.ipv4.ip_forward=1
}

configure_node() {
  mkdir -p "$STATE/containerd/certs.d/$REGISTRY" "$STATE/cni/conf" "$STATE/cni/networks" "$STATE/kubelet" "$STATE/pod-logs" "$STATE/registry"
  cat >"$STATE/containerd/certs.d/$REGISTRY/hosts.toml" <<EOF
server = "https://$REGISTRY"
[host."https://$REGISTRY"]
  capabilities = ["pull", "resolve"]
  ca = "$STATE/pki/ca.crt"
EOF
  local mirrored
  for mirrored in $MIRRORED; do
    mkdir -p "$STATE/containerd/certs.d/$mirrored"
    # The real registry is out of reach from the namespace: a miss fails, it goes nowhere.
    cat >"$STATE/containerd/certs.d/$mirrored/hosts.toml" <<EOF
server = "https://$mirrored"
[host."https://$REGISTRY/v2/$mirrored"]
  capabilities = ["pull", "resolve"]
  ca = "$STATE/pki/ca.crt"
  override_path = true
EOF
  done
  cat >"$STATE/containerd/config.toml" <<EOF
version = 3
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
[grpc]
  address = "$STATE/containerd/containerd.sock"
[ttrpc]
  address = "$STATE/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/containerd/opt"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$REGISTRY/pause:1"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "$STATE/containerd/certs.d"
[plugins."io.containerd.cri.v1.runtime"]
  # This machine's root lacks CAP_SYS_RESOURCE: a negative oom_score_adj makes runc fail.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$NODE"]
    conf_dir = "$STATE/cni/conf"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
      BinaryName = "$NODE/runc"
EOF
  cat >"$STATE/cni/conf/10-cluster.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "cluster", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$STATE/cni/networks"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
  : >"$STATE/resolv.conf"
  cat >"$STATE/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 with the cgroupfs driver; no QoS cgroups, no node allocatable, no local-storage or
# eviction accounting: this machine's kernel and root do not give the kubelet what those need.
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
localStorageCapacityIsolation: false
evictionHard: {}
address: $NODE_IP
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$STATE/pki/ca.crt"}
authorization: {mode: Webhook}
clusterDNS: [$DNS_IP]
clusterDomain: cluster.local
resolvConf: "$STATE/resolv.conf"
podLogsDir: "$STATE/pod-logs"
serializeImagePulls: false
EOF
  cat >"$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$STATE/kubeconfig"}
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE_NAME
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
# Conntrack's limits are the host's, not the namespace's: leave them alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  # The audit log of what the product's service accounts ask (CLUSTER_AUDIT_DIR for the tests): the
  # RBAC test compares every (verb, resource) they used with the rules they are given. The control
  # plane's own accounts are left out; they would be most of the log.
  mkdir -p "$STATE/audit"
  cat >"$STATE/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: [$(printf 'system:serviceaccounts:%s,' $AUDITED_NAMESPACES | sed 's/,$//')]
- level: None
EOF
  cat >"$STATE/registry.yaml" <<EOF
version: 0.1
storage: {filesystem: {rootdirectory: "$STATE/registry"}}
http: {addr: "$REGISTRY", tls: {certificate: "$STATE/pki/registry.crt", key: "$STATE/pki/registry.key"}}
log: {level: warn}
EOF
}

control_plane() {
  start etcd "$ASSETS/etcd" --data-dir="$STATE/etcd" --listen-client-urls=http://127.0.0.1:2379 \
    --advertise-client-urls=http://127.0.0.1:2379 --listen-peer-urls=http://127.0.0.1:2380 \
    --initial-advertise-peer-urls=http://127.0.0.1:2380 --initial-cluster=default=http://127.0.0.1:2380 \
    --unsafe-no-fsync=true --log-level=warn
  local d="$STATE/pki"
  start kube-apiserver "$ASSETS/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 --cert-dir="$d" \
    --tls-cert-file="$d/apiserver.crt" --tls-private-key-file="$d/apiserver.key" --client-ca-file="$d/ca.crt" \
    --kubelet-client-certificate="$d/admin.crt" --kubelet-client-key="$d/admin.key" \
    --secure-port=$API_PORT --bind-address=0.0.0.0 --advertise-address=$NODE_IP \
    --service-cluster-ip-range=$SERVICE_CIDR --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$d/sa.pub" --service-account-signing-key-file="$d/sa.key" \
    --authorization-mode=Node,RBAC --allow-privileged=true --kubelet-preferred-address-types=InternalIP \
    --requestheader-client-ca-file="$d/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- --proxy-client-cert-file="$d/front-proxy-client.crt" \
    --proxy-client-key-file="$d/front-proxy-client.key" --enable-aggregator-routing=true \
    --audit-policy-file="$STATE/audit-policy.yaml" --audit-log-path="$STATE/audit/audit.log" \
    --audit-log-format=json --audit-log-maxsize=100 --audit-log-maxbackup=20
  wait_for kube-apiserver 60 kubectl get --raw /readyz
  start kube-controller-manager "$ASSETS/kube-controller-manager" --kubeconfig="$STATE/kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --root-ca-file="$d/ca.crt" \
    --service-account-private-key-file="$d/sa.key" --use-service-account-credentials=true \
    --cluster-signing-cert-file="$d/ca.crt" --cluster-signing-key-file="$d/ca.key"
  start kube-scheduler "$NODE/kube-scheduler" --kubeconfig="$STATE/kubeconfig" --bind-address=127.0.0.1 --leader-elect=false
}

node() {
  # The registry exports traces to localhost:4318 unless told not to.
  start registry env OTEL_TRACES_EXPORTER=none "$NODE/registry" serve "$STATE/registry.yaml"
  start_containerd
  wait_for registry 30 in_netns curl -sf --cacert "$STATE/pki/ca.crt" "https://$REGISTRY/v2/"
  push_image pause 1 "$NODE/pause" /pause
  wait_for containerd 30 test -S "$STATE/containerd/containerd.sock"
  start_kubelet
  start kube-proxy "$NODE/kube-proxy" --config="$STATE/kube-proxy.yaml"
  wait_for kubelet 120 kubectl wait --for=condition=Ready "node/$NODE_NAME" --timeout=1s
}

start_containerd() {
  start containerd env PATH="$NODE:$PATH" "$NODE/containerd" --config "$STATE/containerd/config.toml"
}

start_kubelet() {
  start kubelet env PATH="$NODE:$PATH" "$NODE/kubelet" --config="$STATE/kubelet/config.yaml" \
    --kubeconfig="$STATE/kubeconfig" --root-dir="$KUBELET_DIR" --cert-dir="$STATE/kubelet/pki" --hostname-override=$NODE_NAME \
    --node-ip=$NODE_IP --container-runtime-endpoint="unix://$STATE/containerd/containerd.sock"
}

# restart NAME: SIGTERM to the node's service NAME, then the same command line again once it is
# gone. Its Pods' containers run on under their shims; the kubelet takes them over again.
restart() {
  local name=$1 pid
  pid=$(awk -v name="$name" '$2 == name { pid = $1 } END { print pid }' "$STATE/pids")
  [ -n "$pid" ] || { log "no $name in this cluster"; exit 2; }
  kill -0 "$pid" 2>/dev/null || { log "$name (pid $pid) is not running"; exit 1; }
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  mv "$STATE/logs/$name.log" "$STATE/logs/$name.$(date +%s).log"
  case "$name" in
    containerd) start_containerd; wait_for containerd 30 test -S "$STATE/containerd/containerd.sock" ;;
    kubelet) start_kubelet ;;
    *) log "restart: kubelet or containerd"; exit 2 ;;
  esac
  wait_for kubelet 120 kubectl wait --for=condition=Ready "node/$NODE_NAME" --timeout=1s
  log "$name restarted (was pid $pid)"
}

# The node's processes: its services (the pids file), the containerd shims of its socket and the
# containers (containerd's cgroup); not the processes that merely run in the namespace, as a test does.
node_pids() {
  awk '{ print $1 }' "$STATE/pids"
  pgrep -f -- "-address $STATE/containerd/containerd.sock" || true
  local procs
  for procs in $(find /sys/fs/cgroup/pids/$CGROUP -name cgroup.procs 2>/dev/null); do cat "$procs"; done
}

# reboot: the node goes down as at a power cut and boots again. Every process of it is killed
# (SIGKILL, no time to tidy), its mounts and loop devices go, and what a reboot clears goes (the
# Pods' network namespaces and cgroups, containerd's and runc's runtime state); the network
# namespace stands for the node's network and keeps its links. Then the driver's disk is mounted
# and the services start as at boot; the kubelet brings the Pods back, their volumes mounted again
# through the driver.
reboot_node() {
  local pids
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(node_pids | sort -u | while read -r p; do if [ -e "/proc/$p" ]; then echo "$p"; fi; done)
    [ -z "$pids" ] && break
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true; sleep 0.5
  done
  [ -z "$pids" ] || { log "reboot: processes survive SIGKILL: $pids"; exit 1; }
  unmount_node
  rm -rf "$STATE/containerd/state"
  # runc's state lives in /run/containerd; it is the cluster's only when `up` made that directory.
  grep -qx /run/containerd "$STATE/host-paths" && rm -rf /run/containerd
  local name stamp; stamp=$(date +%s)
  for name in $(awk '{ print $2 }' "$STATE/pids"); do
    [ -f "$STATE/logs/$name.log" ] && mv "$STATE/logs/$name.log" "$STATE/logs/$name.$stamp.log"
  done
  : >"$STATE/pids"
  log "node down: processes killed, mounts and loop devices gone"
  mount -o loop "$STATE/driver-disk.img" "$DRIVER_DIR"
  control_plane
  node
  log "node rebooted"
}

# push_root NAME TAG ROOT ENTRYPOINT...: an image of the directory ROOT, pushed to the registry.
push_root() {
  local name=$1 tag=$2 root=$3; shift 3
  local layer; layer=$(mktemp)
  tar -C "$root" -cf "$layer" .
  in_netns "$NODE/crane" append --insecure --oci-empty-base -f "$layer" -t "$REGISTRY/$name:$tag.base" >/dev/null 2>>"$STATE/logs/crane.log"
  rm -f "$layer"
  # containerd wants the platform in the config; the entrypoint is the image's command.
  in_netns "$NODE/crane" mutate --insecure --set-platform linux/amd64 --env PATH=/usr/local/bin:/usr/bin:/bin \
    --entrypoint "$(IFS=,; echo "$*")" \
    -t "$REGISTRY/$name:$tag" "$REGISTRY/$name:$tag.base" >/dev/null 2>>"$STATE/logs/crane.log"
}

# push_image NAME TAG FILE PATH-IN-IMAGE: an image of one static binary, which is its entrypoint.
push_image() {
  local root; root=$(mktemp -d)
  mkdir -p "$root$(dirname "$4")"
  cp "$3" "$root$4"
  push_root "$1" "$2" "$root" "$4"
  rm -rf "$root"
}

# A busybox image (Debian's static build, every applet linked in /bin): the shell, httpd and wget
# of the cluster's check Pods and the tests' (as docker.io/library/busybox:1.36.0: `busybox:1.36.0`).
push_busybox() {
  local root applet; root=$(mktemp -d)
  mkdir -p "$root/bin"
  cp /bin/busybox "$root/bin/busybox"
  for applet in $(/bin/busybox --list); do [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"; done
  push_root docker.io/library/busybox 1.36.0 "$root" /bin/sh
  rm -rf "$root"
}

cluster_dns() {
  push_image coredns "${COREDNS_VERSION:-v1.12.1}" "$NODE/coredns" /coredns
  kubectl apply -f - >/dev/null <<EOF
$(sed "s#@IMAGE@#$REGISTRY/coredns:${COREDNS_VERSION:-v1.12.1}#; s#@DNS_IP@#$DNS_IP#" "$here/cluster/coredns.yaml")
EOF
  wait_for kubelet 120 kubectl -n kube-system wait --for=condition=Available deployment/coredns --timeout=1s
}

# The first proof: a Pod off the host network reaches a Service by its DNS name (CoreDNS, kube-proxy
# and the bridge together).
check_dns() {
  push_busybox
  sed "s#@IMAGE@#busybox:1.36.0#" "$here/cluster/dns-check.yaml" | kubectl apply -f - >/dev/null
  wait_for kubelet 120 kubectl -n cluster-check wait --for=jsonpath='{.status.phase}'=Succeeded pod/client --timeout=1s || {
    kubectl -n cluster-check logs client >&2 || true
    kubectl -n cluster-check get pods,svc,endpointslices -o wide >&2 || true
    return 1
  }
  log "a Pod reached Service web.cluster-check by its DNS name (web.cluster-check.svc.cluster.local, through CoreDNS and kube-proxy)"
  kubectl delete namespace cluster-check --wait=false >/dev/null
}

up() {
  [ ! -e "/run/netns/$NETNS" ] || { log "a cluster is running already (network namespace $NETNS); hack/cluster.sh down first"; exit 1; }
  if [ -n "$(ls -A "$KUBELET_DIR" 2>/dev/null)" ]; then
    log "$KUBELET_DIR is not empty: another kubelet uses this machine"; exit 1
  fi
  if [ -n "$(cluster_cgroups)" ]; then
    log "cgroup $CGROUP exists: another containerd runs Pods on this machine"; exit 1
  fi
  ASSETS=$("$here/control-plane.sh")
  NODE=$("$here/node-peers.sh")
  rm -rf "$STATE"; mkdir -p "$STATE/logs"
  echo "ASSETS=$ASSETS" >"$STATE/env"; echo "NODE=$NODE" >>"$STATE/env"
  for s in $KUBELET_SYSCTLS; do echo "$s=$(sysctl -n "$s")"; done >"$STATE/sysctls"
  for p in $HOST_PATHS; do [ -e "$p" ] || echo "$p"; done >"$STATE/host-paths"
  host_rules >"$STATE/host-rules"
  mountpoint -q /run/netns || touch "$STATE/netns-dir-made"
  local t0; t0=$(date +%s)
  driver_disk
  pki
  network
  configure_node
  control_plane
  node
  cluster_dns
  check_dns
  log "cluster up in $(( $(date +%s) - t0 )) s: hack/cluster.sh exec kubectl get pods -A"
}

driver_disk() {
  if [ -n "$(ls -A "$DRIVER_DIR" 2>/dev/null)" ]; then
    log "$DRIVER_DIR is not empty: another reference driver keeps its state on this machine"; exit 1
  fi
  mkdir -p "$DRIVER_DIR"
  truncate -s "$DRIVER_DISK_SIZE" "$STATE/driver-disk.img"
  mkfs.ext4 -q -F -m 0 -E lazy_itable_init=1,lazy_journal_init=1 "$STATE/driver-disk.img"
  # A loop device that clears itself when unmounted.
  mount -o loop "$STATE/driver-disk.img" "$DRIVER_DIR"
}

# Every process of the cluster: those in its network namespace, and the containers (whose root is
# under containerd's state directory; Pods have network namespaces of their own).
cluster_pids() {
  local ns_inode="" pid
  [ -e "/run/netns/$NETNS" ] && ns_inode=$(stat -L -c %i "/run/netns/$NETNS")
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    [ "$pid" = $$ ] && continue
    if [ -n "$ns_inode" ] && [ "$(stat -L -c %i "/proc/$pid/ns/net" 2>/dev/null)" = "$ns_inode" ]; then
      echo "$pid"
    elif [[ "$(readlink "/proc/$pid/root" 2>/dev/null)" == "$STATE"/* ]]; then
      echo "$pid"
    fi
  done
  # Containers have network and mount namespaces of their own; containerd puts them in its cgroup.
  local procs
  for procs in $(find /sys/fs/cgroup/pids/$CGROUP -name cgroup.procs 2>/dev/null); do cat "$procs"; done
}

# containerd's cgroups (every controller), deepest first; `up` refuses to start when they exist.
cluster_cgroups() { find /sys/fs/cgroup/*/$CGROUP -depth -type d 2>/dev/null || true; }

# The host's own iptables and nftables rules, without counters: the cluster must not change them.
host_rules() {
  { iptables-save 2>/dev/null; ip6tables-save 2>/dev/null; nft list ruleset 2>/dev/null || true; } \
    | sed -e '/^#/d' -e 's/\[[0-9]*:[0-9]*\]//g'
}

# Mounts under the state directory and the kubelet's (which the kubelet bind-mounts on itself to
# share mounts with the Pods), and the driver's disk, deepest first.
cluster_mounts() {
  awk -v s="$STATE" -v k="$KUBELET_DIR" -v d="$DRIVER_DIR" \
    'index($5, s "/") == 1 || $5 == s || index($5, k "/") == 1 || $5 == k || index($5, d "/") == 1 || $5 == d { print $5 }' \
    /proc/self/mountinfo | sort -r
}
# A loop device the driver attached inside its container names its file from the root of the
# container's bind mount of DRIVER_DIR (`/volumes/<id>.img`) once that mount is out of the host's
# sight: those are the cluster's too.
cluster_loops() {
  losetup -l -n -O NAME,BACK-FILE 2>/dev/null \
    | awk -v s="$STATE" -v d="$DRIVER_DIR" 'index($2, s "/") == 1 || index($2, d "/") == 1 || $2 ~ /^\/volumes\/[0-9a-f]+\.img$/ { print $1 }'
}

# The node's mounts, loop devices and cgroups, once its processes are gone. The volumes' loop
# devices keep files on the driver's disk open: its mount goes after them.
unmount_node() {
  local m
  for m in $(cluster_mounts | grep -vx "$DRIVER_DIR"); do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  for m in $(cluster_loops); do losetup -d "$m" 2>/dev/null || true; done
  if mountpoint -q "$DRIVER_DIR"; then umount "$DRIVER_DIR" 2>/dev/null || umount -l "$DRIVER_DIR" 2>/dev/null || true; fi
  for m in $(cluster_loops); do losetup -d "$m" 2>/dev/null || true; done
  for m in $(cluster_cgroups); do rmdir "$m" 2>/dev/null || true; done
}

down() {
  local pids
  for round in 1 2 3 4 5; do
    pids=$(cluster_pids)
    [ -z "$pids" ] && break
    # shellcheck disable=SC2086
    if [ "$round" = 1 ]; then kill -TERM $pids 2>/dev/null || true; sleep 2; else kill -KILL $pids 2>/dev/null || true; sleep 0.5; fi
  done
  unmount_node
  [ -e "/run/netns/$NETNS" ] && ip netns del "$NETNS"
  # `ip netns add` made /run/netns a mount point of its own; undo it when nothing else uses it.
  if [ -f "$STATE/netns-dir-made" ] && [ -z "$(ls -A /run/netns 2>/dev/null)" ]; then
    umount /run/netns 2>/dev/null || true; rmdir /run/netns 2>/dev/null || true
  fi
  local rules_changed=0
  if [ -f "$STATE/host-rules" ] && ! host_rules | cmp -s - "$STATE/host-rules"; then
    log "the host's iptables or nftables rules differ from before the cluster started:"
    host_rules | diff "$STATE/host-rules" - >&2 || true
    rules_changed=1
  fi
  if [ -f "$STATE/host-paths" ]; then
    while read -r p; do rm -rf "$p"; done <"$STATE/host-paths"
  fi
  if [ -f "$STATE/sysctls" ]; then
    while IFS='=' read -r k v; do sysctl -qw "$k=$v" || true; done <"$STATE/sysctls"
  fi
  if [ -d "$STATE/logs" ] && [ -n "${CLUSTER_KEEP_LOGS:-}" ]; then
    mkdir -p "$CLUSTER_KEEP_LOGS" && cp -r "$STATE/logs/." "$CLUSTER_KEEP_LOGS/"
  fi
  rm -rf "$STATE"
  check && [ "$rules_changed" = 0 ]
}

check() {
  local left=0
  [ -n "$(cluster_pids)" ] && { log "processes left: $(cluster_pids | tr '\n' ' ')"; left=1; }
  [ -n "$(cluster_mounts)" ] && { log "mounts left: $(cluster_mounts | tr '\n' ' ')"; left=1; }
  [ -n "$(cluster_loops)" ] && { log "loop devices left: $(cluster_loops | tr '\n' ' ')"; left=1; }
  [ -e "/run/netns/$NETNS" ] && { log "network namespace left: $NETNS"; left=1; }
  [ -n "$(cluster_cgroups)" ] && { log "cgroups left: $(cluster_cgroups | tr '\n' ' ')"; left=1; }
  [ -e "$STATE" ] && { log "state directory left: $STATE"; left=1; }
  for p in $(ip netns list 2>/dev/null | awk '/^cni-/ { print $1 }'); do log "a Pod's network namespace left: $p"; left=1; done
  return $left
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  check) check ;;
  exec)
    shift
    # shellcheck disable=SC1091
    . "$STATE/env"
    PATH="$ASSETS:$NODE:$PATH" KUBECONFIG="$STATE/kubeconfig" CLUSTER_KUBECONFIG="$STATE/kubeconfig" \
      CLUSTER_REGISTRY="$REGISTRY" CLUSTER_CA_FILE="$STATE/pki/ca.crt" CLUSTER_AUDIT_DIR="$STATE/audit" in_netns "$@" ;;
  restart)
    # shellcheck disable=SC1091
    . "$STATE/env"
    restart "${2:-}" ;;
  reboot)
    # shellcheck disable=SC1091
    . "$STATE/env"
    reboot_node ;;
  *) log "usage: hack/cluster.sh up|down|check|exec CMD...|restart kubelet|containerd|reboot"; exit 2 ;;
esac
