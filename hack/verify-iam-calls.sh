#!/usr/bin/env bash
# The AWS calls the whole test suite's moto servers saw from this project's programs, against
# the IAM policies shipped in deploy/aws/iam/: every call the CCM (user agent
# app/rust-cloud-provider: the service controllers, doctor, orphans) made must be allowed by
# cloud-controller-manager-policy.json, every call of ecr-credential-provider
# (app/rust-cloud-provider-ecr) by ecr-credential-provider-policy.json. (tests/tests/deploy.rs
# checks the other way round: the policies allow nothing the code never calls.) Prints what was
# seen and which allowed actions no test exercised.
#   hack/verify-iam-calls.sh DIR     (DIR: the RCP_AWS_CALLS_DIR the tests ran with)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: hack/verify-iam-calls.sh DIR}
calls=$(cat "$dir"/*.calls 2>/dev/null || true)
[[ -n "$calls" ]] || { echo "verify-iam-calls: no AWS call recorded in $dir (did the tests run with RCP_AWS_CALLS_DIR?)" >&2; exit 1; }
allowed() { jq -r '[.Statement[].Action] | flatten | .[]' "deploy/aws/iam/$1" | sort -u; }
rc=0
for pair in "rust-cloud-provider cloud-controller-manager-policy.json" "rust-cloud-provider-ecr ecr-credential-provider-policy.json"; do
  read -r app policy <<<"$pair"
  # STS (AssumeRole with [Global] RoleARN) is allowed on the role's trust side, not here.
  seen=$(awk -v app="$app" '$1 == app { print $2 }' <<<"$calls" | grep -v '^sts:' | sort -u || true)
  requests=$(awk -v app="$app" '$1 == app' <<<"$calls" | wc -l)
  [[ -n "$seen" ]] || { echo "verify-iam-calls: no call of $app recorded" >&2; rc=1; continue; }
  missing=$(comm -23 <(echo "$seen") <(allowed "$policy"))
  unexercised=$(comm -13 <(echo "$seen") <(allowed "$policy") | grep -v '^iam:' || true)
  echo "verify-iam-calls: $app: $(wc -l <<<"$seen") actions in $requests requests, all in $policy${missing:+ — NOT ALLOWED: $(paste -sd' ' <<<"$missing")}"
  [[ -z "$unexercised" ]] || echo "  allowed, and called by the code, but made by no test: $(paste -sd' ' <<<"$unexercised")"
  [[ -z "$missing" ]] || rc=1
done
exit "$rc"
