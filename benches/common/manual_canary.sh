#!/usr/bin/env bash
# The canary as operators run it by hand today (docs/reference.md#runbooks): curl and jq,
# one runbook step after the other, `sleep` between polls. The benchmark runs it as the
# baseline. Prints "STEP <name> <epoch ms>" as each step starts and "STEP done ..." at the end.
# Inputs (env): CM TOKEN FILE SERVICE TAG HEALTH PEER_HEALTH ENV_JSON INTERVAL (seconds)
# SOAK_MS MARKER MAX_POLLS.
# It checks less than canaryd does (no dry-run plan gate, no capability probe, no records):
# the comparison is in the script's favour.
set -u -o pipefail
step() { echo "STEP $1 $(date +%s%3N)"; }
fail() { echo "FAIL $*"; exit 1; }
AUTH="Authorization: Bearer $TOKEN"
body() { # $1: true for a dry run
  jq -cn --arg tag "$TAG" --arg file "$FILE" --arg svc "$SERVICE" --argjson env "$ENV_JSON" \
    --argjson dry "$1" '{tag: $tag, file: $file, services: [$svc], env: $env}
      + (if $dry then {dry_run: true} else {} end)'
}
compose() { # $1: up|down, $2: dry run; succeeds only if the stream ends in a successful done
  curl -sS -N -X POST -H "$AUTH" -H 'content-type: application/json' -d "$(body "$2")" \
    "$CM/compose/$1" | tail -n 1 | jq -e '.event == "done" and .success == true' >/dev/null
}
code() { curl -s -o /dev/null -w '%{http_code}' --max-time 3 "$1"; }
others() { # every other container's id and image
  curl -sS -H "$AUTH" "$CM/docker/ps" | jq -r '.output' \
    | jq -r --arg svc "$SERVICE" 'select(.Names != $svc) | .ID + " " + .Image' | sort
}
logs() {
  curl -sS -X POST -H "$AUTH" -H 'content-type: application/json' \
    -d "{\"file\": \"$FILE\", \"services\": [\"$SERVICE\"], \"tail\": 500}" "$CM/compose/logs"
}

step snapshot
before=$(others) || fail ps
curl -sS "$CM/version" >/dev/null || fail version
step peers
[ "$(code "$PEER_HEALTH")" = 200 ] || fail peer unhealthy
step preflight
compose up true || fail dry run
step down
compose down false || fail down
step plan
compose up true || fail dry run
step up
compose up false || fail up
step neighbours
[ "$(others)" = "$before" ] || fail neighbours changed
step health
n=0
until [ "$(code "$HEALTH")" = 200 ]; do
  n=$((n + 1)); [ "$n" -le "$MAX_POLLS" ] || fail health timeout
  sleep "$INTERVAL"
done
step startup-logs
n=0
until out=$(logs) && grep -qF 'event-loop stall dump armed' <<<"$out" \
    && grep -qF "$MARKER" <<<"$out"; do
  grep -qF -e 'CUDA error 801' -e 'Traceback (most recent call last)' -e 'out of memory' \
    <<<"$out" && fail forbidden line
  n=$((n + 1)); [ "$n" -le "$MAX_POLLS" ] || fail logs timeout
  sleep "$INTERVAL"
done
step soak
end=$(( $(date +%s%3N) + SOAK_MS )); misses=0; n=0
while [ "$n" -le "$MAX_POLLS" ]; do
  n=$((n + 1))
  if [ "$(code "$HEALTH")" = 200 ]; then misses=0; else misses=$((misses + 1)); fi
  [ "$misses" -lt 3 ] || fail soak health
  logs | grep -qF -e '[event-loop-stall]' -e 'CUDA error' && fail forbidden line in soak
  [ "$(date +%s%3N)" -lt "$end" ] || break
  sleep "$INTERVAL"
done
step done
