#!/usr/bin/env bash
# Publishes the staged crates, in dependency order, with the real `cargo publish`, one crate at
# a time, so that a publish that stops part-way (a network failure, crates.io's rate limit) is
# finished by running the same command again.
#
#   hack/publish-staging.sh                        dry run against crates.io (the default):
#                                                  the plan (which names are new, taken, or
#                                                  already at this version), then
#                                                  `cargo publish --dry-run`
#   CARGO_REGISTRY_TOKEN=… hack/publish-staging.sh --execute --owner LOGIN
#                                                  publish to crates.io (never run by CI)
#   hack/publish-staging.sh --registry NAME        publish to the registry NAME of cargo's
#                                                  configuration ([registries.NAME] in a
#                                                  config.toml, or CARGO_REGISTRIES_NAME_INDEX
#                                                  and CARGO_REGISTRIES_NAME_TOKEN)
#
# Options:
#   --rev REV       publish the staged crates as they are at git revision REV (e.g. the last
#                   release, as the baseline of hack/semver-checks.sh); default: HEAD
#   --allow-dirty   publish the working tree's files, uncommitted changes included (only with
#                   --registry: never to crates.io)
#   --no-verify     do not build each packaged crate before uploading it
#   --owner LOGIN   a crates.io user or team (github:ORG:TEAM) that must own every staged crate
#                   name the registry already has (repeatable; one match is enough); required
#                   by --execute, checked with `cargo owner --list` before anything is uploaded
#   --new-crate-burst N --new-crate-interval SECONDS
#                   pace the crates the registry does not have yet: N in a burst, then one per
#                   SECONDS (crates.io's limit, the default with --execute: 5, then one per
#                   600 s; no pacing for another registry unless given)
#
# Resuming. Every crate is packaged first (`cargo package`; its .crate is reproducible), and
# each name and version is looked up in the registry's index before anything is uploaded:
#   - the version is there with the same checksum: it was published by an earlier run of this
#     same source: skipped;
#   - the version is there with another checksum: skipped when the published .crate holds the
#     same files (packaged at another commit: only .cargo_vcs_info.json differs), otherwise
#     refused, naming the files that differ (nothing is uploaded; a published version is never
#     replaced; bump it with hack/release.sh);
#   - the name is there (other versions) and --owner is given: its owners must include one;
#   - the name is not there: a new crate, paced as above.
# After each upload the registry's checksum must be the packaged one.
#
# The tree published is a fresh clone of REV (or of HEAD plus the working tree's uncommitted
# changes), so that cargo records the commit in each crate's .cargo_vcs_info.json. Publishing
# to another registry than crates.io: cargo publishes a path dependency as a dependency on
# crates.io unless the manifest names a registry, so the clone's [workspace.dependencies] name
# the registry for the staged siblings. Nothing in the repository is changed.
#
# Test hook: PUBLISH_STAGING_FAIL_AFTER=N stops with an error after N uploads (as a lost
# connection would); hack/publish-roundtrip.sh resumes from it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}
mode=dry-run registry="" rev="" allow_dirty=0 verify=() owners=() burst="" interval=""
while (($#)); do
  case "$1" in
    --dry-run) mode=dry-run ;;
    --execute) mode=execute ;;
    --registry) registry=${2:?--registry needs a registry name}; shift ;;
    --rev) rev=${2:?--rev needs a git revision}; shift ;;
    --allow-dirty) allow_dirty=1 ;;
    --no-verify) verify=(--no-verify) ;;
    --owner) owners+=("${2:?--owner needs a login}"); shift ;;
    --new-crate-burst) burst=${2:?--new-crate-burst needs a number}; shift ;;
    --new-crate-interval) interval=${2:?--new-crate-interval needs seconds}; shift ;;
    -h|--help) usage ;;
    *) echo "publish-staging: unknown argument '$1'" >&2; usage ;;
  esac
  shift
