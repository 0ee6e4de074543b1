#!/usr/bin/env bash
# Installs the project's peers: real third-party engines (Mooncake's wheel first) that the peer tests
# and benchmarks run beside kvpool. Each peer is a folder peers/NAME/ with requirements.txt (every
# package pinned with ==, transitive ones included) and an optional peer.conf (the interpreter, whether
# the venv sees Debian's site packages, the Debian libraries it loads, the checks after install; see
# peers/mooncake/peer.conf). Each gets a venv of its own, .peers/NAME/venv (git-ignored), since the
# pins of two peers may conflict. PyPI is used here, through pip, for these pins only.
#
#   scripts/peers.sh install [NAME...]   install the peers named (default: every one under peers/):
#       the Debian packages listed when missing, then the venv and the pins. A venv whose stamp (a
#       hash of the peer's files, the interpreter and the venv's path) matches is kept as it is
#       (quiet); any other is rebuilt from scratch. Output of venv and pip goes to .peers/NAME/install.log.
#   scripts/peers.sh python NAME         print the interpreter of NAME's venv (exit 3 if not installed)
#   scripts/peers.sh --check NAME        exit 0 if NAME's venv is installed and up to date, 3 if not
#   scripts/peers.sh list                print the peers' names
#
# A peer whose peer.conf says `base=OTHER` is installed after OTHER, and its venv sees OTHER's
# site-packages through a .pth file (after its own), so that a large set both need (PyPI's torch, a
# CUDA build of several GB) is installed once: see peers/torch. A change to OTHER rebuilds both.
#
# A peer that is not Python (llm-d's Go indexer: peers/llm-d) is built by peer.conf's `build=` commands,
# run after pip and before the verify commands, with the venv's bin first on PATH, PEER_DIR set to the
# peer's definition folder (peers/NAME) and PEER_HOME to .peers/NAME; what they build goes under
# PEER_HOME (into the venv, so that a rebuilt venv rebuilds it too). The stamp covers every file under
# peers/NAME, subfolders included, so a changed source file, go.mod or go.sum rebuilds it.
#
# A peer that cannot be installed is a failure (exit 1) whose message names the peer and the step:
# the interpreter, a Debian package, the venv, pip (with the last lines of its log), the pins'
# completeness (pip check), a build command, or a verify command. Never a skip.
#
# Exit status: 0 ok, 1 failure, 2 usage (or an unknown peer), 3 not installed (python, --check).
#
# Environment: PEERS_DIR the peers' definitions (default peers/ of this repository), PEERS_HOME where
# the venvs go (default .peers/ of this repository), PEERS_LOCK_TIMEOUT seconds to wait for another
# install of the same peer (default 900).
set -euo pipefail

PROG=$(basename "$0")

# die, as_root, install_debian_package
source "$(dirname "${BASH_SOURCE[0]}")/lib/debian.sh"

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PEERS_DIR=${PEERS_DIR:-$root/peers}
PEERS_HOME=${PEERS_HOME:-$root/.peers}
# Bumped when what an install does changes, so that existing venvs are rebuilt.
STAMP_FORMAT=1

usage() {
    cat >&2 <<EOF
usage: $PROG install [NAME...]
       $PROG python NAME
       $PROG --check NAME
       $PROG list
EOF
    exit 2
}

