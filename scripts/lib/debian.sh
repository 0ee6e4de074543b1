# Sourced by the scripts that install a Debian package the first time they need it (etcd.sh,
# redis.sh, chromium.sh, prometheus.sh), after they set PROG (their name, for messages).

# die MESSAGE: a failure; exit status 1.
die() {
    printf '%s: %s\n' "$PROG" "$*" >&2
    exit 1
}

# die_unavailable MESSAGE: exit status 3, "this tool cannot be had here" (callers may skip rather
# than fail).
die_unavailable() {
    printf '%s: %s\n' "$PROG" "$*" >&2
    exit 3
}

# as_root CMD...: runs a command as root: directly when we are root, through sudo when it is there;
# otherwise says which package to install by hand (DEBIAN_PACKAGE, set by install_debian_package).
as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die_unavailable "${DEBIAN_PACKAGE:-a package} is not installed and we are not root (no sudo either):" \
            "install Debian's ${DEBIAN_PACKAGE:-package} (apt-get install ${DEBIAN_PACKAGE:-...}) and rerun"
    fi
}

# install_debian_package PACKAGE [APT_OPTION...]: apt-get install PACKAGE, non-interactively. The
# package lists are refreshed first only when they were never fetched, and once more if the install
# fails with stale ones. Another apt-get holding the lock (a parallel install) is waited for, up to
# 10 minutes. Any failure ends the script through die_unavailable, naming what to do by hand.
install_debian_package() {
    DEBIAN_PACKAGE=$1
    shift
    command -v apt-get >/dev/null 2>&1 \
        || die_unavailable "$DEBIAN_PACKAGE is not installed and apt-get is not available: install it and rerun"
    if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
        as_root apt-get update -q >&2 || die_unavailable "apt-get update failed: install $DEBIAN_PACKAGE (Debian package) by hand"
    fi
    if ! _apt_get_install "$@"; then
        as_root apt-get update -q >&2 || die_unavailable "apt-get update failed: install $DEBIAN_PACKAGE (Debian package) by hand"
        _apt_get_install "$@" || die_unavailable "apt-get install $DEBIAN_PACKAGE failed: install it by hand"
    fi
}

_apt_get_install() {
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=600 "$@" \
        "$DEBIAN_PACKAGE" >&2
}
