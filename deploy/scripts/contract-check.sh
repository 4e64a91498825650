#!/usr/bin/env bash
# `make contract-check`: the checked-in AsyncAPI document (proto/asyncapi.json)
#   1. is what the code generates now (`zopu contract asyncapi --check`:
#      an event type, header or consumer added without regenerating fails);
#      and so is the JSON Schema of flow.completed's result_json
#      (proto/flow-result.schema.json, `zopu contract flow-result --check`)
#      and of the agent registry file (proto/agent-registry.schema.json,
#      `zopu contract agent-registry --check`), and so are the event types
#      each NATS identity may append in deploy/nats/accounts.conf
#      (`zopu contract nats-permissions --check`, from zopu_schema::ownership);
#   2. is valid AsyncAPI by the AsyncAPI project's parser (@asyncapi/parser
#      from the npm registry, installed into tools/asyncapi, never committed).
set -euo pipefail
cd "$(dirname "$0")/../.."
parser_version=3.6.6
dir=tools/asyncapi
installed=$(node -p "require('./$dir/node_modules/@asyncapi/parser/package.json').version" 2>/dev/null || true)
if [ "$installed" != "$parser_version" ]; then
  ./deploy/scripts/install-test-deps.sh node=nodejs npm=npm
  mkdir -p "$dir"
  npm install --silent --no-audit --no-fund --no-save --prefix "$dir" "@asyncapi/parser@$parser_version"
fi
${CARGO:-cargo} run -q -p zopu-cli --bin zopu -- contract asyncapi --check
${CARGO:-cargo} run -q -p zopu-cli --bin zopu -- contract flow-result --check
${CARGO:-cargo} run -q -p zopu-cli --bin zopu -- contract agent-registry --check
${CARGO:-cargo} run -q -p zopu-cli --bin zopu -- contract nats-permissions --check
node deploy/scripts/asyncapi-validate.cjs "$dir" proto/asyncapi.json
