#!/usr/bin/env bash
# Checks deploy/ without a cluster or a Docker engine (`make deploy-check`):
#   1. every Kubernetes manifest against the API schema (kubernetes-validate,
#      strict: unknown fields fail), and the kustomize rendering of deploy/
#      (kubectl kustomize) the same way, when kubectl is there;
#   2. both NATS configs parse (nats-server -t), when nats-server is there;
#   3. deploy/ agrees with itself and the code: the NATS users the
#      services log in as exist, every password has a Secret key and a
#      .env.example line, each reaction's lease keys are the ones its
#      durable writes, one partition count everywhere, no shared or
#      ReadWriteMany volume;
#   4. compose.yaml with `docker compose config -q`, when docker compose is there.
# A missing optional tool is reported and skipped; any failure exits 1.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(cd .. && pwd)
failed=0
fail() { echo "FAIL: $*" >&2; failed=1; }
skip() { echo "SKIP: $*"; }
ok() { echo "ok: $*"; }

# 1. Kubernetes manifests.
if command -v kubernetes-validate >/dev/null 2>&1; then
  if kubernetes-validate --strict --quiet kubernetes/*.yaml; then
    ok "kubernetes-validate --strict kubernetes/*.yaml"
  else
    fail "kubernetes-validate kubernetes/*.yaml"
  fi
  if command -v kubectl >/dev/null 2>&1; then
    rendered=$(mktemp --suffix=.yaml)
    trap 'rm -f "$rendered"' EXIT
    if kubectl kustomize . >"$rendered" && kubernetes-validate --strict --quiet "$rendered"; then
      ok "kubectl kustomize deploy/ | kubernetes-validate --strict ($(grep -c '^kind:' "$rendered") resources)"
    else
      fail "kubectl kustomize deploy/ does not render or validate"
    fi
  else
    skip "kubectl not found: the kustomize rendering is not checked"
  fi
else
  fail "kubernetes-validate not found (pip install kubernetes-validate)"
fi

# 2. NATS configs.
nats_server=""
for candidate in "${ZOPU_NATS_SERVER:-}" "$root/tools/bin/nats-server" "$(command -v nats-server 2>/dev/null)"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ]; then nats_server=$candidate; break; fi
done
users=$(sed -n 's/^ *{ user: \([a-z]*\),.*/\1/p' nats/accounts.conf)
if [ -n "$nats_server" ]; then
  env_for_nats=(NODE_NAME=n1 POD_NAME=nats-0)
  for user in $users; do env_for_nats+=("ZOPU_$(echo "$user" | tr a-z A-Z)_PASSWORD=check"); done
  for conf in nats/cluster.conf nats/cluster-kubernetes.conf; do
    if out=$(env "${env_for_nats[@]}" "$nats_server" -t -c "$conf" 2>&1); then
      ok "nats-server -t $conf"
    else
      fail "nats-server -t $conf: $out"
    fi
  done
  # The optional TLS blocks (tls-clients.conf, tls-routes.conf) turned on,
  # with throwaway certificates where the mounted secrets would be.
  if command -v openssl >/dev/null 2>&1; then
    tls_dir=$(mktemp -d)
    (
      set -e
      cd "$tls_dir"
      openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
        -subj /CN=zopu-check-ca -keyout ca.key -out ca.crt 2>/dev/null
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=nats \
        -keyout tls.key -out tls.csr 2>/dev/null
      printf 'subjectAltName=DNS:nats-0.nats,DNS:nats-1\n' >ext
      openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 \
        -extfile ext -out tls.crt 2>/dev/null
      mkdir clients routes conf
      cp tls.crt tls.key ca.crt clients/ && cp tls.crt tls.key ca.crt routes/
    ) || fail "openssl could not make the certificates to check the TLS variant"
    for conf in cluster.conf cluster-kubernetes.conf; do
      cp nats/*.conf "$tls_dir/conf/"
      sed -i 's|^\( *\)# include \./tls-|\1include ./tls-|' "$tls_dir/conf/$conf"
      sed -i "s|/etc/nats-tls/|$tls_dir/|" "$tls_dir/conf/tls-clients.conf" "$tls_dir/conf/tls-routes.conf"
      if [ "$(grep -c '^ *include \./tls-' "$tls_dir/conf/$conf")" -ne 2 ]; then
        fail "nats/$conf lacks the commented '# include ./tls-clients.conf' and '# include ./tls-routes.conf' lines"
      elif out=$(env "${env_for_nats[@]}" "$nats_server" -t -c "$tls_dir/conf/$conf" 2>&1); then
        ok "nats-server -t $conf with client and route TLS included"
      else
        fail "nats-server -t $conf with TLS included: $out"
      fi
    done
    rm -rf "$tls_dir"
  else
    skip "openssl not found: the TLS variant of the NATS configs is not parsed"
  fi
else
  skip "nats-server not found (make nats-server, or set ZOPU_NATS_SERVER): NATS configs not parsed"
fi

# 3. Consistency.
grep -q 'sync_interval: always' nats/cluster.conf && grep -q 'sync_interval: always' nats/cluster-kubernetes.conf \
  || fail "a NATS config lacks sync_interval: always"
for service in setup dispatch conversation specialists artifacts executor gateway; do
  echo "$users" | grep -qx "$service" || fail "accounts.conf has no user $service"
  grep -q "ZOPU_NATS_USER, value: $service }" kubernetes/zopu.yaml || fail "kubernetes/zopu.yaml: $service does not log in as $service"
  grep -q "ZOPU_NATS_USER: $service\b" compose.yaml || fail "compose.yaml: $service does not log in as $service"
  grep -q "name: zopu-$service\$" kubernetes/zopu.yaml || fail "kubernetes/zopu.yaml has no Deployment zopu-$service"
done
for user in $users; do
  upper=$(echo "$user" | tr a-z A-Z)
  grep -q "name: zopu-nats-$user }" kubernetes/secrets.example.yaml || fail "secrets.example.yaml has no Secret zopu-nats-$user"
  grep -q "{ name: ZOPU_${upper}_PASSWORD, valueFrom: { secretKeyRef: { name: zopu-nats-$user, key: password } } }" kubernetes/nats.yaml \
    || fail "kubernetes/nats.yaml does not pass the $user password from the Secret zopu-nats-$user"
  grep -q "^ZOPU_${upper}_PASSWORD=" .env.example || fail ".env.example has no ZOPU_${upper}_PASSWORD"
  grep -q "^    ZOPU_${upper}_PASSWORD: \"\${ZOPU_${upper}_PASSWORD:?" compose.yaml \
    || fail "compose.yaml does not pass ZOPU_${upper}_PASSWORD to the NATS nodes (accounts.conf reads it)"
done
# Secrets per service: each service's Deployment references only its own
# Secrets (zopu-nats-<service>, and zopu-llm-<service> or zopu-gateway), and
# zopu-secrets-key only the services that open the secret store.
secret_store_readers="setup specialists gateway"
for service in setup dispatch conversation specialists artifacts executor gateway; do
  deployment=$(sed -n "/^  name: zopu-$service\$/,/^---/p" kubernetes/zopu.yaml)
  own="zopu-nats-$service\|zopu-llm-$service\|zopu-$service"
  if echo " $secret_store_readers " | grep -q " $service "; then
    own="$own\|zopu-secrets-key"
    echo "$deployment" | grep -q "secretKeyRef: { name: zopu-secrets-key, key: key }" \
      || fail "kubernetes/zopu.yaml: zopu-$service does not read ZOPU_SECRETS_KEY from zopu-secrets-key"
  fi
  foreign=$(echo "$deployment" | grep -o 'secretKeyRef: { name: [a-z-]*' | sed 's/.*name: //' \
    | grep -vx "$own" || true)
  [ -z "$foreign" ] || fail "kubernetes/zopu.yaml: zopu-$service references another identity's Secret: $foreign"
  echo "$deployment" | grep -q "secretKeyRef: { name: zopu-nats-$service, key: password }" \
    || fail "kubernetes/zopu.yaml: zopu-$service does not read its password from zopu-nats-$service"
done
# Each reaction's lease keys are <kind>.<service>-<name>.<id> (subjects::durable).
while read -r file name; do
  service=$(basename "$(dirname "$(dirname "$file")")")
  grep -q "\"\$KV.zopu-leases.\*.$service-$name.\*\"" nats/accounts.conf \
    || fail "accounts.conf: $service may not write its lease keys \$KV.zopu-leases.*.$service-$name.*"
  [ "$(grep -c "\"zopu.alive.$service-$name.\*\"" nats/accounts.conf)" -ge 2 ] \
    || fail "accounts.conf: $service may not publish and subscribe to its alive subject zopu.alive.$service-$name.*"
done < <(grep -o 'subjects::durable(SERVICE, "[a-z]*")' -r "$root/services" --include=*.rs \
  | sed 's/:subjects::durable(SERVICE, "\([a-z]*\)")/ \1/' | sort -u)
./scripts/accounts-durables.sh --check || fail "accounts.conf: the denials of other services' durables are stale"
grep -q "{ user: admin," nats/accounts.conf || fail "accounts.conf has no admin identity (zopu streams apply)"
for service in setup dispatch conversation specialists artifacts executor gateway; do
  sed -n "/{ user: $service,/,/subscribe:/p" nats/accounts.conf | grep -q 'STREAM\.\(CREATE\|UPDATE\|DELETE\)\|\$JS\.API\.>' \
    && fail "accounts.conf: $service may create, update or delete a stream"
done
# Hardening: every container non-root with a read-only root filesystem, no
# privilege escalation and no capabilities; NetworkPolicies in place.
for manifest in kubernetes/zopu.yaml kubernetes/nats.yaml; do
  containers=$(grep -c '^        - name: ' <(sed -n '/^      containers:/,/^      volumes:/p' "$manifest"))
  for setting in 'readOnlyRootFilesystem: true' 'allowPrivilegeEscalation: false' 'capabilities: { drop: \["ALL"\] }'; do
    [ "$(grep -c "$setting" "$manifest")" -ge "$containers" ] || fail "$manifest: not every container sets $setting"
  done
  [ "$(grep -c 'runAsNonRoot: true' "$manifest")" -ge 1 ] || fail "$manifest: pods may run as root"
  grep -q '^kind: NetworkPolicy' "$manifest" || fail "$manifest has no NetworkPolicy"
done
partitions=$(grep -ho 'ZOPU_SCALE__PARTITIONS: "[0-9]*"' kubernetes/zopu.yaml compose.yaml | sort -u | wc -l)
[ "$partitions" -eq 1 ] || fail "kubernetes/ and compose.yaml set different ZOPU_SCALE__PARTITIONS"
! grep -q 'accessModes:.*ReadWriteMany' kubernetes/*.yaml || fail "a ReadWriteMany volume in kubernetes/"
! grep -q persistentVolumeClaim kubernetes/zopu.yaml || fail "a service mounts a PersistentVolumeClaim"
[ "$failed" -eq 0 ] && ok "deploy/ is consistent with itself and with the services' durables"

# 4. Compose.
compose_bin=()
if docker compose version >/dev/null 2>&1; then
  compose_bin=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
  compose_bin=(docker-compose)
fi
if [ ${#compose_bin[@]} -gt 0 ]; then
  env_file=.env
  [ -f "$env_file" ] || env_file=.env.example
  if "${compose_bin[@]}" --env-file "$env_file" -f compose.yaml config -q; then
    ok "${compose_bin[*]} config -q (env from $env_file)"
  else
    fail "${compose_bin[*]} config"
  fi
else
  skip "docker compose not found: compose.yaml is not checked"
fi

exit "$failed"
