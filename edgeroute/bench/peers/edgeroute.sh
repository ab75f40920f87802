# A target file for ../shared/bench-peers/run_all.sh (`--target bench/peers/edgeroute.sh`):
# the edgeroute gateway, in front of the harness's backends, with the policy in
# $EDGEROUTE_POLICY (default least_load). `edgeroute bench peers` sets the variables.
NAME=${EDGEROUTE_NAME:-edgeroute}
PORT=${EDGEROUTE_PORT:-8300}
READY_TIMEOUT=60
EDGEROUTE_PY=${EDGEROUTE_PY:-python3}

target_available() {
  "${EDGEROUTE_PY}" -c "import gateway" 2>/dev/null || { echo "edgeroute is not importable by ${EDGEROUTE_PY}"; return 1; }
}

target_version() {
  "${EDGEROUTE_PY}" -c "import importlib.metadata as m; print('edgeroute ' + m.version('edgeroute'))"
}

target_start() {
  {
    echo "host: 127.0.0.1"
    echo "port: ${PORT}"
    echo "routing: {default: {policy: ${EDGEROUTE_POLICY:-least_load}}}"
    echo "backends:"
    for url in ${BACKEND_URLS}; do echo "  - {url: \"${url}\", models: [\"${MODEL}\"]}"; done
  } > "${RUN_DIR}/gateway.yaml"
  cd "${EDGEROUTE_ROOT:-.}" || return 1
  EDGEROUTE_LOG_LEVEL=WARNING exec "${EDGEROUTE_PY}" -m edgeroute.cli serve --config "${RUN_DIR}/gateway.yaml"
}
