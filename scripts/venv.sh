# Sourced by demo.sh and test.sh (from the repository root): makes the
# virtual environment .venv (COLIBRI_VENV=DIR: another folder) and puts it
# first on PATH, so pip installs there and never into the system's Python
# (PEP 668: Debian 12/13 and Ubuntu 24.04 refuse that, "externally-managed-environment").
# Sets $py to the environment's python.
venv="${COLIBRI_VENV:-.venv}"
venv_say() { echo "venv: $*" >&2; }
if [ ! -x "$venv/bin/python" ]; then
  # A folder that is there and is not an environment is the user's: never
  # make one inside it, nor remove it when that fails.
  if [ -e "$venv" ] && [ -n "$(ls -A "$venv" 2>/dev/null)" ]; then
    venv_say "$venv exists and is not a virtual environment (no $venv/bin/python); move it, or set COLIBRI_VENV to another folder"
    exit 1
  fi
  command -v python3 >/dev/null || { venv_say "python3 is missing (install it with your package manager)"; exit 1; }
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
    { venv_say "Python >= 3.10 is needed; python3 is $(python3 -V 2>&1)"; exit 1; }
  venv_say "creating the virtual environment $venv with $(command -v python3) ($(python3 -V 2>&1))..."
  # Debian and Ubuntu ship venv's pip bootstrap (ensurepip) in a separate
  # package; without it 'python3 -m venv' fails halfway, leaving a folder without pip.
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    rm -rf "$venv"   # what the failed venv made: the folder was absent or empty
    pkg="python3-venv"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      venv_say "installing $pkg with apt-get..."
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null
      python3 -m venv "$venv" || { rm -rf "$venv"; venv_say "python3 -m venv $venv failed after installing $pkg"; exit 1; }
    else
      venv_say "'python3 -m venv' failed: install $pkg (sudo apt-get install $pkg), or run as root"
      exit 1
    fi
  fi
fi
py="$PWD/$venv/bin/python"
[ "${venv#/}" = "$venv" ] || py="$venv/bin/python"
export VIRTUAL_ENV="${py%/bin/python}"
export PATH="$VIRTUAL_ENV/bin:$PATH"