# The peers: folders of PEERS_DIR that hold a requirements.txt.
peer_names() {
    local d
    for d in "$PEERS_DIR"/*/; do
        [[ -f $d/requirements.txt ]] && basename "$d"
    done
    return 0
}

# known_peer NAME: a usage error unless NAME is a peer.
known_peer() {
    local name=$1
    if [[ ! $name =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ || ! -f $PEERS_DIR/$name/requirements.txt ]]; then
        echo "$PROG: unknown peer '$name' (peers in $PEERS_DIR: $(peer_names | tr '\n' ' '))" >&2
        exit 2
    fi
}

# fail NAME STEP MESSAGE [LOG]: the failure of one step of one peer's install, with the last lines of
# LOG when given.
fail() {
    local name=$1 step=$2 msg=$3 log=${4:-}
    if [[ -n $log && -s $log ]]; then
        echo "--- last lines of $log ---" >&2
        tail -n 25 "$log" >&2
        echo "---" >&2
    fi
    die "peer $name: $step failed: $msg"
}

# load_conf NAME: sets conf_python, conf_system_site, conf_base, conf_unmet (array), conf_debian
# (array), conf_pip_args (array), conf_build (array), conf_verify (array) from peers/NAME/peer.conf
# (defaults when there is none).
load_conf() {
    local name=$1 conf=$PEERS_DIR/$1/peer.conf line key value n=0
    conf_python=/usr/bin/python3
    conf_system_site=no
    conf_base=
    conf_unmet=()
    conf_debian=()
    conf_pip_args=()
    conf_build=()
    conf_verify=()
    [[ -f $conf ]] || return 0
    while IFS= read -r line || [[ -n $line ]]; do
        n=$((n + 1))
        [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
        [[ $line == *=* ]] || fail "$name" "reading peer.conf" "$conf line $n is not KEY=VALUE: $line"
        key=${line%%=*}
        key=${key//[[:space:]]/}
        value=${line#*=}
        case $key in
            python) conf_python=$value ;;
            system_site_packages)
                [[ $value == yes || $value == no ]] \
                    || fail "$name" "reading peer.conf" "$conf line $n: system_site_packages must be yes or no, got '$value'"
                conf_system_site=$value ;;
            base)
                [[ $value != "$name" && $value =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ && -f $PEERS_DIR/$value/requirements.txt ]] \
                    || fail "$name" "reading peer.conf" "$conf line $n: base '$value' is not another peer under $PEERS_DIR"
                conf_base=$value ;;
            debian) read -r -a conf_debian <<<"$value" ;;
            unmet) read -r -a conf_unmet <<<"$value" ;;
            pip_args) read -r -a conf_pip_args <<<"$value" ;;
            build) conf_build+=("$value") ;;
            verify) conf_verify+=("$value") ;;
            *) fail "$name" "reading peer.conf" "$conf line $n: unknown key '$key'" ;;
        esac
    done <"$conf"
}

# check_pins NAME: every requirement is an exact pin (NAME==VERSION, extras and a marker allowed).
check_pins() {
    local name=$1 req=$PEERS_DIR/$1/requirements.txt line n=0 count=0
    while IFS= read -r line || [[ -n $line ]]; do
        n=$((n + 1))
        line=${line%%#*}
        [[ $line =~ ^[[:space:]]*$ ]] && continue
        [[ $line =~ ^[[:space:]]*[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]*\])?==[A-Za-z0-9.+!_-]+[[:space:]]*(;.*)?$ ]] \
            || fail "$name" "reading requirements.txt" "$req line $n is not an exact pin (NAME==VERSION): $line"
        count=$((count + 1))
    done <"$req"
    ((count > 0)) || fail "$name" "reading requirements.txt" "$req pins nothing"
}

# The normalized names (PEP 503) of the packages a peer pins (its base's included), one a line.
pinned_names() {
    local files=("$PEERS_DIR/$1/requirements.txt")
    [[ -n ${2:-} ]] && files+=("$PEERS_DIR/$2/requirements.txt")
    sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' -e 's/[[;=].*//' "${files[@]}" \
        | tr 'A-Z' 'a-z' | sed -E 's/[-_.]+/-/g'
}

# The site-packages folder of an installed peer's venv.
site_packages() {
    "$PEERS_HOME/$1/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
}

deb_installed() {
    [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]
}

# The Debian packages a peer lists that are not installed.
missing_debian() {
    local p out=()
    for p in "${conf_debian[@]}"; do
        deb_installed "$p" || out+=("$p")
    done
    echo "${out[@]:-}"
}

# stamp NAME: what the venv was built from: the peer's files, the interpreter, the venv's path.
stamp() {
    local name=$1
    {
        echo "format $STAMP_FORMAT"
        echo "home $PEERS_HOME/$name"
        echo "python $conf_python"
        "$conf_python" -VV 2>&1 || true
        [[ -z $conf_base ]] || echo "base $conf_base $(cat "$PEERS_HOME/$conf_base/stamp" 2>/dev/null)"
        (cd "$PEERS_DIR/$name" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum)
    } | sha256sum | cut -d' ' -f1
}

