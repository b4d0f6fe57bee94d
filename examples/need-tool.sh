# Sourced by the example scripts: `need_tool NAME [PACKAGE]` installs Debian's package PACKAGE
# (default NAME) with apt-get if the command NAME is missing (as root, or through sudo without a
# password).
need_tool() {
  command -v "$1" >/dev/null && return
  local package=${2:-$1}
  echo "$1 not found: installing it (apt-get install $package)" >&2
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo -n"
  timeout 300 $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive timeout 300 $sudo apt-get install -y -qq "$package" >/dev/null
}
