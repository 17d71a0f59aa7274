# Shell helper shared by the build scripts that copy build outputs (sourced, not run).

# install_atomic SRC DEST: puts a copy of SRC at DEST (a file, or a directory to put it in
# under SRC's name) without writing into the file already there: the copy goes to a
# temporary name in DEST's directory, is flushed to disk and renamed over DEST. `cp` onto a
# program that is running fails with "Text file busy", and onto a library that is loaded
# rewrites the pages its processes run from; after the rename they keep the old file, and
# whoever opens DEST next finds a whole new one, never a half-written one. On failure
# (status 1) DEST is as it was and no temporary file is left.
install_atomic() {
  local src=$1 dest=$2 dir tmp
  [ -d "$dest" ] && dest="$dest/$(basename -- "$src")"
  dir=$(dirname -- "$dest")
  tmp=$(mktemp -- "$dir/.$(basename -- "$dest").XXXXXX") || return 1
  if cp -- "$src" "$tmp" && chmod --reference="$src" -- "$tmp" && sync -- "$tmp" \
    && mv -fT -- "$tmp" "$dest"; then
    return 0
  fi
  rm -f -- "$tmp"
  echo "install_atomic: cannot install $src as $dest" >&2
  return 1
}
