#!/usr/bin/env bash
# Print a JAVA_HOME holding Java 17 or newer (what Spark 4 needs); idempotent.
#   - looks at $JAVA_HOME, the `java` on PATH and /usr/lib/jvm/*; prefers 17 and 21 (Spark 4's tested releases)
#   - none and root: installs Debian's openjdk-17-jre-headless non-interactively, then looks again
#   - none and not root: explains and exits 1
#   - LOGBUF_NO_INSTALL=1 (the test suite sets it): never installs; exits 1 when none is found
# Usage: export JAVA_HOME="$(scripts/ensure-java.sh)"
set -euo pipefail
MIN_MAJOR=17

major_of() {  # major version of a java executable: "17.0.15" -> 17, "1.8.0" -> 8; empty if it does not run
    local line
    line=$("$1" -version 2>&1 | grep -m1 -o 'version "[0-9][0-9.]*' || true)
    line=${line#version \"}
    [ -n "$line" ] || return 0
    local first=${line%%.*} rest=${line#*.}
    if [ "$first" = "1" ]; then echo "${rest%%.*}"; else echo "$first"; fi
}

find_home() {
    local candidates=() home java best="" best_rank=99 major rank
    [ -n "${JAVA_HOME:-}" ] && candidates+=("$JAVA_HOME")
    if java=$(command -v java 2>/dev/null); then
        candidates+=("$(dirname "$(dirname "$(readlink -f "$java")")")")
    fi
    for home in /usr/lib/jvm/*; do [ -d "$home" ] && candidates+=("$home"); done
    for home in "${candidates[@]}"; do
        [ -x "$home/bin/java" ] || continue
        major=$(major_of "$home/bin/java")
        [ -n "$major" ] && [ "$major" -ge "$MIN_MAJOR" ] || continue
        if [ -n "${JAVA_HOME:-}" ] && [ "$home" = "$JAVA_HOME" ]; then echo "$home"; return 0; fi
        case "$major" in 17) rank=0 ;; 21) rank=1 ;; *) rank=$((2 + major)) ;; esac
        if [ "$rank" -lt "$best_rank" ]; then best=$home; best_rank=$rank; fi
    done
    [ -n "$best" ] && readlink -f "$best"
}

if home=$(find_home) && [ -n "$home" ]; then
    echo "$home"
    exit 0
fi
if [ "${LOGBUF_NO_INSTALL:-0}" = "1" ]; then
    echo "ensure-java: no Java $MIN_MAJOR+ found (LOGBUF_NO_INSTALL=1: not installing; ./run setup installs it)" >&2
    exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "ensure-java: no Java $MIN_MAJOR+ found and installing one needs root (apt-get install openjdk-17-jre-headless)" >&2
    exit 1
fi
echo "ensure-java: installing openjdk-17-jre-headless (Debian)" >&2
export DEBIAN_FRONTEND=noninteractive
mkdir -p /usr/share/man/man1  # slim images lack it and the JRE's postinst fails without it
apt-get update -qq
apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >/dev/null
if home=$(find_home) && [ -n "$home" ]; then
    echo "$home"
    exit 0
fi
echo "ensure-java: install finished but no Java $MIN_MAJOR+ was found" >&2
exit 1