up_to_date() {
    local name=$1 home=$PEERS_HOME/$1
    [[ -f $home/stamp && -x $home/venv/bin/python ]] || return 1
    # the base as its files now say, not only as it was when this venv was built
    if [[ -n $conf_base ]]; then
        local base=$conf_base
        (load_conf "$base" && up_to_date "$base") || return 1
    fi
    [[ $(cat "$home/stamp") == "$(stamp "$name")" ]] || return 1
    [[ -z $(missing_debian) ]] || return 1
    "$home/venv/bin/python" -c '' >/dev/null 2>&1
}

# The Debian packages the peer lists, when missing (install_debian_package runs in a subshell, so
# that its "cannot be had here" exit becomes this peer's failure).
install_debian() {
    local name=$1 p
    for p in $(missing_debian); do
        echo "$PROG: peer $name: installing Debian package $p" >&2
        (install_debian_package "$p") || fail "$name" "Debian package $p" "apt-get could not install it (see above)"
        deb_installed "$p" || fail "$name" "Debian package $p" "still not installed after apt-get install"
    done
}

# The venv module and ensurepip of the interpreter (Debian splits them into python3-venv).
ensure_venv_module() {
    local name=$1 py=$conf_python pkg
    "$py" -c 'import venv, ensurepip' >/dev/null 2>&1 && return 0
    [[ $py == /usr/bin/python3* ]] || fail "$name" "venv" "$py has no venv/ensurepip module"
    pkg=python3-venv
    [[ $(basename "$py") =~ ^python3\.[0-9]+$ ]] && pkg="$(basename "$py")-venv"
    echo "$PROG: peer $name: $py has no venv module, installing Debian package $pkg" >&2
    (install_debian_package "$pkg") || fail "$name" "Debian package $pkg" "apt-get could not install it (see above)"
    "$py" -c 'import venv, ensurepip' >/dev/null 2>&1 || fail "$name" "venv" "$py still has no venv/ensurepip module after installing $pkg"
}

