#!/usr/bin/env bash
# `make run`: the controller on a local control plane with the in-cluster backend and the examples.
#
# - With KUBECONFIG pointing at a reachable cluster, that cluster is used (Cluster API's CRDs are installed only if
#   absent, nothing is applied with force, and the controller serves only the ipam-demo namespace); otherwise the
#   local control plane in $CLUSTER_DIR is used, started afresh if there is none or its processes are gone (etcd +
#   kube-apiserver built from their Go modules, see hack/control-plane).
# - Installs the CRDs, applies examples/incluster/, runs the controller, waits until every example claim has
#   an address and shows them. Then the controller keeps running in the foreground until Ctrl-C, unless
#   RUN_ONCE=1, in which case it stops after showing the claims.
# The local control plane stays up afterwards; `make cluster-down` stops it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python
CLUSTER_DIR="$(realpath -m "${CLUSTER_DIR:-.local/cluster}")"
KUBECTL="$(hack/control-plane/build-binaries.sh)/kubectl"
[[ -x "$KUBECTL" ]] || KUBECTL="$(command -v kubectl)"

reachable() { "$KUBECTL" --kubeconfig "$1" --request-timeout=5s get --raw=/readyz >/dev/null 2>&1; }

if [[ -n "${KUBECONFIG:-}" ]] && reachable "$KUBECONFIG"; then
  # Not our cluster: Cluster API's CRDs only where absent, and nothing applied with force.
  echo "using the cluster of KUBECONFIG=$KUBECONFIG"
  $PY -m tools.controlplane install-crds --external --kubeconfig "$KUBECONFIG"
else
  if [[ -f "$CLUSTER_DIR/kubeconfig" ]] && reachable "$CLUSTER_DIR/kubeconfig"; then
    $PY -m tools.controlplane install-crds --dir "$CLUSTER_DIR"
  else
    # None yet, or one whose processes are gone (`up` replaces a dead instance, and refuses a live one).
    $PY -m tools.controlplane up --dir "$CLUSTER_DIR" >/dev/null
  fi
  export KUBECONFIG="$CLUSTER_DIR/kubeconfig"
  echo "local control plane: export KUBECONFIG=$KUBECONFIG"
fi

"$KUBECTL" apply -f examples/incluster/
mkdir -p .local
log=.local/controller.log
DEMO_NS=ipam-demo  # the examples' namespace: the demo serves, counts and shows only its claims
.venv/bin/ipam-provider run --kubeconfig "$KUBECONFIG" --namespace "$DEMO_NS" --metrics-bind-address=127.0.0.1:0 \
  --health-probe-bind-address=0 --webhook-port=0 --log-format=console >"$log" 2>&1 &
controller=$!
trap 'kill -TERM $controller 2>/dev/null; wait $controller 2>/dev/null || true' EXIT
echo "controller running (pid $controller, log $log); waiting for the example claims..."

claims=$("$KUBECTL" get ipaddressclaims -n "$DEMO_NS" --no-headers 2>/dev/null | wc -l)
for _ in $(seq 1 120); do
  ready=$("$KUBECTL" get ipaddressclaims -n "$DEMO_NS" -o jsonpath='{range .items[*]}{.status.addressRef.name}{"\n"}{end}' | grep -c . || true)
  [[ "$ready" -ge "$claims" ]] && break
  kill -0 $controller 2>/dev/null || { echo "the controller exited:"; tail -20 "$log"; exit 1; }
  sleep 0.5
done
echo
.venv/bin/ipam-provider status --kubeconfig "$KUBECONFIG" --namespace "$DEMO_NS"
echo
"$KUBECTL" get inclusterippools -n "$DEMO_NS"
"$KUBECTL" get globalinclusterippools
"$KUBECTL" get inclusterprefixpools -n "$DEMO_NS"
if [[ "$ready" -lt "$claims" ]]; then
  echo "only $ready of $claims claims were fulfilled; see $log" >&2
  exit 1
fi
if [[ "${RUN_ONCE:-0}" == "1" ]]; then
  exit 0
fi
echo
echo "The controller keeps running (Ctrl-C stops it). Try: kubectl apply / delete claims; tail -f $log"
wait $controller
