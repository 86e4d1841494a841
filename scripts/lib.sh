# Sourced by scripts/run, scripts/test and scripts/install: build with the calling
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