# pip check, kept to what the peer pins (Debian's own packages, seen through --system-site-packages,
# have broken requirements of their own that are none of ours), less the requirements peer.conf's
# `unmet` names on purpose (a GPU-only package left out, a +cpu local version PyPI does not serve).
check_complete() {
    local name=$1 venv=$2 log=$3 out bad
    out=$("$venv/bin/python" -m pip check 2>&1 || true)
    printf '%s\n' "$out" >>"$log"
    bad=$(printf '%s\n' "$out" | awk -v names="$(pinned_names "$name" "$conf_base" | tr '\n' ' ')" \
        -v unmet="$(printf '%s\n' "${conf_unmet[@]:-}" | tr 'A-Z' 'a-z' | sed -E 's/[-_.]+/-/g' | tr '\n' ' ')" '
        function norm(x) { x = tolower(x); gsub(/[-_.]+/, "-", x); return x }
        BEGIN { n = split(names, a, " "); for (i = 1; i <= n; i++) pinned[a[i]] = 1
                n = split(unmet, u, " "); for (i = 1; i <= n; i++) allowed[u[i]] = 1 }
        { k = norm($1); if (!(k in pinned)) next
          # "X V requires Y, which is not installed." / "X V has requirement Y==W; marker, but you have Y Z."
          req = ($3 == "requires") ? $4 : $5; sub(/[,;=<>!~\[].*/, "", req)
          if (!(norm(req) in allowed)) print }')
    [[ -z $bad ]] || fail "$name" "pins (pip check)" "requirements.txt is incomplete or inconsistent: $(echo "$bad" | tr '\n' ';')"
}

# install_one NAME [as-base]
install_one() {
    local name=$1 home=$PEERS_HOME/$1 req=$PEERS_DIR/$1/requirements.txt
    local venv=$home/venv log=$home/install.log started=$SECONDS cmd lock
    load_conf "$name"
    if [[ -n $conf_base && -n ${2:-} ]]; then
        fail "$name" "reading peer.conf" "a base peer may not have a base of its own (base=$conf_base)"
    fi
    if [[ -n $conf_base ]]; then
        # the base first (in a subshell: its load_conf would overwrite this peer's settings)
        (install_one "$conf_base" as-base) || fail "$name" "base $conf_base" "the base peer could not be installed (see above)"
    fi
    check_pins "$name"
    [[ -x $conf_python ]] || fail "$name" "interpreter" "$conf_python (peer.conf python) is not an executable"
    mkdir -p "$home" || fail "$name" "venv" "cannot create $home"
    # One install of a peer at a time (two test runs at once); the second finds the first's venv.
    exec {lock}>"$home/.lock"
    flock -w "${PEERS_LOCK_TIMEOUT:-900}" "$lock" || fail "$name" "lock" "another install of this peer held $home/.lock too long"
    if up_to_date "$name"; then
        exec {lock}>&-
        return 0
    fi
    echo "$PROG: installing peer $name into $venv" >&2
    install_debian "$name"
    ensure_venv_module "$name"
    rm -f "$home/stamp"
    rm -rf "$venv"
    {
        echo "=== $(date -u +%FT%TZ) $PROG install $name"
    } >"$log"
    local venv_args=()
    [[ $conf_system_site == yes ]] && venv_args+=(--system-site-packages)
    "$conf_python" -m venv "${venv_args[@]}" "$venv" >>"$log" 2>&1 \
        || fail "$name" "venv" "$conf_python -m venv ${venv_args[*]} $venv" "$log"
    if [[ -n $conf_base ]]; then
        local base_site
        base_site=$(site_packages "$conf_base") || fail "$name" "base $conf_base" "no site-packages in $PEERS_HOME/$conf_base/venv"
        echo "$base_site" >"$(site_packages "$name")/kvpool-base-$conf_base.pth"
    fi
    # --no-deps: exactly the pins; check_complete then fails if they left a requirement out.
    PYTHONNOUSERSITE=1 "$venv/bin/python" -m pip install --no-input --disable-pip-version-check --no-deps \
        "${conf_pip_args[@]}" -r "$req" >>"$log" 2>&1 \
        || fail "$name" "pip" "pip install --no-deps -r $req exited non-zero (the last lines of its log are above)" "$log"
    check_complete "$name" "$venv" "$log"
    for cmd in "${conf_build[@]}"; do
        echo "=== build: $cmd" >>"$log"
        (cd "$home" && PATH="$venv/bin:$PATH" VIRTUAL_ENV=$venv PYTHONNOUSERSITE=1 PEER_DIR="$PEERS_DIR/$name" \
            PEER_HOME="$home" bash -c "$cmd") >>"$log" 2>&1 \
            || fail "$name" "build" "'$cmd' failed" "$log"
    done
    for cmd in "${conf_verify[@]}"; do
        echo "=== verify: $cmd" >>"$log"
        (cd "$home" && PATH="$venv/bin:$PATH" VIRTUAL_ENV=$venv PYTHONNOUSERSITE=1 bash -c "$cmd") >>"$log" 2>&1 \
            || fail "$name" "verify" "'$cmd' failed after install" "$log"
    done
    stamp "$name" >"$home/stamp"
    exec {lock}>&-
    echo "$PROG: peer $name installed in $((SECONDS - started))s" >&2
}

main() {
    (($# >= 1)) || usage
    local cmd=$1 name
    shift
    case $cmd in
        install)
            local names=("$@")
            if ((${#names[@]} == 0)); then
                mapfile -t names < <(peer_names)
                ((${#names[@]} > 0)) || die "no peers under $PEERS_DIR"
            fi
            for name in "${names[@]}"; do known_peer "$name"; done
            for name in "${names[@]}"; do install_one "$name"; done
            ;;
        python)
            (($# == 1)) || usage
            known_peer "$1"
            if [[ ! -x $PEERS_HOME/$1/venv/bin/python || ! -f $PEERS_HOME/$1/stamp ]]; then
                echo "$PROG: peer $1 is not installed: run $PROG install $1" >&2
                exit 3
            fi
            echo "$PEERS_HOME/$1/venv/bin/python"
            ;;
        --check)
            (($# == 1)) || usage
            known_peer "$1"
            load_conf "$1"
            if ! up_to_date "$1"; then
                echo "$PROG: peer $1 is not installed or out of date: run $PROG install $1" >&2
                exit 3
            fi
            ;;
        list)
            (($# == 0)) || usage
            peer_names
            ;;
        -h | --help | help) usage ;;
        *)
            echo "$PROG: unknown command '$cmd'" >&2
            usage
            ;;
    esac
}

main "$@"