done
say() { echo "publish-staging: $*"; }
fail() { echo "publish-staging: $*" >&2; exit 1; }
[[ -n "$registry" ]] && mode=registry
if [[ $allow_dirty == 1 && $mode == execute ]]; then
  fail "--allow-dirty is refused for crates.io: commit first"
fi
if [[ $allow_dirty == 1 && -n "$rev" ]]; then
  fail "--allow-dirty and --rev exclude each other"
fi
if [[ $mode == execute ]]; then
  [[ -n "${CARGO_REGISTRY_TOKEN:-}" ]] || fail "--execute needs CARGO_REGISTRY_TOKEN"
  ((${#owners[@]})) || fail "--execute needs --owner LOGIN (the crates.io user or team that owns the crate names)"
  burst=${burst:-5} interval=${interval:-600}
fi
for n in "$burst" "$interval"; do
  [[ -z "$n" || "$n" =~ ^[0-9]+$ ]] || fail "--new-crate-burst and --new-crate-interval take whole numbers, not '$n'"
done
[[ -z "${PUBLISH_STAGING_FAIL_AFTER:-}" || "$PUBLISH_STAGING_FAIL_AFTER" =~ ^[0-9]+$ ]] ||
  fail "PUBLISH_STAGING_FAIL_AFTER takes a whole number, not '$PUBLISH_STAGING_FAIL_AFTER'"

staged=$(hack/staged-crates.sh)
mapfile -t crates <<<"$staged"

# The tree to publish: a clone of REV (or of HEAD, plus the working tree's uncommitted changes
# to tracked files).
work=$(mktemp -d "${TMPDIR:-/tmp}/publish-staging.XXXXXX")
trap 'rm -rf "$work"' EXIT
tree="$work/tree"
if [[ -n "$rev" ]]; then
  commit=$(git rev-parse --verify --quiet "$rev^{commit}") ||
    fail "revision '$rev' is not in this clone (a shallow clone? fetch it, or the tags, first)"
else
  # A dry run takes the working tree as it is.
  [[ $mode == dry-run ]] && allow_dirty=1
  if [[ $allow_dirty == 0 && -n "$(git status --porcelain --untracked-files=no)" ]]; then
    fail "the working tree has uncommitted changes; commit first (or --allow-dirty for a test registry)"
  fi
  commit=$(git rev-parse HEAD)
fi
git clone --quiet --shared --no-checkout "$ROOT" "$tree"
git -C "$tree" checkout --quiet --detach "$commit"
dirty=()
if [[ -z "$rev" && $allow_dirty == 1 ]] && ! git diff --quiet HEAD; then
  git diff --binary HEAD | git -C "$tree" apply --whitespace=nowarn
  dirty=(--allow-dirty)
fi
cd "$tree"
# The staged crates of the revision published (an older one may have had fewer).
if [[ -n "$rev" ]]; then
  present=()
  for c in "${crates[@]}"; do
    grep -qE "^$c = \{ path" Cargo.toml && present+=("$c")
  done
  crates=("${present[@]}")
fi
args=()
for c in "${crates[@]}"; do args+=(-p "$c"); done

registry_flag=() index_flag=()
shown="crates.io"
if [[ $mode == registry ]]; then
  registry_flag=(--registry "$registry") index_flag=(--registry "$registry")
  shown="registry '$registry'"
  # The staged siblings are published as dependencies on this registry. Only the workspace's
  # manifest changes, which no package contains: cargo records the commit as clean.
  pattern=$(IFS='|'; echo "${crates[*]}")
  sed -i -E "/^($pattern) = \\{/ s/ \\}\$/, registry = \"$registry\" }/" Cargo.toml
  n=$(grep -cE "^($pattern) = \\{.*registry = \"$registry\"" Cargo.toml || true)
  ((n == ${#crates[@]})) ||
    fail "Cargo.toml's [workspace.dependencies] should list the ${#crates[@]} staged crates as '<name> = { path = …, version = … }'; found $n"
  git update-index --assume-unchanged Cargo.toml
  # The framework crates name their siblings in their own manifests (exact pins, outside the
  # workspace's table): those too.
  while read -r manifest; do
    if grep -qE "^($pattern) = \{ path" "$manifest"; then
      sed -i -E "/^($pattern) = \{ path/ s/ \}\$/, registry = \"$registry\" }/" "$manifest"
      git update-index --assume-unchanged "$manifest"
    fi
  done < <(git ls-files 'staging/*Cargo.toml')
fi

# 1. Package every crate (dependency order, as cargo publishes them) and take its checksum.
packaged="$work/package-target"
if ! CARGO_TARGET_DIR=$packaged cargo package --locked --no-verify "${dirty[@]}" "${registry_flag[@]}" \
  "${args[@]}" >"$work/package.log" 2>&1; then
  cat "$work/package.log" >&2
  fail "packaging the staged crates failed (above)"
fi
mapfile -t order < <(grep -E '^\s+Packaging ' "$work/package.log" | awk '{print $2 " " substr($3, 2)}')
((${#order[@]} == ${#crates[@]})) || { cat "$work/package.log" >&2; fail "expected ${#crates[@]} packaged crates, found ${#order[@]}"; }
declare -A local_sum
for entry in "${order[@]}"; do
  read -r name version <<<"$entry"
  local_sum[$name]=$(sha256sum "$packaged/package/$name-$version.crate" | cut -d' ' -f1)
done

# 2. The plan: every name and version looked up before anything is uploaded.
index_entry() { # NAME: the index entry (JSON lines); returns 3 when the registry has no NAME
  "$ROOT/hack/lib/registry-index.py" "${index_flag[@]}" "$1"
}
to_publish=() new_crates=() refusals=()
say "plan for $shown, from $(git rev-parse --short "$commit")$([[ ${#dirty[@]} -gt 0 ]] && echo ' with uncommitted changes'):"
for entry in "${order[@]}"; do
  read -r name version <<<"$entry"
  rc=0; entry_json=$(index_entry "$name") || rc=$?
  if ((rc == 3)); then
    say "  $name $version: new crate (the name is free)"
    to_publish+=("$name $version"); new_crates+=("$name")
    continue
  elif ((rc != 0)); then
    fail "could not look up $name in $shown (above)"
  fi
  published=$(jq -r --arg v "$version" 'select(.vers == $v) | "\(.cksum) \(.yanked)"' <<<"$entry_json")
  if [[ -n "$published" ]]; then
    read -r sum yanked <<<"$published"
    note=$([[ $yanked == true ]] && echo ' (that version is yanked)' || true)
    if [[ "$sum" == "${local_sum[$name]}" ]]; then
      say "  $name $version: already published with the same checksum, skipped$note"
      continue
    fi
    # Another checksum: the same files packaged at another commit (only .cargo_vcs_info.json
    # differs), or other sources.
    rc=0
    compared=$("$ROOT/hack/lib/registry-index.py" "${index_flag[@]}" --same-sources "$name" "$version" \
      "$packaged/package/$name-$version.crate") || rc=$?
    if ((rc == 0)); then
      say "  $name $version: already published with the same files from commit ${compared:0:12}, skipped$note"
    elif ((rc == 4)); then
      say "  $name $version: REFUSED: already published with other files ($(head -n 5 <<<"$compared" | paste -sd, - | sed 's/,/, /g')$( (($(wc -l <<<"$compared") > 5)) && echo ', …')); checksum $sum, this source packages to ${local_sum[$name]}"
      refusals+=("$name $version")
    else
      fail "could not compare $name $version with the one $shown has (above)"
    fi
    continue
  fi
  if ((${#owners[@]})); then
    listed=$(cargo owner --list "${registry_flag[@]}" "$name" 2>&1) ||
      fail "could not list the owners of $name in $shown: $listed"
    owned=0
    for o in "${owners[@]}"; do
      grep -qE "^$o( |\$)" <<<"$listed" && owned=1
    done
    if ((owned == 0)); then
      say "  $name $version: REFUSED: the name is taken, and none of ${owners[*]} owns it (owners: $(awk '{print $1}' <<<"$listed" | paste -sd, -))"
      refusals+=("$name $version")
      continue
    fi
    say "  $name $version: new version (owned by $(awk '{print $1}' <<<"$listed" | paste -sd, -))"
  else
    say "  $name $version: new version (owners not checked: no --owner)"
  fi
  to_publish+=("$name $version")
done
if ((${#refusals[@]})); then
  fail "refused: $(IFS=,; echo "${refusals[*]}" | sed 's/,/, /g'); nothing was published. A published version is never replaced: bump the version (hack/release.sh bump <version>)."
fi

if [[ $mode == dry-run ]]; then
  say "dry run: ${#to_publish[@]} of ${#order[@]} crates to publish, ${#new_crates[@]} of them new$( ((${#new_crates[@]} > 5)) && echo " (crates.io takes 5 new crates, then one per 10 minutes: --execute waits $(( (${#new_crates[@]} - 5) * 10 )) minutes)") (pass --execute with CARGO_REGISTRY_TOKEN and --owner to publish to crates.io, or --registry NAME)"
  cargo publish --locked --dry-run --allow-dirty "${args[@]}"
  exit 0
fi
if ((${#to_publish[@]} == 0)); then
  say "nothing to publish: $shown has all ${#order[@]} crates at these versions"
  exit 0
fi

# 3. Upload, one crate at a time; new names paced.
uploaded=0 new_uploaded=0 last_new=0
for entry in "${to_publish[@]}"; do
  read -r name version <<<"$entry"
  if [[ " ${new_crates[*]} " == *" $name "* && -n "$burst" ]]; then
    if ((new_uploaded >= burst)); then
      wait_s=$((last_new + interval - $(date +%s)))
      if ((wait_s > 0)); then
        say "$shown takes $burst new crates in a burst, then one per $interval s: waiting $wait_s s before $name"
        sleep "$wait_s"
      fi
    fi
  fi
  say "uploading $name $version"
  if ! cargo publish --locked "${verify[@]}" "${dirty[@]}" "${registry_flag[@]}" -p "$name" >"$work/publish.log" 2>&1; then
    cat "$work/publish.log" >&2
    grep -q '429' "$work/publish.log" &&
      fail "$shown refused $name for now (rate limit, above): run the same command again later; the $uploaded crates uploaded so far are skipped then"
    fail "publishing $name $version failed (above); run the same command again to resume ($uploaded uploaded by this run)"
  fi
  if [[ " ${new_crates[*]} " == *" $name "* ]]; then
    new_uploaded=$((new_uploaded + 1)); last_new=$(date +%s)
  fi
  sum=$(index_entry "$name" | jq -r --arg v "$version" 'select(.vers == $v) | .cksum')
  [[ "$sum" == "${local_sum[$name]}" ]] ||
    fail "$shown has $name $version with checksum '${sum:-none}', not the packaged ${local_sum[$name]}: the package is not reproducible, or someone else published it"
  uploaded=$((uploaded + 1))
  if [[ -n "${PUBLISH_STAGING_FAIL_AFTER:-}" ]] && ((uploaded >= PUBLISH_STAGING_FAIL_AFTER && uploaded < ${#to_publish[@]})); then
    fail "stopped after $uploaded uploads (PUBLISH_STAGING_FAIL_AFTER=$PUBLISH_STAGING_FAIL_AFTER, a test hook); run the same command again to resume"
  fi
done
say "published $uploaded crates to $shown ($((${#order[@]} - uploaded)) already there)"
