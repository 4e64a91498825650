#!/usr/bin/env bash
# The system packages the tests need (`make test` runs this first), from
# Debian's archive: git (clone tests), chromium and chromium-driver (the
# browser test), openssl (the TLS test's certificates),
# python3-openapi-spec-validator (the OpenAPI document's check), bubblewrap (an optional confinement layer the sandbox
# tests use when present). Anything already on PATH is skipped. Installs
# with apt-get as root, or through `sudo -n` when that needs no password;
# otherwise it names the packages and the command and exits 1 (bubblewrap
# alone is optional: a warning). ZOPU_SKIP_TEST_DEPS=1 skips the check.
set -euo pipefail
[ "${ZOPU_SKIP_TEST_DEPS:-}" = 1 ] && exit 0

#
# With arguments, `COMMAND=PACKAGE ...`, it checks and installs those
# instead, all required (`make contract-check` asks for node=nodejs
# npm=npm this way).

required=()
optional=()
if [ $# -gt 0 ]; then
  for pair in "$@"; do
    command -v "${pair%%=*}" >/dev/null 2>&1 || required+=("${pair#*=}")
  done
else
  command -v git >/dev/null 2>&1 || required+=(git)
  command -v chromium >/dev/null 2>&1 || required+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || required+=(chromium-driver)
  command -v openssl >/dev/null 2>&1 || required+=(openssl)
  command -v openapi-spec-validator >/dev/null 2>&1 || required+=(python3-openapi-spec-validator)
  command -v bwrap >/dev/null 2>&1 || optional+=(bubblewrap)
fi
wanted=("${required[@]}" "${optional[@]}")
[ ${#wanted[@]} -eq 0 ] && exit 0

as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    as_root=(none)
  fi
fi
if [ "${as_root[*]}" != none ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing ${wanted[*]} (apt-get) for the tests" >&2
  export DEBIAN_FRONTEND=noninteractive
  install() {
    "${as_root[@]}" apt-get update -qq \
      && "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${wanted[@]}" >/dev/null
  }
  if install; then
    exit 0
  fi
  # An earlier install that was interrupted leaves dpkg half-configured:
  # finish it and try once more.
  echo "install-test-deps: apt-get failed; running dpkg --configure -a and trying again" >&2
  if "${as_root[@]}" dpkg --configure -a && install; then
    exit 0
  fi
  echo "install-test-deps: apt-get could not install ${wanted[*]}" >&2
fi
if [ ${#required[@]} -gt 0 ]; then
  cat >&2 <<MESSAGE
install-test-deps: the tests need ${required[*]}, which are not installed and
could not be installed here (apt-get failed, or this user is not root, has no
password-less sudo, or the machine has no apt-get).
Install them, e.g.:
    sudo apt-get install ${wanted[*]}
then run \`make test\` again (ZOPU_SKIP_TEST_DEPS=1 skips this check).
MESSAGE
  exit 1
fi
echo "install-test-deps: ${optional[*]} not installed (optional: the sandbox falls back to its other layers)" >&2
