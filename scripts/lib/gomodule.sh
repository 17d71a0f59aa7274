# shellcheck shell=bash
# Builds the programs of a pinned Go module into a keyed cache outside the checkout: one
# definition for the Go builds of the suite (scripts/lib/cluster-build.sh for
# scripts/kube-cluster.sh: Kubernetes, containerd, nerdctl; scripts/oci-conformance.sh:
# runtime-tools' validation programs), so that each entry is found, locked, built, checked
# and pruned the same way. The sourcing script defines
# `die MESSAGE` (prints it with its own prefix, exits 1) and `log MESSAGE` (stderr).

# gomodule_go: the path of the Go toolchain (go on PATH, else /usr/local/go/bin/go).
gomodule_go() {
  local g
  for g in "$(command -v go 2>/dev/null || true)" /usr/local/go/bin/go; do
    if [ -n "$g" ] && [ -x "$g" ]; then
      echo "$g"
      return
    fi
  done
  die "no Go toolchain found (go on PATH or /usr/local/go/bin/go): run scripts/install-deps.sh"
}

# gomodule_release DIR MODULE: the version of MODULE that DIR/go.mod requires (empty if none).
gomodule_release() {
  awk -v m="$2" '$1 == m { print $2; exit }' "$1/go.mod"
}

# gomodule_key GO DIR [FILE...] -- [LINE...]: a cache key (16 hex digits) over the sources
# and the recipe: the sha256 of FILE... in DIR (none named: every *.go, go.mod and go.sum
# under DIR), then each LINE (ldflags, environment, binary names: whatever changes the
# result), then `GO version`.
gomodule_key() {
  local go="$1" dir="$2"
  shift 2
  local files=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    files+=("$1")
    shift
  done
  [ $# -eq 0 ] || shift
  {
    if [ ${#files[@]} -eq 0 ]; then
      (cd "$dir" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) | LC_ALL=C sort | xargs sha256sum)
    else
      (cd "$dir" && sha256sum "${files[@]}")
    fi
    [ $# -eq 0 ] || printf '%s\n' "$@"
    "$go" version
  } | sha256sum | cut -c1-16
}

# gomodule_ms_since NS: milliseconds since NS (`date +%s%N`).
gomodule_ms_since() {
  echo $((($(date +%s%N) - $1) / 1000000))
}

# gomodule_build OPTION... -- GO_BUILD_ARG...: prints ROOT/ENTRY/bin, where
# `GO build -o ROOT/ENTRY/bin/ GO_BUILD_ARG...`, run in SRC, put every BIN. A cache hit costs
# the test for the binaries; a miss builds under ROOT/.lock (one build per cache at a time: a
# second caller waits, then finds the entry) into a temporary directory that becomes the
# entry whole, and removes the entries of sources no longer checked out.
#   --go GO             the Go toolchain (gomodule_go)
#   --cache ROOT        the cache root, created when missing
#   --cache-var NAME    the environment variable that sets ROOT (named when ROOT is not writable)
#   --entry NAME        the entry's directory under ROOT: carries the release and the key
#   --bin NAME          a binary the entry's bin/ holds (repeat for each)
#   --src DIR           the Go module the build runs in (its go.mod pins what is built)
#   --env VAR=VALUE     environment of the build (repeatable)
#   --what TEXT         logged as "building TEXT into ENTRY (first run only)"
#   --failed TEXT       on a failed build: "building TEXT from SRC failed (see above)"
#   --post FUNCTION     called with the temporary entry after the build, for files beside bin/
#   --timed LABEL       log the lookup's cost too: "LABEL cached in ENTRY (warm: N ms)", and a
#                       build as "LABEL built in N s (cold)" (default: "built in N s")
#   --since NS          where --timed starts counting (`date +%s%N`; default: this call)
gomodule_build() {
  local go="" root="" root_var="" entry="" src="" what="" failed="" post="" timed="" since=""
  local bins=() envs=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --) shift; break ;;
      --go | --cache | --cache-var | --entry | --bin | --src | --env | --what | --failed | --post | --timed | --since)
        [ $# -ge 2 ] || die "gomodule_build: $1 needs a value"
        case "$1" in
          --go) go="$2" ;;
          --cache) root="$2" ;;
          --cache-var) root_var="$2" ;;
          --entry) entry="$2" ;;
          --bin) bins+=("$2") ;;
          --src) src="$2" ;;
          --env) envs+=("$2") ;;
          --what) what="$2" ;;
          --failed) failed="$2" ;;
          --post) post="$2" ;;
          --timed) timed="$2" ;;
          --since) since="$2" ;;
        esac
        shift 2 ;;
      *) die "gomodule_build: unknown option '$1' (accepted: --go, --cache, --cache-var, --entry, --bin, --src, --env, --what, --failed, --post, --timed, --since, --)" ;;
    esac
  done
  [ -n "$go" ] && [ -n "$root" ] && [ -n "$entry" ] && [ -n "$src" ] && [ ${#bins[@]} -gt 0 ] ||
    die "gomodule_build: --go, --cache, --entry, --src and at least one --bin are required"
  [ -n "$since" ] || since=$(date +%s%N)
  local dir="$root/$entry"
  if gomodule_complete "$dir/bin" "${bins[@]}"; then
    [ -z "$timed" ] || log "$timed cached in $dir (warm: $(gomodule_ms_since "$since") ms)"
    echo "$dir/bin"
    return
  fi
  mkdir -p "$root" || die "cannot create the cache $root (set ${root_var:-the cache root} to a writable directory)"
  local lock
  exec {lock}>"$root/.lock"
  flock "$lock"
  if ! gomodule_complete "$dir/bin" "${bins[@]}"; then
    local tmp start
    tmp="$(mktemp -d "$root/.build.XXXXXX")"
    chmod 755 "$tmp"
    start=$(date +%s)
    log "building ${what:-$entry} into $dir (first run only)"
    if ! (cd "$src" && env "${envs[@]}" "$go" build -o "$tmp/bin/" "$@") >&2; then
      rm -rf "$tmp"
      die "building ${failed:-$entry} from $src failed (see above)"
    fi
    if [ -n "$post" ] && ! "$post" "$tmp"; then
      rm -rf "$tmp"
      die "completing the entry $dir after building ${failed:-$entry} from $src failed (see above)"
    fi
    # An incomplete entry (a build interrupted before this scheme) is replaced whole.
    rm -rf "$dir"
    mv "$tmp" "$dir"
    # Older entries are for sources no longer checked out here: drop them.
    find "$root" -mindepth 1 -maxdepth 1 -type d ! -path "$dir" -exec rm -rf {} +
    if [ -n "$timed" ]; then
      log "$timed built in $(($(gomodule_ms_since "$since") / 1000)) s (cold)"
    else
      log "built in $(($(date +%s) - start)) s"
    fi
  fi
  flock -u "$lock"
  exec {lock}>&-
  gomodule_complete "$dir/bin" "${bins[@]}" || die "$dir/bin lacks some of ${bins[*]} after the build"
  echo "$dir/bin"
}

# gomodule_complete DIR BIN...: every BIN is an executable in DIR.
gomodule_complete() {
  local d="$1" b
  shift
  for b in "$@"; do
    [ -x "$d/$b" ] || return 1
  done
}
