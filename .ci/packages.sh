# shellcheck shell=bash
# install_packages "PACKAGE [COMMAND]"...: install the Debian packages whose
# command (the package's name unless given) is missing. Sourced by .ci/run,
# whose CI_PACKAGES lists what its steps need; usable on its own too:
#   bash -c '. .ci/packages.sh && install_packages "pgbouncer"'
#
# Nothing to do, and no apt-get update, when every command is there. Else it
# needs root and apt-get, and says so when it has neither. One apt-get update,
# then one non-interactive install without recommends. The packages' services
# must not start: while apt-get runs, /usr/sbin/policy-rc.d answers 101
# ("action forbidden"), which invoke-rc.d and deb-systemd-invoke obey; a
# policy file that was there before is put back afterwards (restore_policy,
# which .ci/run's exit trap also calls, in case the install is cut short).
POLICY_RC=/usr/sbin/policy-rc.d
POLICY_SAVED=""
POLICY_OURS=""
restore_policy() {
    [ -n "$POLICY_OURS" ] || return 0
    if [ -n "$POLICY_SAVED" ]; then mv -f "$POLICY_SAVED" "$POLICY_RC"; else rm -f "$POLICY_RC"; fi
    POLICY_OURS="" POLICY_SAVED=""
}
# The packages among "$@" whose command is missing, one per line.
missing_packages() {
    local entry pkg cmd
    for entry in "$@"; do
        read -r pkg cmd <<<"$entry"
        PATH="$PATH:/usr/sbin:/sbin" command -v "${cmd:-$pkg}" >/dev/null 2>&1 || echo "$pkg"
    done
}
install_packages() {
    local missing=() still rc=0 log="${CI_APT_LOG:-var/ci-apt.log}"
    mapfile -t missing < <(missing_packages "$@")
    if [ "${#missing[@]}" -eq 0 ]; then
        echo "all present: $(printf '%s\n' "$@" | cut -d' ' -f1 | xargs)"
        return 0
    fi
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        printf 'missing Debian packages: %s\n' "${missing[*]}" >&2
        printf 'this step installs them only as root on a machine with apt-get; install them\n' >&2
        printf 'yourself (sudo apt-get install -y %s) and run .ci/run again.\n' "${missing[*]}" >&2
        return 1
    fi
    echo "installing: ${missing[*]} (apt-get output in $log)"
    mkdir -p "$(dirname "$log")"
    if [ -e "$POLICY_RC" ]; then POLICY_SAVED="$(mktemp)"; cp -p "$POLICY_RC" "$POLICY_SAVED"; fi
    POLICY_OURS=1
    printf '#!/bin/sh\n# Written by .ci/run while it installs packages: start no service.\nexit 101\n' >"$POLICY_RC"
    chmod 755 "$POLICY_RC"
    {
        export DEBIAN_FRONTEND=noninteractive
        apt-get -o DPkg::Lock::Timeout=300 update -q &&
            apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${missing[@]}"
    } </dev/null >"$log" 2>&1 || rc=$?
    restore_policy
    if [ "$rc" -ne 0 ]; then
        tail -n 20 "$log" >&2
        printf 'apt-get failed (exit %s); the whole output is in %s\n' "$rc" "$log" >&2
        return "$rc"
    fi
    still="$(missing_packages "$@" | xargs)"
    if [ -n "$still" ]; then
        echo "apt-get installed $still, but their commands are still missing" >&2
        return 1
    fi
    echo "installed: ${missing[*]}"
}
