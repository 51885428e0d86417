#!/usr/bin/env bash
# Build a Debian bookworm base image (python3, python3-venv, CA certificates) on a machine that
# can reach Debian's and Python's package registries but no container registry, for the
# CPU flavour of the gate image:
#
#   scripts/make_base_image.sh [TAG]        # default TAG: gate-base:bookworm
#   docker build --network host --build-arg BASE_IMAGE=gate-base:bookworm ...
#
# The rootfs comes from debootstrap and is loaded with `docker import`. Two things from this
# machine are copied in, because pip inside `docker build` must behave as it does here:
#   - the CA bundle: where outbound TLS is intercepted, pip otherwise fails certificate checks;
#   - pip's settings: the cert, the local --find-links folders (with their wheels) and the
#     constraints file, so the engine venvs resolve to the same packages as the venv runner's.
# Needs root (debootstrap) and a running dockerd. Reuses an existing TAG unless FORCE=1.
set -euo pipefail

tag="${1:-gate-base:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
python="${PYTHON:-python3}"

if [[ -z "${FORCE:-}" ]] && docker image inspect "$tag" >/dev/null 2>&1; then
    echo "base image $tag exists (FORCE=1 rebuilds it)" >&2
    exit 0
fi

rootfs="$(mktemp -d)"
trap 'rm -rf "$rootfs"' EXIT

echo "debootstrap bookworm from $mirror (a few minutes)..." >&2
start=$SECONDS
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" "$mirror" \
    >"$rootfs.debootstrap.log" 2>&1 || { tail -20 "$rootfs.debootstrap.log" >&2; exit 1; }
rm -f "$rootfs.debootstrap.log"

bundle="$("$python" -c 'import ssl; print(ssl.get_default_verify_paths().cafile or "")')"
bundle="${bundle:-/etc/ssl/certs/ca-certificates.crt}"
if [[ -f "$bundle" ]]; then
    cp "$bundle" "$rootfs/etc/ssl/certs/ca-certificates.crt"
fi

# pip's effective settings on this machine, as "key=value" lines (pip config list quotes values).
pip_conf="$rootfs/etc/pip.conf"
{
    echo "[global]"
    echo "cert = /etc/ssl/certs/ca-certificates.crt"
    echo "disable-pip-version-check = true"
} >"$pip_conf"
find_links=()
while IFS='=' read -r key value; do
    value="${value#\'}"
    value="${value%\'}"
    case "$key" in
        global.find-links|:env:.find-links)
            for dir in $value; do
                if [[ -d "$dir" && ! -d "$rootfs$dir" ]]; then
                    mkdir -p "$rootfs$dir"
                    cp -a "$dir/." "$rootfs$dir/"
                    find_links+=("$dir")
                fi
            done
            ;;
        global.constraint)
            if [[ -f "$value" ]]; then
                mkdir -p "$rootfs$(dirname "$value")"
                cp "$value" "$rootfs$value"
                echo "constraint = $value" >>"$pip_conf"
            fi
            ;;
    esac
done < <("$python" -m pip config list 2>/dev/null || true)
if ((${#find_links[@]})); then
    echo "find-links = ${find_links[*]}" >>"$pip_conf"
fi

chroot "$rootfs" apt-get clean
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*

echo "importing rootfs as $tag..." >&2
tar -C "$rootfs" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    - "$tag" >/dev/null
echo "base image $tag ready in $((SECONDS - start)) s ($(docker image inspect -f '{{.Size}}' "$tag") bytes)" >&2
