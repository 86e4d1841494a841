# Sourced by every script: what they share. Build with the calling
# user's Rust toolchain, act as root. They work as typed from a root shell, from a
# user with sudo, and as `sudo scripts/...` (where sudo's secure_path has dropped
# ~/.cargo/bin, the build runs as the user who called sudo).

die() {
  echo "$(basename "$0"): $*" >&2
  exit 1
}

# Runs cargo with the arguments given: as this user when cargo is on PATH; as the user
# who called sudo when this is `sudo scripts/...` and only that user has a toolchain.
build() {
  if command -v cargo >/dev/null 2>&1; then
    cargo "$@"
  elif [ "$(id -u)" = 0 ] && [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
    local home
    home=$(getent passwd "$SUDO_USER" | cut -d: -f6)
    [ -x "$home/.cargo/bin/cargo" ] ||
      die "cargo is not on root's PATH, and $SUDO_USER has no ~/.cargo/bin/cargo; install Rust (https://rustup.rs)"
    runuser -u "$SUDO_USER" -- env PATH="$home/.cargo/bin:$PATH" HOME="$home" cargo "$@"
  else
    die "cargo is not on PATH; install Rust (https://rustup.rs), then open a new shell or run: . \"\$HOME/.cargo/env\""
  fi
}

# Runs the command given as root: directly when this is root, else through sudo.
as_root() {
  if [ "$(id -u)" = 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "this needs root (it mounts file systems): run it from a root shell (su -), or install sudo"
  fi
}

# Installs Debian packages, quietly.
apt_install() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# Builds the unit and integration test programs (the test profile's artifacts) and
# writes their paths to the file LIST, one per line.
test_programs() {
  local list=$1
  mkdir -p "$(dirname "$list")"
  build test --all-targets --no-run --message-format=json-render-diagnostics |
    grep '"reason":"compiler-artifact"' | grep -E '"profile":\{[^}]*"test":true' |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' >"$list.new"
  mv "$list.new" "$list"
  [ -s "$list" ] || die "cargo built no test programs"
}

# Makes a sparse ext4 image IMG of SIZE (truncate's units) and, with DIR, mounts it
# there through a loop device with the mount options OPTS (after `loop,`). A sparse
# image on a file system without room for it fails its writes once that file system
# is full, and the ext4 inside turns read-only in the middle of whatever runs on it;
# so an image is only made where SIZE is free.
ext4_image() {
  local img=$1 size=$2 dir=${3:-} opts=${4:-} need free
  rm -f "$img"
  need=$(numfmt --from=iec "${size^^}")
  free=$(df -B1 --output=avail "$(dirname "$img")" | tail -n 1 | tr -d ' ')
  [ "$free" -ge "$need" ] ||
    die "no room for the $size image $img: $(dirname "$img") has $(numfmt --to=iec "$free") free; free space there (old test directories in ${TMPDIR:-/tmp}?) or give it less"
  truncate -s "$size" "$img"
  mkfs.ext4 -q -F "$img"
  if [ -n "$dir" ]; then
    mkdir -p "$dir"
    mount -o "loop${opts:+,$opts}" "$img" "$dir"
  fi
}

# The entries of a known-failure FILE (columns: a test or a pattern of tests, the
# views it applies to: `all` or a comma-separated list, the reason) that apply to
# VIEW, one per line.
known_failures() {
  local file=$1 view=$2
  awk -v v="$view" '$1 !~ /^#/ && NF >= 2 && ($2 == "all" || index("," $2 ",", "," v ",")) {print $1}' "$file"
}
